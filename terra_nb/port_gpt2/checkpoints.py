"""A seeded random TinyGPTWorld checkpoint on disk (`config.json` + `model.safetensors`): what
`vllm.LLM(model=path, skip_tokenizer_init=True)` and HF both load. No tokenizer: prompts are ids.

Shaped for vLLM's CPU backend: head_dim = 128 / 2 = 64 (its attention takes 32, 64, 128, ...,
not 16). Untied `lm_head` and wide initial weights, so greedy picks are far from ties.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import TinyGPTWorldConfig
from .hf_model import TinyGPTWorldForCausalLM

ARCHITECTURE = "TinyGPTWorldForCausalLM"

PRESETS: dict[str, dict] = {
    "tiny": dict(
        vocab_size=256,
        n_embd=128,
        n_layer=2,
        n_head=2,
        n_inner=256,
        n_positions=128,
        frame_len=16,
        max_frames=8,
        activation_function="gelu_new",
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    ),
}


def preset_config(name: str = "tiny") -> TinyGPTWorldConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown TinyGPTWorld preset {name!r}; choose from {sorted(PRESETS)}")
    return TinyGPTWorldConfig(**PRESETS[name], architectures=[ARCHITECTURE])


def write_random_checkpoint(path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a seeded random float32 checkpoint to `path` and return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = TinyGPTWorldForCausalLM(preset_config(preset)).to(torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    (path / "terra_nb_gpt2_checkpoint.json").write_text(json.dumps({"preset": preset, "seed": seed}) + "\n")
    return path
