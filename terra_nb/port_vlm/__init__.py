"""TinyVLM: a deliberately ordinary multimodal model, ported to vLLM V1 the standard way.

The sibling of `terra_nb.port`, file for file where the two meet (`config.py`, `hf_model.py`,
`checkpoints.py`, `vllm_processing.py`, `vllm_model.py`, `vllm_plugin.py`, `vllm_frontdoor.py`),
so the two ports can be read side by side (notebook 10). Where Terra is vLLM's degenerate case
(no tokenizer, slots already in the prompt, its own `apply`, a hand-written weight loader), TinyVLM
is the common one: a tokenizer, an HF processor, one `<image>` expanded to a variable number of
placeholders, vLLM's default `apply`, `WeightsMapper` + `AutoWeightsLoader`, the encoder cache.

Importing the package registers the HF config, model and processor with the Auto classes.
"""
from .config import IMAGE_TOKEN, ImageGeometry, TinyVLMConfig, check_image
from .hf_model import TinyVLMForConditionalGeneration, greedy_generate, register as _register_hf
from .hf_processing import TinyVLMProcessor, build_tokenizer

_register_hf()

__all__ = [
    "IMAGE_TOKEN",
    "ImageGeometry",
    "TinyVLMConfig",
    "TinyVLMForConditionalGeneration",
    "TinyVLMProcessor",
    "build_tokenizer",
    "check_image",
    "greedy_generate",
]
