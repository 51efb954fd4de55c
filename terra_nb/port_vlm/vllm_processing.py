"""TinyVLM's `image` modality for vLLM V1: processing info, data parser, dummy inputs, processor.

The standard recipe of vLLM's own vision-language models (`llava.py`, `qwen2_vl.py`), on vLLM's
default `BaseMultiModalProcessor.apply`:

1. vLLM tokenizes the text prompt itself (one `<image>` token per image, as the user wrote it);
2. the data parser takes what vLLM's users send (one image or a list; PIL images, as the chat API
   decodes an `image_url`; float arrays and tensors) and checks each (`as_image_tensor`: a
   `ValueError` naming the image and what is wrong, before anything is computed);
3. vLLM calls the HF processor (`TinyVLMProcessor`) on the images, which resizes each to fit the
   encoder: `pixel_values` (all images'
   patches, concatenated) and `image_grid_hw` (rows, columns of patches per image);
4. `_get_mm_fields_config` tells vLLM how to cut those tensors into one item per image:
   `pixel_values` by the sizes `rows * cols` (`flat_from_sizes`), `image_grid_hw` by row
   (`batched`), so each image is hashed, cached and scheduled on its own;
5. `_get_prompt_updates` expands each `<image>` into `rows * cols` `<image>` tokens (vLLM applies
   it on token ids), and vLLM records where each image's placeholders sit.

vLLM 0.26 instead hands the HF processor the prompt text as well and finds the tokens the HF
processor expanded; the same three methods serve both releases.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import torch
from transformers import BatchFeature
from vllm.inputs import MultiModalDataDict
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import ImageProcessorItems, ImageSize, MultiModalDataItems, MultiModalDataParser
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
    PromptUpdate,
)

from vllm.config.multimodal import BaseDummyOptions

from .config import IMAGE_TOKEN, ImageGeometry, TinyVLMConfig, as_image_tensor
from .hf_processing import TinyVLMProcessor
from .vllm_frontdoor import require_door
from .vllm_patch import RequestValidationError

MODALITY = "image"


class TinyVLMImageItems(ImageProcessorItems):
    """The checked images as the user sent them: PIL, or float `[3, H, W]` (the HF processor converts
    and resizes them).

    vLLM's own `get_image_size` reads a 3-D array whose last side is 1, 3 or 4 as channels-last;
    these are always channels-first, so the size is read from the last two sides."""

    def get_image_size(self, item_idx: int) -> ImageSize:
        image = self.get(item_idx)
        if not isinstance(image, (torch.Tensor, np.ndarray)):  # PIL (or a cached item: vLLM says so)
            return super().get_image_size(item_idx)
        return ImageSize(width=int(image.shape[-1]), height=int(image.shape[-2]))


class TinyVLMDataParser(MultiModalDataParser):
    """vLLM's parser (one image or a list; PIL images, including those the chat API decodes from an
    `image_url`; numpy arrays and tensors), with every image checked and embeddings refused."""

    def __init__(self, geometry: ImageGeometry, **kwargs) -> None:
        super().__init__(**kwargs)
        self.geometry = geometry

    def _parse_image_data(self, data):
        if data is None:
            return None
        if isinstance(data, torch.Tensor) and data.ndim == 3 and data.shape[0] == 3:
            data = [data]  # one image [3, H, W] (vLLM would read a 3-D tensor as a batch of embeddings)
        if self.is_embeddings(data):  # vLLM reads 2-D tensors as precomputed embeddings
            shapes = [list(t.shape) for t in data] if isinstance(data, (list, tuple)) else [list(data.shape)]
            raise RequestValidationError(
                f"image data of shape {shapes[0]}: 2-D tensors read as precomputed image embeddings, "
                "which TinyVLM does not take; pass images as float tensors [3, H, W] or PIL images",
                parameter="multi_modal_data",
            )
        items = super()._parse_image_data(data)  # one item or a list; MediaWithBytes unwrapped by `get`
        try:
            for i in range(items.get_count()):
                if items.get(i) is not None:  # None: an image vLLM's cache holds (only its uuid was sent)
                    as_image_tensor(items.get(i), f"image {i}")
        except ValueError as e:  # as vLLM's validation error: HTTP 400 from its server
            raise RequestValidationError(str(e), parameter="multi_modal_data") from None
        return TinyVLMImageItems(items.data)  # as sent: vLLM hashes them, the HF processor converts them


class TinyVLMProcessingInfo(BaseProcessingInfo):
    def get_hf_config(self) -> TinyVLMConfig:
        return self.ctx.get_hf_config(TinyVLMConfig)

    def get_hf_processor(self, **kwargs: object) -> TinyVLMProcessor:
        return self.ctx.get_hf_processor(TinyVLMProcessor, **kwargs)

    @cached_property
    def geometry(self) -> ImageGeometry:
        return ImageGeometry.from_config(self.get_hf_config())

    def get_data_parser(self) -> MultiModalDataParser:
        return TinyVLMDataParser(self.geometry)

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {MODALITY: None}  # any number of images (the user's limit_mm_per_prompt applies)

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        return {MODALITY: self.geometry.max_tokens}  # the largest image: max_side x max_side

    def get_num_image_tokens(self, *, image_width: int, image_height: int) -> int:
        return self.geometry.num_tokens(image_height, image_width)


class TinyVLMDummyInputsBuilder(BaseDummyInputsBuilder[TinyVLMProcessingInfo]):
    """Profiling inputs: text with one `<image>` per image, and images of the largest size."""

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return IMAGE_TOKEN * mm_counts.get(MODALITY, 0)  # vLLM tokenizes this with our tokenizer

    def get_dummy_mm_data(
        self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Mapping[str, BaseDummyOptions] | None = None
    ) -> MultiModalDataDict:
        side = self.info.geometry.max_side
        return {
            MODALITY: self._get_dummy_images(
                width=side, height=side, num_images=mm_counts.get(MODALITY, 0),
                overrides=(mm_options or {}).get(MODALITY),
            )
        }


class TinyVLMMultiModalProcessor(BaseMultiModalProcessor[TinyVLMProcessingInfo]):
    """vLLM's default `apply`; the model-specific part is the three methods below."""

    def __init__(self, *args, **kwargs) -> None:
        # vLLM builds the processor while an engine starts (in the front end, before the engine
        # core): no TinyVLM engine where the front door's check could not be installed.
        require_door()
        super().__init__(*args, **kwargs)

    def _get_mm_fields_config(
        self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object]
    ) -> Mapping[str, MultiModalFieldConfig]:
        grid = hf_inputs.get("image_grid_hw", torch.empty(0, 2, dtype=torch.long))
        return {
            # all images' patches in one tensor: image k owns the next rows_k * cols_k rows
            "pixel_values": MultiModalFieldConfig.flat_from_sizes(MODALITY, grid.prod(-1)),
            # one (rows, cols) per image
            "image_grid_hw": MultiModalFieldConfig.batched(MODALITY),
        }

    def _get_prompt_updates(
        self,
        mm_items: MultiModalDataItems,
        hf_processor_mm_kwargs: Mapping[str, object],
        out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        image_token_id = self.info.get_hf_config().image_token_id

        def expand(item_idx: int) -> list[int]:
            # looked up lazily, per item: with vLLM's processor cache, `mm_items` holds only the
            # images not cached yet (none at all when every image was seen before)
            size = mm_items.get_items(MODALITY, ImageProcessorItems).get_image_size(item_idx)
            return [image_token_id] * self.info.get_num_image_tokens(image_width=size.width, image_height=size.height)

        # the k-th `<image>` token of the prompt becomes image k's run of placeholders
        return [PromptReplacement(modality=MODALITY, target=[image_token_id], replacement=expand)]

    def apply(self, inputs, timing_ctx):
        """vLLM's default `apply`, after one check it does not make in the user's terms: one
        `<image>` per image. (vLLM itself fails with an `AssertionError` on too few `<image>`
        tokens, and leaves extra ones in the prompt as words.) Runs in the front end."""
        n_images = inputs.mm_data_items.get_count(MODALITY, strict=False)
        check_image_token_count(inputs.prompt, n_images, self.info.get_hf_config().image_token_id)
        return super().apply(inputs, timing_ctx)


def check_image_token_count(prompt: str | Sequence[int], n_images: int, image_token_id: int) -> None:
    """The prompt (text on vLLM 0.26, token ids on 0.32) must hold one `<image>` per image."""
    n_tokens = prompt.count(IMAGE_TOKEN) if isinstance(prompt, str) else sum(t == image_token_id for t in prompt)
    if n_tokens != n_images:
        raise RequestValidationError(
            f"the prompt has {n_tokens} {IMAGE_TOKEN} token(s) but {n_images} image(s) were given; "
            f"put one {IMAGE_TOKEN} in the text where each image goes",
            parameter="multi_modal_data",
        )


# The engine's `limit_mm_per_prompt` (`vllm_engine.llm_kwargs` reads it): how many items of each
# modality one prompt may carry. `get_supported_mm_limits` above says what the model can take (any
# number of images); this bounds a request and sizes the start-up profiling. A model with other
# modalities names them here, and the engine helper needs no edit.
LIMIT_MM_PER_PROMPT = {MODALITY: 2}

__all__ = [
    "LIMIT_MM_PER_PROMPT",
    "MODALITY",
    "TinyVLMDataParser",
    "TinyVLMDummyInputsBuilder",
    "TinyVLMImageItems",
    "TinyVLMMultiModalProcessor",
    "TinyVLMProcessingInfo",
    "check_image_token_count",
]
