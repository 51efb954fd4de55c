"""A seeded random TinyVLM checkpoint on disk: what `vllm.LLM(model=path)` and HF both load.

The folder holds `config.json`, `model.safetensors`, the tokenizer (`tokenizer.json`,
`tokenizer_config.json`, with the chat template under "chat_template", where released models keep
it) and `processor_config.json`: built here, nothing downloaded.

The decoder is shaped for vLLM's CPU backend: head_dim 64 (its attention takes 32, 64, 128, ...
but not, say, 16), and RoPE given as `rope_parameters` (a config with only `rope_theta` makes
vLLM's `get_rope` use base 10000 whatever the theta says), with a theta that is not 10000, so
parity would catch a fall-back.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import TinyVLMConfig
from .hf_model import TinyVLMForConditionalGeneration
from .hf_processing import TinyVLMProcessor, build_tokenizer

MARKER = "terra_nb_vlm_checkpoint.json"

PRESETS: dict[str, dict] = {
    "tiny": dict(
        text_config=dict(
            vocab_size=256,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            tie_word_embeddings=False,
            initializer_range=0.3,  # wide logits: greedy picks are far from ties, outputs vary
            architectures=["LlamaForCausalLM"],
        ),
        patch_size=8,
        max_image_side=32,
        vision_hidden_size=64,
        image_token_id=4,
        initializer_range=0.3,
    ),
}


def save_tokenizer(tokenizer, path: Path) -> None:
    """The tokenizer with its chat template inside `tokenizer_config.json` (transformers 5 would
    write it to a separate `chat_template.jinja`; either is read, the former by every release)."""
    tokenizer.save_pretrained(path, save_jinja_files=False)
    (path / "chat_template.jinja").unlink(missing_ok=True)


def preset_config(name: str = "tiny") -> TinyVLMConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown TinyVLM preset {name!r}; choose from {sorted(PRESETS)}")
    return TinyVLMConfig(**json.loads(json.dumps(PRESETS[name])), architectures=["TinyVLMForConditionalGeneration"])


def write_random_checkpoint(path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a seeded random checkpoint (float32) to `path`; idempotent for the same preset and seed."""
    path = Path(path)
    marker = {"preset": preset, "seed": seed, "format": 2}
    mpath = path / MARKER
    if mpath.exists() and (path / "model.safetensors").exists():
        if json.loads(mpath.read_text()) == marker:
            return path
    path.mkdir(parents=True, exist_ok=True)
    config = preset_config(preset)
    torch.manual_seed(seed)
    model = TinyVLMForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    processor = TinyVLMProcessor(build_tokenizer(config.text_config.vocab_size),
                                 patch_size=config.patch_size, max_image_side=config.max_image_side)
    processor.save_pretrained(path)
    save_tokenizer(processor.tokenizer, path)
    mpath.write_text(json.dumps(marker) + "\n")
    return path
