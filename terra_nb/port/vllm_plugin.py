"""vLLM plugin: makes `vllm.LLM(model=<Terra checkpoint dir>, skip_tokenizer_init=True)` just work.

pyproject.toml declares it as a general plugin:

    [project.entry-points."vllm.general_plugins"]
    terra_nb = "terra_nb.port.vllm_plugin:register"

vLLM calls every general plugin in **every process it starts** (the front end while it parses the
engine arguments, the engine core, each worker), so registering here, rather than in the notebook
process, is what makes the model and its config known where the engine actually runs. `register`
is idempotent and cheap: it registers

* the HF config class for `model_type` "llama_action" and the HF models with `AutoConfig` /
  `AutoModel*` (`hf_model.register`), so vLLM reads a released `config.json` (which names remote
  code in `auto_map`) without `trust_remote_code`;
* the two released architectures with vLLM's `ModelRegistry`, lazily ("module:Class"), so vLLM
  imports the `vllm_model` module only when it builds or inspects the model;
* the front door (`vllm_frontdoor.install`): every request to a Terra engine is checked before it
  reaches the engine core, including requests without `multi_modal_data`, which never meet the
  multimodal processor.
* one engine-core utility, `terra_kv_blocks` (`install_engine_utilities`): the free and total
  KV-cache blocks, which a server reads from the front end (`terra_nb.serve.engine.kv_blocks`).
* the scheduler's fast path for decoding Terra requests (`vllm_scheduling.install`): no search of
  their action items at every step.

vLLM does not catch what a general plugin raises, and an exception here would stop every engine
of the environment, whatever its model. Nothing here raises for a vLLM that renamed a private
method the door wraps: `vllm_patch.wrap` logs it and skips it, and Terra refuses, clearly, what
it then cannot check (`vllm_frontdoor`'s docstring says what).

Everything is found relative to this module (`__package__`), so the `port` folder works under any
package name: copy it into a project as `myproj/terra_port/` and point the entry point at
`myproj.terra_port.vllm_plugin:register` (or call `register()` before building the engine; the
engine's own processes need the entry point, or `VLLM_PLUGINS` naming it).
"""
from __future__ import annotations

import sys

ARCHITECTURES = ("LlamaActionForCausalLM", "LlamaActionV2ForCausalLM")


def register() -> None:
    from vllm import ModelRegistry

    from .hf_model import register as register_hf
    from .vllm_frontdoor import install
    from .vllm_release import pin_streaming_sessions
    from .vllm_scheduling import install as install_scheduling

    register_hf()
    install()
    install_scheduling()
    install_engine_utilities()  # the KV-block count a server reads (terra_nb.serve)
    pin_streaming_sessions()  # a session's chunks stay on one rank of a data-parallel engine (vLLM 0.26)
    supported = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES:
        if arch not in supported:
            ModelRegistry.register_model(arch, f"{__package__}.vllm_model:{arch}")


KV_BLOCKS_UTILITY = "terra_kv_blocks"
"""The `EngineCore` utility method `install_engine_utilities` adds (the client calls it by name)."""


def _terra_kv_blocks(self) -> list[int]:
    """[free, total] KV-cache blocks of this engine core (a freed block that prefix caching keeps
    counts as free: the next request may evict it)."""
    pool = self.scheduler.kv_cache_manager.block_pool
    return [int(pool.get_num_free_blocks()), int(pool.num_gpu_blocks)]


def install_engine_utilities() -> None:
    """Give vLLM's `EngineCore` the `terra_kv_blocks` utility, where the engine core's module is
    loaded (it is, in the engine core's process, before `EngineCore.__init__` loads the plugins).
    Imports nothing of vLLM's (a plugin runs early), never raises; idempotent."""
    core = sys.modules.get("vllm.v1.engine.core")
    engine_core = getattr(core, "EngineCore", None)
    if engine_core is not None and not hasattr(engine_core, KV_BLOCKS_UTILITY):
        setattr(engine_core, KV_BLOCKS_UTILITY, _terra_kv_blocks)
