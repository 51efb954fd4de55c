"""TinyAV: a model with two modalities in one prompt (a fixed-size image and a variable-length audio
clip) and an HF processor that needs the text, ported to vLLM V1; the sibling of TinyVLM
(`port_vlm`), file for file where the two meet. Notebook 13 walks through it; PORTING.md
("Two modalities, and a processor that needs the text") is the checklist.

Importing the package registers the HF config, model and processor with the Auto classes.
"""
from .config import AUDIO_TOKEN, IMAGE_TOKEN, ItemSizes, TinyAVConfig, check_audio, check_image
from .hf_model import TinyAVForConditionalGeneration, greedy_generate, register as _register_hf
from .hf_processing import TinyAVProcessor, build_tokenizer

_register_hf()

__all__ = ["AUDIO_TOKEN", "IMAGE_TOKEN", "ItemSizes", "TinyAVConfig", "TinyAVForConditionalGeneration",
           "TinyAVProcessor", "build_tokenizer", "check_audio", "check_image", "greedy_generate"]
