"""terra-nb: Terra (an action-conditioned driving world model) from HF Transformers to vLLM V1.

Importing the package registers the HF config and models with the Auto* classes, so a
checkpoint folder with the released `config.json` loads without `trust_remote_code`.

Three subpackages, so the port can be found (and copied) as one folder:

* `terra_nb.port`: the product: config, layout, HF model, checkpoints, the vLLM V1 port (actions
  modality, model, plugin, front door, release shim), rollouts, the ONNX export;
* `terra_nb.lessons`: teaching helpers the notebooks use to show the port at work;
* `terra_nb.workbook`: rendering, results, the papermill runner, the benchmark and its profiler;

plus `terra_nb.toyworld`, the toy driving world of notebook 08.
"""
from .port.config import LlamaActionConfig
from .port.layout import FrameLayout
from .port.hf_model import (
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
