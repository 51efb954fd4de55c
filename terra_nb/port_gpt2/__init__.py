"""TinyGPTWorld: a world model on a GPT-2 backbone, ported to vLLM V1 on vLLM's own `GPT2Model`.

The smallest port of a non-Llama backbone: token ids in frames of `frame_len` tokens, GPT-2 with a
learned frame embedding added to the token embeddings. Two things differ from a Llama port:

* `config.py`: vLLM's `GPT2Model` reads GPT-2's own config field names, so the config subclasses
  `GPT2Config`; `backbone_check.missing_config_fields` finds what a config lacks from a unit test.
* `vllm_model.py`: `AutoWeightsLoader` hands GPT-2's weights to `GPT2Model.load_weights`, which
  transposes HF's `Conv1D` weights itself; the port only renames.

Files as in the other ports: `config.py`, `hf_model.py`, `checkpoints.py`, `vllm_model.py`,
`vllm_plugin.py`, `vllm_engine.py`. Importing the package registers the HF config and model with
the Auto classes.
"""
from .config import TinyGPTWorldConfig
from .hf_model import TinyGPTWorldForCausalLM, greedy_generate, register as _register_hf

_register_hf()

__all__ = ["TinyGPTWorldConfig", "TinyGPTWorldForCausalLM", "greedy_generate"]
