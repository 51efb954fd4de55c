"""TinyAV's two modalities for vLLM V1: data parser, processing info, dummy inputs, processor.

vLLM's default `apply`, as TinyVLM's, with three things TinyVLM did not need:

1. **Two modalities, each its own subparser** (`_get_subparsers`: modality name -> parse function;
   vLLM refuses any other key with "Unsupported modality"). Each takes an item in one of two forms:
   * *raw* (a list of images / audio clips): checked, then vLLM calls the HF processor on them;
   * *already processed* (a dict of the HF processor's output tensors, e.g. features computed
     elsewhere): checked, then wrapped in vLLM's `DictEmbeddingItems`, "passthrough" data that goes
     to the model as it is. vLLM calls no HF processor for it (and skips its processor cache), and
     accepts it only from an engine built with `enable_mm_embeds=True` (`vllm_engine.llm_kwargs`).
   Both forms end as the same fields (`fields_config`), so the model cannot tell them apart.
2. **An HF processor that needs the text.** By default vLLM calls the HF processor with the data
   alone (vLLM tokenizes the prompt itself and expands the placeholders on token ids). The switch
   that makes it pass text differs per release: vLLM 0.32 passes the string `_get_hf_mm_text`
   returns; vLLM 0.26 passes the dummy text (`get_dummy_text`) only when the processor class
   overrides `_call_hf_processor`. The processor below does both; each is ignored by the other
   release. The text is only there to satisfy the HF processor: its `input_ids` are discarded and
   vLLM applies `_get_prompt_updates` to the real prompt.
3. **A variable-length item with no natural maximum** (an audio clip): `get_mm_max_tokens_per_item`
   returns the longest clip the parser accepts, which is what fits the sequence.

Every value check (dtype, shape, NaN/inf, length, one placeholder per item) happens here, in the
front end, before the engine: a `ValueError` there refuses one request and the engine serves on.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

import torch
from transformers import BatchFeature
from vllm.config.multimodal import BaseDummyOptions
from vllm.inputs import MultiModalDataDict
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import (
    DictEmbeddingItems,
    ImageProcessorItems,
    MultiModalDataItems,
    MultiModalDataParser,
    ProcessorBatchItems,
)
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
    PromptUpdate,
)

from .config import (
    AUDIO_TOKEN,
    IMAGE_TOKEN,
    ItemSizes,
    TinyAVConfig,
    as_image_tensor,
    audio_list,
    check_audio,
    image_list,
)
from .hf_processing import TinyAVProcessor

IMAGE, AUDIO = "image", "audio"
PLACEHOLDER = {IMAGE: IMAGE_TOKEN, AUDIO: AUDIO_TOKEN}

# The HF processor's outputs, per modality: what a raw item becomes and what a processed one must hold.
PROCESSED_FIELDS = {IMAGE: frozenset({"pixel_values"}), AUDIO: frozenset({"audio_frames", "audio_num_frames"})}

# How many items of each modality one prompt may carry (the engine helper reads it).
LIMIT_MM_PER_PROMPT = {IMAGE: 2, AUDIO: 2}


def fields_config(hf_inputs: Mapping[str, torch.Tensor]) -> dict[str, MultiModalFieldConfig]:
    """How vLLM cuts the processor's tensors into one item each: an image is one row of
    `pixel_values` (`batched`); a clip is its `audio_num_frames[k]` rows of `audio_frames`
    (`flat_from_sizes`) and one entry of `audio_num_frames` (`batched`)."""
    n_frames = hf_inputs.get("audio_num_frames", torch.empty(0, dtype=torch.long))
    return {
        "pixel_values": MultiModalFieldConfig.batched(IMAGE),
        "audio_frames": MultiModalFieldConfig.flat_from_sizes(AUDIO, n_frames),
        "audio_num_frames": MultiModalFieldConfig.batched(AUDIO),
    }


class AudioClips(ProcessorBatchItems[torch.Tensor]):
    """Raw clips; handed to the HF processor as `audio=[...]` (its keyword) on both releases."""

    def __init__(self, clips: Sequence[torch.Tensor]) -> None:
        super().__init__(list(clips), AUDIO)

    def get_processor_data(self) -> Mapping[str, object]:
        return {AUDIO: self.get_all()}


def check_processed(data: Mapping[str, object], modality: str, sizes: ItemSizes, max_audio_tokens: int) -> int:
    """An already processed item dict: the fields of `PROCESSED_FIELDS[modality]`, float values
    finite, shapes the model takes. Returns the number of items; `ValueError` naming the problem."""
    where = f"processed {modality} data"
    if set(data) != PROCESSED_FIELDS[modality]:
        raise ValueError(f"{where}: keys {sorted(data)}; expected {sorted(PROCESSED_FIELDS[modality])}")
    for k, v in data.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"{where}: {k} is a {type(v).__name__}, not a tensor")
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise ValueError(f"{where}: {k} holds NaN or inf values")
    if modality == IMAGE:
        pv, patch = data["pixel_values"], 3 * sizes.patch_size**2
        if not pv.is_floating_point() or pv.ndim != 3 or tuple(pv.shape[1:]) != (sizes.image_tokens, patch):
            raise ValueError(f"{where}: pixel_values {pv.dtype} {list(pv.shape)}; expected float [n, {sizes.image_tokens}, {patch}]")
        return int(pv.shape[0])
    fr, n = data["audio_frames"], data["audio_num_frames"]
    if n.dtype not in (torch.int32, torch.int64) or n.ndim != 1 or not bool((n > 0).all()):
        raise ValueError(f"{where}: audio_num_frames must be integers > 0, one per clip; got {n.dtype} {n.tolist()}")
    if not fr.is_floating_point() or fr.ndim != 2 or fr.shape[1] != sizes.frame_size or fr.shape[0] != int(n.sum()):
        raise ValueError(f"{where}: audio_frames {fr.dtype} {list(fr.shape)}; expected float "
                         f"[{int(n.sum())} (the sum of audio_num_frames), {sizes.frame_size}]")
    if int(n.max()) > max_audio_tokens:
        raise ValueError(f"{where}: a clip of {int(n.max())} frames; at most {max_audio_tokens} fit this engine's sequence")
    return int(n.numel())


class TinyAVDataParser(MultiModalDataParser):
    """One subparser per modality, each checking its items, raw or already processed."""

    def __init__(self, sizes: ItemSizes, max_audio_tokens: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sizes, self.max_audio_tokens = sizes, max_audio_tokens

    def _get_subparsers(self):
        return {IMAGE: self._parse_images, AUDIO: self._parse_audio}  # any other modality: refused by vLLM

    def _processed(self, data: Mapping[str, object], modality: str) -> DictEmbeddingItems:
        check_processed(data, modality, self.sizes, self.max_audio_tokens)
        return DictEmbeddingItems(dict(data), modality, required_fields=set(PROCESSED_FIELDS[modality]),
                                  fields_factory=fields_config)

    def _parse_images(self, data):
        if data is None:
            return None
        if isinstance(data, Mapping):
            return self._processed(data, IMAGE)
        # one image or a list (PIL, as the chat API decodes an image_url; float arrays, tensors):
        # checked here, resized to the fixed input by the HF processor
        return ImageProcessorItems([as_image_tensor(img, i) for i, img in enumerate(image_list(data))])

    def _parse_audio(self, data):
        if data is None:
            return None
        if isinstance(data, Mapping):
            return self._processed(data, AUDIO)
        # one clip or a list: 1-D float arrays / tensors, or (samples, sampling_rate) tuples at the model's rate
        clips = [check_audio(c, self.sizes, i, self.max_audio_tokens) for i, c in enumerate(audio_list(data))]
        return AudioClips(clips)


class TinyAVProcessingInfo(BaseProcessingInfo):
    def get_hf_config(self) -> TinyAVConfig:
        return self.ctx.get_hf_config(TinyAVConfig)

    def get_hf_processor(self, **kwargs: object) -> TinyAVProcessor:
        return self.ctx.get_hf_processor(TinyAVProcessor, **kwargs)

    @cached_property
    def sizes(self) -> ItemSizes:
        return ItemSizes.from_config(self.get_hf_config())

    @cached_property
    def max_audio_tokens(self) -> int:
        return self.sizes.max_audio_tokens(self.ctx.model_config.max_model_len)

    def get_data_parser(self) -> MultiModalDataParser:
        return TinyAVDataParser(self.sizes, self.max_audio_tokens)

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {IMAGE: None, AUDIO: None}  # any number (the engine's limit_mm_per_prompt applies)

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        # An image always takes the same; a clip has no natural maximum (computed positions), so
        # declare the longest one the parser accepts: what fits the sequence. vLLM sizes its
        # encoder cache and start-up profiling from this, and refuses an item above the cache.
        return {IMAGE: self.sizes.image_tokens, AUDIO: self.sizes.max_audio_tokens(seq_len)}


class TinyAVDummyInputsBuilder(BaseDummyInputsBuilder[TinyAVProcessingInfo]):
    """Profiling inputs: one placeholder per item, and items of the largest size."""

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return IMAGE_TOKEN * mm_counts.get(IMAGE, 0) + AUDIO_TOKEN * mm_counts.get(AUDIO, 0)

    def get_dummy_mm_data(
        self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Mapping[str, BaseDummyOptions] | None = None
    ) -> MultiModalDataDict:
        s = self.info.sizes
        return {
            IMAGE: [torch.zeros(3, s.image_size, s.image_size)] * mm_counts.get(IMAGE, 0),
            AUDIO: [torch.zeros(s.max_audio_tokens(seq_len) * s.frame_size)] * mm_counts.get(AUDIO, 0),
        }


class TinyAVMultiModalProcessor(BaseMultiModalProcessor[TinyAVProcessingInfo]):
    """vLLM's default `apply` after one count check; the HF processor gets text on both releases."""

    def _get_hf_mm_text(self, mm_counts: Mapping[str, int]) -> str | None:
        # vLLM 0.32: the text passed to the HF processor beside the data (default: None, no text)
        return self.dummy_inputs.get_dummy_text(mm_counts)

    def _call_hf_processor(self, *args, **kwargs):
        # vLLM 0.26: overriding this method is the switch that makes vLLM pass the dummy text
        # (`_apply_hf_processor_mm_only`); its arguments differ per release, so pass them on as they are
        return super()._call_hf_processor(*args, **kwargs)

    def _get_mm_fields_config(self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object]):
        return fields_config(hf_inputs)

    def _get_prompt_updates(
        self,
        mm_items: MultiModalDataItems,
        hf_processor_mm_kwargs: Mapping[str, object],
        out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        cfg, sizes = self.info.get_hf_config(), self.info.sizes

        def audio_run(item_idx: int) -> list[int]:
            # from the processed item (raw or passed processed alike): its number of frames
            n = int(out_mm_kwargs[AUDIO][item_idx]["audio_num_frames"].data)
            return [cfg.audio_token_id] * n

        return [
            PromptReplacement(modality=IMAGE, target=[cfg.image_token_id],
                              replacement=[cfg.image_token_id] * sizes.image_tokens),
            PromptReplacement(modality=AUDIO, target=[cfg.audio_token_id], replacement=audio_run),
        ]

    def apply(self, inputs, timing_ctx):
        """One placeholder per item, checked here in the user's terms: without it vLLM raises an
        `AssertionError` ("Failed to apply prompt replacement") for an item without its placeholder
        and serves extra placeholders as words."""
        cfg = self.info.get_hf_config()
        for modality, token_id in ((IMAGE, cfg.image_token_id), (AUDIO, cfg.audio_token_id)):
            check_placeholder_count(inputs.prompt, modality, inputs.mm_data_items.get_count(modality, strict=False),
                                    token_id)
        return super().apply(inputs, timing_ctx)


def check_placeholder_count(prompt: str | Sequence[int], modality: str, n_items: int, token_id: int) -> None:
    """The prompt (token ids; text where a caller passes text) holds one placeholder per item."""
    token = PLACEHOLDER[modality]
    n = prompt.count(token) if isinstance(prompt, str) else sum(t == token_id for t in prompt)
    if n != n_items:
        raise ValueError(f"the prompt has {n} {token} token(s) but {n_items} {modality} item(s) were given; "
                         f"put one {token} in the text where each {modality} item goes")


__all__ = [
    "AUDIO", "IMAGE", "LIMIT_MM_PER_PROMPT", "PROCESSED_FIELDS", "AudioClips", "TinyAVDataParser",
    "TinyAVDummyInputsBuilder", "TinyAVMultiModalProcessor", "TinyAVProcessingInfo", "check_placeholder_count",
    "check_processed", "fields_config",
]
