"""TinyVLM's HF config (`model_type` "tiny_vlm") and the image geometry it implies.

The layout of vLLM's own vision-language models (LLaVA): a `text_config` (a plain `LlamaConfig`,
which vLLM reads for the KV cache, the attention heads and RoPE) next to the vision fields. An image
is cut into `patch_size` x `patch_size` patches; each patch becomes one embedding, so an image of
H x W pixels takes (H / patch) * (W / patch) placeholder tokens in the prompt: images of different
sizes take different numbers of tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import LlamaConfig, PretrainedConfig

IMAGE_TOKEN = "<image>"


class TinyVLMConfig(PretrainedConfig):
    model_type = "tiny_vlm"
    sub_configs = {"text_config": LlamaConfig}

    def __init__(
        self,
        text_config: dict | LlamaConfig | None = None,
        patch_size: int = 8,
        max_image_side: int = 32,
        vision_hidden_size: int = 64,
        image_token_id: int = 4,
        **kwargs,
    ):
        if text_config is None or isinstance(text_config, dict):
            text_config = LlamaConfig(**(text_config or {}))
        self.text_config = text_config
        self.patch_size = patch_size
        self.max_image_side = max_image_side
        self.vision_hidden_size = vision_hidden_size
        self.image_token_id = image_token_id
        super().__init__(**kwargs)
        if max_image_side % patch_size:
            raise ValueError(f"max_image_side ({max_image_side}) must be a multiple of patch_size ({patch_size})")


@dataclass(frozen=True)
class ImageGeometry:
    """Which size the processor brings an image to, and how many prompt tokens it then takes.

    An image of any size is resized the way vision-language processors do (Qwen2-VL's
    `smart_resize`, LLaVA's "resize to fit"): scaled down to fit `max_side` x `max_side` keeping its
    aspect ratio (never enlarged), then each side rounded to the nearest multiple of the patch size,
    at least one patch. An image already of an allowed size keeps it.
    """

    patch_size: int
    max_side: int

    @classmethod
    def from_config(cls, config: TinyVLMConfig) -> "ImageGeometry":
        return cls(config.patch_size, config.max_image_side)

    @property
    def max_grid(self) -> int:
        return self.max_side // self.patch_size

    @property
    def max_tokens(self) -> int:
        return self.max_grid**2

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) the processor resizes an image of `height` x `width` pixels to."""
        scale = min(1.0, self.max_side / max(height, width))
        p = self.patch_size
        side = lambda n: min(self.max_side, max(p, p * int(n * scale / p + 0.5)))  # noqa: E731 (halves up)
        return side(height), side(width)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """Rows and columns of patches of an image of `height` x `width` pixels, once resized."""
        h, w = self.resized(height, width)
        return h // self.patch_size, w // self.patch_size

    def num_tokens(self, height: int, width: int) -> int:
        rows, cols = self.grid(height, width)
        return rows * cols


def as_image_tensor(image: object, where: str) -> torch.Tensor:
    """A PIL image (any mode: converted to RGB, bytes scaled to [0, 1]), or a float tensor / numpy
    array `[3, H, W]` (channels first, values in [0, 1]) -> float32 `[3, H, W]`; else a `ValueError`
    naming what is wrong."""
    if hasattr(image, "convert") and hasattr(image, "size"):  # PIL, without importing it
        image = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    elif isinstance(image, np.ndarray):
        image = torch.from_numpy(image)
    if not isinstance(image, torch.Tensor):
        raise ValueError(f"{where}: expected a PIL image or a float tensor [3, H, W], got {type(image).__name__}")
    if not image.is_floating_point():
        raise ValueError(
            f"{where}: dtype {image.dtype}; pass float pixels in [0, 1] (or a PIL image), "
            "not integer bytes"
        )
    if image.ndim != 3 or image.shape[0] != 3 or min(image.shape[1:]) < 1:
        raise ValueError(f"{where}: shape {list(image.shape)}; expected [3, H, W] (channels first, RGB)")
    if not torch.isfinite(image).all():
        raise ValueError(f"{where}: holds NaN or inf pixels")
    return image.to(torch.float32)


def resize_image(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """float `[3, H, W]` -> `[3, height, width]`: bilinear with antialiasing (as PIL's resize);
    the image itself when it already has that size."""
    if tuple(image.shape[1:]) == (height, width):
        return image
    out = torch.nn.functional.interpolate(image[None], size=(height, width), mode="bilinear",
                                          align_corners=False, antialias=True)
    return out[0].clamp(0.0, 1.0)


def check_image(image: object, geometry: ImageGeometry, index: int = 0) -> torch.Tensor:
    """One image -> float32 `[3, H, W]` in [0, 1], resized by `geometry`, or a `ValueError` naming
    what is wrong (type, dtype, shape, NaN/inf). Takes a PIL image or a float tensor / numpy array
    `[3, H, W]` of any size."""
    image = as_image_tensor(image, f"image {index}")
    return resize_image(image, *geometry.resized(int(image.shape[1]), int(image.shape[2])))
