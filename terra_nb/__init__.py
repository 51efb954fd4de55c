"""terra-nb: Terra (an action-conditioned driving world model) from HF Transformers to vLLM V1.

Importing the package registers the HF config and models with the Auto* classes, so a
checkpoint folder with the released `config.json` loads without `trust_remote_code`.
"""
from .config import FrameLayout, LlamaActionConfig
from .hf_model import (
    LearnableFactorizedSpatioTemporalPositionalEmbedding,
    LlamaActionForCausalLM,
    LlamaActionV2ForCausalLM,
    register as _register_hf,
)

_register_hf()

__all__ = [
    "FrameLayout",
    "LlamaActionConfig",
    "LearnableFactorizedSpatioTemporalPositionalEmbedding",
    "LlamaActionForCausalLM",
    "LlamaActionV2ForCausalLM",
]
