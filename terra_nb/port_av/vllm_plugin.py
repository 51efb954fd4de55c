"""vLLM plugin: makes `vllm.LLM(model=<TinyAV checkpoint dir>)` and `vllm serve <dir>` just work.

pyproject.toml declares it next to TinyVLM's and Terra's:

    [project.entry-points."vllm.general_plugins"]
    terra_nb_av = "terra_nb.port_av.vllm_plugin:register"

vLLM calls every general plugin in every process it starts (front end, engine core, workers), so
the model is known where the engine runs, with the default multiprocess engine and under
`vllm serve`. The entry point is read from the *installed* package metadata: after adding it to
pyproject, `pip install -e .` again. Without installing, call `register()` in the process and keep
the engine core in it (`VLLM_ENABLE_V1_MULTIPROCESSING=0`; PORTING.md, "Registering without
installing").

Everything is found relative to this module (`__package__`): the folder copies under any name.
"""
from __future__ import annotations

ARCHITECTURE = "TinyAVForConditionalGeneration"
ENTRY_POINT = "terra_nb_av"


def register() -> None:
    """Register the HF classes with the Auto classes and the architecture with vLLM, and set
    `LLM.chat`'s tokenization for TinyAV (`vllm_chat`: the template writes the `<s>`). Idempotent."""
    from vllm import ModelRegistry

    from .hf_model import register as register_hf
    from .vllm_chat import install as install_chat

    register_hf()
    install_chat()
    if ARCHITECTURE not in set(ModelRegistry.get_supported_archs()):
        ModelRegistry.register_model(ARCHITECTURE, f"{__package__}.vllm_model:{ARCHITECTURE}")


def entry_point_installed() -> bool:
    """Whether vLLM will find this plugin: the installed metadata lists an entry point for this
    module's `register` (whatever its name: a copy's may differ from `ENTRY_POINT`)."""
    from importlib.metadata import entry_points

    return any((ep.module, ep.attr) == (__name__, "register") for ep in entry_points(group="vllm.general_plugins"))
