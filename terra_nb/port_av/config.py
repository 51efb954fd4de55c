"""TinyAV's HF config (`model_type` "tiny_av"), the token count of each item, and the value checks.

Two modalities in one prompt, the LLaVA layout again (a `text_config` next to the encoders' fields):

* **image**: a fixed size, `image_size` x `image_size` RGB, cut into `patch_size` patches: always
  `(image_size / patch_size) ** 2` placeholder tokens (4 for the tiny preset);
* **audio**: a mono clip of any length, cut into frames of `frame_size` samples (the last one padded
  with zeros): `ceil(samples / frame_size)` placeholder tokens. The audio encoder's positions are
  sinusoidal, computed, not learned, so nothing in the model bounds a clip's length: the only limit
  is the sequence (`max_audio_tokens`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from transformers import LlamaConfig, PretrainedConfig

IMAGE_TOKEN = "<image>"
AUDIO_TOKEN = "<audio>"


class TinyAVConfig(PretrainedConfig):
    model_type = "tiny_av"
    sub_configs = {"text_config": LlamaConfig}

    def __init__(
        self,
        text_config: dict | LlamaConfig | None = None,
        image_size: int = 16,
        patch_size: int = 8,
        vision_hidden_size: int = 64,
        frame_size: int = 16,
        audio_hidden_size: int = 64,
        image_token_id: int = 4,
        audio_token_id: int = 5,
        **kwargs,
    ):
        if text_config is None or isinstance(text_config, dict):
            text_config = LlamaConfig(**(text_config or {}))
        self.text_config = text_config
        self.image_size = image_size
        self.patch_size = patch_size
        self.vision_hidden_size = vision_hidden_size
        self.frame_size = frame_size
        self.audio_hidden_size = audio_hidden_size
        self.image_token_id = image_token_id
        self.audio_token_id = audio_token_id
        super().__init__(**kwargs)
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be a multiple of patch_size ({patch_size})")


@dataclass(frozen=True)
class ItemSizes:
    """How many prompt tokens each item takes, and the most one audio clip may take."""

    image_size: int
    patch_size: int
    frame_size: int

    @classmethod
    def from_config(cls, config: TinyAVConfig) -> "ItemSizes":
        return cls(config.image_size, config.patch_size, config.frame_size)

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def audio_tokens(self, samples: int) -> int:
        return math.ceil(samples / self.frame_size)

    def max_audio_tokens(self, seq_len: int) -> int:
        """The longest clip a prompt of `seq_len` tokens can hold: the sequence less `<s>` and one
        token to generate (a prompt with more beside it is refused by vLLM's length check). The
        encoder itself takes any length."""
        return seq_len - 2


def _as_tensor(x: object, where: str, what: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{where}: expected {what}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{where}: dtype {x.dtype}; pass float values, not integers")
    return x


def check_image(image: object, sizes: ItemSizes, index: int = 0) -> torch.Tensor:
    """One image -> float32 `[3, S, S]`, or a `ValueError` naming what is wrong (shape, dtype, NaN/inf)."""
    where = f"image {index}"
    image = _as_tensor(image, where, f"a float tensor [3, {sizes.image_size}, {sizes.image_size}]")
    if tuple(image.shape) != (3, sizes.image_size, sizes.image_size):
        raise ValueError(f"{where}: shape {list(image.shape)}; expected [3, {sizes.image_size}, {sizes.image_size}]")
    if not torch.isfinite(image).all():
        raise ValueError(f"{where}: holds NaN or inf values")
    return image.to(torch.float32)


def check_audio(clip: object, sizes: ItemSizes, index: int = 0, max_tokens: int | None = None) -> torch.Tensor:
    """One clip -> float32 `[samples]`, or a `ValueError` naming what is wrong (shape, dtype, length,
    NaN/inf). `max_tokens`: the most placeholders the clip may take (`ItemSizes.max_audio_tokens`)."""
    where = f"audio clip {index}"
    clip = _as_tensor(clip, where, "a 1-D float tensor of samples")
    if clip.ndim != 1 or clip.numel() == 0:
        raise ValueError(f"{where}: shape {list(clip.shape)}; expected [samples] (mono, at least one sample)")
    if max_tokens is not None and sizes.audio_tokens(clip.numel()) > max_tokens:
        raise ValueError(
            f"{where}: {clip.numel()} samples take {sizes.audio_tokens(clip.numel())} tokens; at most "
            f"{max_tokens} fit this engine's sequence ({max_tokens * sizes.frame_size} samples)"
        )
    if not torch.isfinite(clip).all():
        raise ValueError(f"{where}: holds NaN or inf values")
    return clip.to(torch.float32)
