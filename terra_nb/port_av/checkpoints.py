"""A seeded random TinyAV checkpoint on disk: what `vllm.LLM(model=path)` and HF both load.

`config.json`, `model.safetensors`, the tokenizer (its chat template in `tokenizer_config.json`) and
`processor_config.json`, built here, nothing
downloaded. The decoder is TinyVLM's (head_dim 64 for vLLM's CPU attention, RoPE as
`rope_parameters` with a theta that is not 10000).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import TinyAVConfig
from .hf_model import TinyAVForConditionalGeneration
from .hf_processing import TinyAVProcessor, build_tokenizer

MARKER = "terra_nb_av_checkpoint.json"

PRESET = dict(
    text_config=dict(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
        initializer_range=0.3,  # wide logits: greedy picks far from ties
        architectures=["LlamaForCausalLM"],
    ),
    image_size=16, patch_size=8, vision_hidden_size=64, frame_size=16, audio_hidden_size=64,
    image_token_id=4, audio_token_id=5, initializer_range=0.3,
)


def preset_config() -> TinyAVConfig:
    return TinyAVConfig(**json.loads(json.dumps(PRESET)), architectures=["TinyAVForConditionalGeneration"])


def write_random_checkpoint(path, seed: int = 0) -> Path:
    """Write a seeded random checkpoint (float32) to `path`; idempotent for the same seed."""
    path = Path(path)
    marker = {"seed": seed, "format": 2}
    if (path / MARKER).exists() and (path / "model.safetensors").exists():
        if json.loads((path / MARKER).read_text()) == marker:
            return path
    path.mkdir(parents=True, exist_ok=True)
    config = preset_config()
    torch.manual_seed(seed)
    model = TinyAVForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():  # post_init leaves these at zero
        model.model.vision_tower.pos_embed.normal_(0.0, config.initializer_range)
    model.save_pretrained(path, safe_serialization=True)
    processor = TinyAVProcessor(build_tokenizer(config.text_config.vocab_size), image_size=config.image_size,
                                patch_size=config.patch_size, frame_size=config.frame_size,
                                sampling_rate=config.sampling_rate)
    processor.save_pretrained(path)
    # the chat template inside tokenizer_config.json, where released models keep it (transformers 5
    # would write a separate chat_template.jinja)
    processor.tokenizer.save_pretrained(path, save_jinja_files=False)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    (path / MARKER).write_text(json.dumps(marker) + "\n")
    return path
