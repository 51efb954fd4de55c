"""vLLM plugin: makes `vllm.LLM(model=<TinyVLM checkpoint dir>)` just work.

pyproject.toml declares it next to Terra's:

    [project.entry-points."vllm.general_plugins"]
    terra_nb_vlm = "terra_nb.port_vlm.vllm_plugin:register"

vLLM calls every general plugin in every process it starts (front end, engine core, workers), so
the model is known where the engine runs; registering in the notebook process alone is not enough
when the engine core is another process. `register` is idempotent and cheap:

* `import terra_nb.port_vlm` registers the HF config, model and processor with the Auto classes
  (vLLM reads `config.json` with `AutoConfig`, and loads the processor and tokenizer from the
  checkpoint folder);
* the architecture goes into vLLM's `ModelRegistry` lazily ("module:Class");
* the front door (`vllm_frontdoor.install`) checks `<image>` tokens against the images.

The entry point is read from the *installed* package metadata: after adding it to pyproject,
`pip install -e .` again.
"""
from __future__ import annotations

ARCHITECTURE = "TinyVLMForConditionalGeneration"
ENTRY_POINT = "terra_nb_vlm"


def register() -> None:
    import terra_nb.port_vlm  # noqa: F401  (HF Auto classes)
    from vllm import ModelRegistry

    from .vllm_frontdoor import install

    install()
    if ARCHITECTURE not in set(ModelRegistry.get_supported_archs()):
        ModelRegistry.register_model(ARCHITECTURE, f"terra_nb.port_vlm.vllm_model:{ARCHITECTURE}")


def entry_point_installed() -> bool:
    """Whether vLLM will find this plugin (the installed metadata lists the entry point)."""
    from importlib.metadata import entry_points

    return any(ep.name == ENTRY_POINT for ep in entry_points(group="vllm.general_plugins"))
