"""vLLM plugin: makes `vllm.LLM(model=<Terra checkpoint dir>, skip_tokenizer_init=True)` just work.

pyproject.toml declares it as a general plugin:

    [project.entry-points."vllm.general_plugins"]
    terra_nb = "terra_nb.port.vllm_plugin:register"

vLLM calls every general plugin in **every process it starts** (the front end while it parses the
engine arguments, the engine core, each worker), so registering here, rather than in the notebook
process, is what makes the model and its config known where the engine actually runs. `register`
must be idempotent and cheap: it registers

* the HF config class for `model_type` "llama_action" with `AutoConfig` (importing `terra_nb`
  does that), so vLLM reads a released `config.json` (which names remote code in `auto_map`)
  without `trust_remote_code`;
* the two released architectures with vLLM's `ModelRegistry`, lazily ("module:Class"), so vLLM
  imports `terra_nb.port.vllm_model` only when it builds or inspects the model;
* the front door (`vllm_frontdoor.install`): every request to a Terra engine is checked before it
  reaches the engine core, including requests without `multi_modal_data`, which never meet the
  multimodal processor. It has to be installed here because such requests reach vLLM without
  passing through anything of ours.

The package must be *installed* (`pip install -e .`) for vLLM to find the entry point; putting the
repository on `PYTHONPATH` is not enough.
"""
from __future__ import annotations

ARCHITECTURES = ("LlamaActionForCausalLM", "LlamaActionV2ForCausalLM")


def register() -> None:
    import terra_nb  # noqa: F401  (registers LlamaActionConfig with AutoConfig, and the HF models)
    from vllm import ModelRegistry

    from terra_nb.port.vllm_frontdoor import install

    install()

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES:
        if arch not in supported:
            ModelRegistry.register_model(arch, f"terra_nb.port.vllm_model:{arch}")
