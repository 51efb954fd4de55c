"""vLLM plugin: `register()` makes `vllm.LLM(model=<TinyAV checkpoint dir>)` work in this process.

TinyAV is not declared as an entry point: it is registered the other way PORTING.md gives
("Registering without installing"): call `register()` in the process and keep the engine core in
it (`VLLM_ENABLE_V1_MULTIPROCESSING=0`). To install it instead, declare
`<package>.vllm_plugin:register` under `[project.entry-points."vllm.general_plugins"]`.

Everything is found relative to this module (`__package__`): the folder copies under any name.
"""
from __future__ import annotations

ARCHITECTURE = "TinyAVForConditionalGeneration"


def register() -> None:
    """Register the HF classes with the Auto classes and the architecture with vLLM (idempotent)."""
    from vllm import ModelRegistry

    from .hf_model import register as register_hf

    register_hf()
    if ARCHITECTURE not in set(ModelRegistry.get_supported_archs()):
        ModelRegistry.register_model(ARCHITECTURE, f"{__package__}.vllm_model:{ARCHITECTURE}")
