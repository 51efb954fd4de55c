"""TinyAV's HF config (`model_type` "tiny_av"), the token count of each item, and the value checks.

Two modalities in one prompt, the LLaVA layout again (a `text_config` next to the encoders' fields):

* **image**: a PIL image or float `[3, H, W]` of any size, resized to `image_size` x `image_size`
  RGB and cut into `patch_size` patches: always `(image_size / patch_size) ** 2` placeholder tokens
  (4 for the tiny preset);
* **audio**: a mono clip of any length at `sampling_rate` (16 kHz), cut into frames of `frame_size` samples (the last one padded
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
        sampling_rate: int = 16000,
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
        self.sampling_rate = sampling_rate
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
    sampling_rate: int = 16000

    @classmethod
    def from_config(cls, config: TinyAVConfig) -> "ItemSizes":
        return cls(config.image_size, config.patch_size, config.frame_size, config.sampling_rate)

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


def _is_pil(x: object) -> bool:
    return hasattr(x, "convert") and hasattr(x, "size")  # PIL (or vLLM's wrapper of one), without importing it


def image_list(data: object) -> list:
    """What a user sends for `images` -> a list of images: one PIL image or array `[3, H, W]` is one
    image (not iterated into its channels); a 4-D array is a batch; a list or tuple is a list."""
    if _is_pil(data) or (isinstance(data, (np.ndarray, torch.Tensor)) and data.ndim == 3):
        return [data]
    if isinstance(data, (np.ndarray, torch.Tensor)) and data.ndim == 4:
        return list(data)
    return list(data) if isinstance(data, (list, tuple)) else [data]


def audio_list(data: object) -> list:
    """What a user sends for `audio` -> a list of clips: one `(samples, sampling_rate)` tuple, 1-D
    array or list of floats is one clip (not iterated into its samples); a 2-D array is a batch of
    clips (vLLM's reading); a list or tuple of clips is a list."""
    if _is_clip_with_rate(data) or (isinstance(data, (np.ndarray, torch.Tensor)) and data.ndim == 1):
        return [data]
    if isinstance(data, list) and data and isinstance(data[0], (float, int)):
        return [data]
    if isinstance(data, (np.ndarray, torch.Tensor)) and data.ndim == 2:
        return list(data)
    return list(data) if isinstance(data, (list, tuple)) else [data]


def _is_clip_with_rate(x: object) -> bool:
    """`(samples, sampling_rate)`: a pair whose second item is a number and first is not."""
    return (isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], (int, float))
            and not isinstance(x[0], (int, float)))


def as_image_tensor(image: object, index: int = 0) -> torch.Tensor:
    """A PIL image (any mode: RGB, bytes scaled to [0, 1]) or a float tensor / numpy array `[3, H, W]`
    of any size -> float32 `[3, H, W]`, or a `ValueError` naming what is wrong (type, dtype, shape, NaN/inf)."""
    where = f"image {index}"
    if _is_pil(image):
        image = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    image = _as_tensor(image, where, "a PIL image or a float tensor [3, H, W]")
    if image.ndim != 3 or image.shape[0] != 3 or min(image.shape[1:]) < 1:
        raise ValueError(f"{where}: shape {list(image.shape)}; expected [3, H, W] (channels first, RGB)")
    if not torch.isfinite(image).all():
        raise ValueError(f"{where}: holds NaN or inf values")
    return image.to(torch.float32)


def check_image(image: object, sizes: ItemSizes, index: int = 0) -> torch.Tensor:
    """One image of any size -> float32 `[3, S, S]` (resized as CLIP-style processors resize to their
    fixed input: bilinear, antialiased; an image of that size is kept as it is), or a `ValueError`."""
    image = as_image_tensor(image, index)
    s = sizes.image_size
    if tuple(image.shape[1:]) == (s, s):
        return image
    out = torch.nn.functional.interpolate(image[None], size=(s, s), mode="bilinear", align_corners=False,
                                          antialias=True)
    return out[0].clamp(0.0, 1.0)


def check_audio(clip: object, sizes: ItemSizes, index: int = 0, max_tokens: int | None = None) -> torch.Tensor:
    """One clip -> float32 `[samples]`, or a `ValueError` naming what is wrong (shape, dtype, length,
    NaN/inf, sampling rate). A clip is a 1-D float array / tensor / list of floats, taken to be at
    `sizes.sampling_rate`, or a `(samples, sampling_rate)` tuple (the form vLLM documents and its
    chat API produces), whose rate must be the model's: a clip at another rate is refused, not
    resampled (resample it first, e.g. `librosa.resample(y, orig_sr=sr, target_sr=16000)`).
    `max_tokens`: the most placeholders the clip may take (`ItemSizes.max_audio_tokens`)."""
    where = f"audio clip {index}"
    if _is_clip_with_rate(clip):
        clip, rate = clip
        if int(rate) != sizes.sampling_rate:
            raise ValueError(f"{where}: sampled at {rate} Hz; TinyAV takes {sizes.sampling_rate} Hz audio "
                             f"(resample the clip to {sizes.sampling_rate} Hz first)")
    if isinstance(clip, list):
        clip = np.asarray(clip, dtype=np.float32)
    clip = _as_tensor(clip, where, "a 1-D float tensor of samples or a (samples, sampling_rate) tuple")
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
