"""vLLM plugin: makes `vllm.LLM(model=<TinyVLM checkpoint dir>)` just work.

pyproject.toml declares it next to Terra's:

    [project.entry-points."vllm.general_plugins"]
    terra_nb_vlm = "terra_nb.port_vlm.vllm_plugin:register"

vLLM calls every general plugin in every process it starts (front end, engine core, workers), so
the model is known where the engine runs; registering in the notebook process alone is not enough
when the engine core is another process. `register` is idempotent and cheap:

* the HF config, model and processor go to the Auto classes (`hf_model.register`: vLLM reads
  `config.json` with `AutoConfig`, and loads the processor and tokenizer from the checkpoint folder);
* the architecture goes into vLLM's `ModelRegistry` lazily ("module:Class");
* the front door (`vllm_frontdoor.install`) checks `<image>` tokens against the images. It never
  raises: vLLM does not catch what a general plugin raises, and one exception here would stop every
  engine of the environment (`vllm_frontdoor` says what happens on a vLLM without the method);
* `LLM.chat` tokenizes the rendered chat without special tokens on every release
  (`vllm_chat.install`: the template writes the `<s>`; vLLM 0.26 would add a second).

Everything is found relative to this module (`__package__`), and nothing outside the folder is
imported, so the folder works under any package name: copy it into a project as `myproj/tiny_vlm/`
and point the entry point at `myproj.tiny_vlm.vllm_plugin:register`. The entry point is read from
the *installed* package metadata: after adding it to pyproject, `pip install -e .` again.
"""
from __future__ import annotations

ARCHITECTURE = "TinyVLMForConditionalGeneration"
ENTRY_POINT = "terra_nb_vlm"


def register() -> None:
    from vllm import ModelRegistry

    from .hf_model import register as register_hf
    from .vllm_chat import install as install_chat
    from .vllm_frontdoor import install

    register_hf()
    install()
    install_chat()
    if ARCHITECTURE not in set(ModelRegistry.get_supported_archs()):
        ModelRegistry.register_model(ARCHITECTURE, f"{__package__}.vllm_model:{ARCHITECTURE}")


def entry_point_installed() -> bool:
    """Whether vLLM will find this plugin: the installed metadata lists an entry point for this
    module's `register` (whatever its name: a copy's may differ from `ENTRY_POINT`)."""
    from importlib.metadata import entry_points

    return any((ep.module, ep.attr) == (__name__, "register") for ep in entry_points(group="vllm.general_plugins"))
