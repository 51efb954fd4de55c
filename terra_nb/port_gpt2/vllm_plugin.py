"""Registers TinyGPTWorld with HF's Auto classes and vLLM's `ModelRegistry` (idempotent).

Call `register()` before building an engine in this process (with
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so the engine core runs here too), or point a
`vllm.general_plugins` entry point at it so every process vLLM starts registers it. Everything is
found relative to this module, so the folder copies into a project under any package name.
"""
from __future__ import annotations

ARCHITECTURE = "TinyGPTWorldForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    from .hf_model import register as register_hf

    register_hf()
    if ARCHITECTURE not in set(ModelRegistry.get_supported_archs()):
        ModelRegistry.register_model(ARCHITECTURE, f"{__package__}.vllm_model:{ARCHITECTURE}")
