"""terra-nb: Terra (an action-conditioned driving world model) from HF Transformers to vLLM V1.

Importing the package registers the HF config and models with the Auto* classes, so a
checkpoint folder with the released `config.json` loads without `trust_remote_code`.

The subpackages, by what they are for:

* the ports, each a folder a user copies into their own project (it imports nothing else of
  `terra_nb`):
  * `terra_nb.port`: Terra itself: config and token layout, the HF model (v1 and v2), rollouts on
    HF and on vLLM, the vLLM V1 port (the `actions` modality, the model, the plugin, the front
    door, the release shim), sessions;
  * `terra_nb.port_vlm`: TinyVLM, an ordinary image-text model ported the standard way (notebook 10);
  * `terra_nb.port_av`: TinyAV, two modalities in one prompt (notebook 13);
  * `terra_nb.port_gpt2`: TinyGPTWorld, a world model on a GPT-2 backbone (PORTING.md, "Beyond Llama");
* `terra_nb.onnx`: Terra exported to one ONNX graph and rolled out on onnxruntime (notebook 09);
* `terra_nb.serve`: a world-model server on vLLM's `AsyncLLM` that clients drive frame by frame;
* `terra_nb.lessons`: teaching helpers the notebooks use to show the ports at work;
* `terra_nb.workbook`: the notebooks' tooling: rendering, results, `make reproduce`, the GPU
  settings the workbook gives its engines;
* `terra_nb.bench`: the benchmark (HF, the port and stock vLLM Llama, measured like for like);
* `terra_nb.toyworld`: the toy driving world and its trained model (notebook 08).
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
