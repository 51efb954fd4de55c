"""Terra's `actions` modality for vLLM V1: data parser, processing info, dummy inputs, processor.

The pieces follow vLLM's own multimodal models (`XProcessingInfo`, `XDummyInputsBuilder`,
`XMultiModalProcessor`, registered on the model class with `MULTIMODAL_REGISTRY.register_processor`),
for a modality that is not an image but six 3-vectors per frame.

**Prompt.** Terra has no tokenizer (`skip_tokenizer_init=True`): a prompt is token ids, every frame
being `image_tokens` codes followed by `action_tokens` *action slots* (576 + 6 = 582):

    [c_0 ... c_575, s, s, s, s, s, s,  c_0 ... c_575, s, s, s, s, s, s,  ...]

A slot holds the in-vocabulary placeholder id (`layout.placeholder_id` = vocab_size - 1, Terra's
bos/eos/pad id 262144) or `-3` (the original release's marker); the processor rewrites `-3` to the
placeholder id, since V1 embeds every prompt id (docs/decisions.md, 2).
Image codes 0 .. vocab_size-2 are all ordinary tokens (code 0 too).

**Items.** `multi_modal_data={"actions": a}` with `a` a float tensor `[n_frames*6, 3]` (the flat
form), `[n_frames, 6, 3]`, or a list of per-frame `[6, 3]` tensors. The parser splits it into one
*item per frame*; item k fills frame k's six slots. Every item gets its own identifier (a hash of
its 18 floats, or the caller's `multi_modal_uuids`), so when a rollout re-submits its prompt with
one more frame, the earlier frames' blocks hash exactly as before and the prefix cache reuses them.

**Cost.** A rollout sends every request again at every frame step, so the processor's `apply` is
on the hot path: it computes the slot ranges from the frame layout and hashes the raw floats,
O(frames) work, instead of vLLM's generic path (HF-processor plumbing, a generic serializer per
item, a scan of the whole prompt per item). `_get_prompt_updates` still declares the same
ranges the standard way, for vLLM's own code paths (profiling with zero items).

**Sessions.** In a streaming-input session (`session_rollout`) every chunk after the first is
`[last code of the frame just generated] + slots` with one item at offset 1 (vLLM drops that code
when the chunk before ends, so it is sent again); the front door says when a chunk is one
(`vllm_frontdoor.continuation_frames`), and `layout.normalize_session_chunk` checks it.

**Checks.** Wrong action shape, NaN/inf, codes out of range, a prompt that is not frame-aligned or
has a wrong slot, more frames than the engine can extend, a frame/action count mismatch: each is a
rule of `layout` (a `TerraInputError` naming the problem, leaving as vLLM's validation error through
`vllm_frontdoor.vllm_refusals`), checked here in the front end before the request reaches the engine
core, so the engine keeps serving.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import cached_property

import torch
from transformers import BatchFeature
from vllm.inputs import MultiModalDataDict, MultiModalInput, mm_input
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems, PlaceholderRange
from vllm.multimodal.parse import ModalityDataItems, MultiModalDataItems, MultiModalDataParser
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    ProcessorInputs,
    PromptReplacement,
    PromptUpdate,
)

from .config import LlamaActionConfig
from .engine_limits import engine_limit_why, max_prompt_frames
from .layout import (
    MODALITY,
    SEED_PLACEHOLDER,
    FrameLayout,
    TerraInputError,
    build_prompt,
    check_actions_match,
    normalize_prompt,
    normalize_session_chunk,
    validate_actions,
)
from .vllm_frontdoor import continuation_frames, require_door, vllm_refusals
from .vllm_release import DummyOptions, TokenIdsDummyInputsMixin, TokenizerFreeProcessorMixin


class ActionItems(ModalityDataItems[torch.Tensor, torch.Tensor]):
    """The actions of a prompt, one item per frame: `data` is float32 `[n_frames, 6, 3]`.

    The tensor goes to the model as it is ("passthrough" data: no HF processor is involved).
    """

    def __init__(self, data: torch.Tensor) -> None:
        super().__init__(data, MODALITY)

    def get_count(self) -> int:
        return int(self.data.shape[0])

    def get(self, index: int) -> torch.Tensor:
        return self.data[index]

    def get_processor_data(self) -> Mapping[str, object]:
        return {}

    def get_passthrough_data(self) -> Mapping[str, object]:
        return {MODALITY: self.data}


class LlamaActionDataParser(MultiModalDataParser):
    """`MultiModalDataParser` with an `actions` subparser (the other modalities stay as in vLLM)."""

    def __init__(self, layout: FrameLayout, **kwargs) -> None:
        super().__init__(**kwargs)
        self.layout = layout

    def _parse_action_data(self, data: object) -> ActionItems | None:
        if data is None:
            return None
        with vllm_refusals():  # one [6, 3] row per frame, float32, finite
            frames = validate_actions(data, self.layout)
        return ActionItems(frames.contiguous())

    def _get_subparsers(self):
        return {**super()._get_subparsers(), MODALITY: self._parse_action_data}


class LlamaActionProcessingInfo(BaseProcessingInfo):
    def get_hf_config(self) -> LlamaActionConfig:
        return self.ctx.get_hf_config(LlamaActionConfig)

    @cached_property
    def layout(self) -> FrameLayout:
        return FrameLayout.from_config(self.get_hf_config())

    @cached_property
    def max_prompt_frames(self) -> int:
        return max_prompt_frames(self.layout, self.ctx.model_config.max_model_len)

    def get_data_parser(self) -> MultiModalDataParser:
        return LlamaActionDataParser(self.layout)

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        # One item per frame of the prompt.
        return {MODALITY: self.max_prompt_frames}

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        # Every item fills the six action slots of its frame.
        return {MODALITY: self.layout.action_tokens}

    def validate_num_items(self, modality: str, num_items: int) -> None:
        """vLLM's per-prompt item limit, with the message in frames (it runs before the processor)."""
        if modality != MODALITY:
            return super().validate_num_items(modality, num_items)
        limit = min(self.max_prompt_frames, self.allowed_mm_limits.get(MODALITY, 0))
        if num_items > limit:
            why = (f"limit_mm_per_prompt={{'actions': {limit}}}" if limit < self.max_prompt_frames
                   else engine_limit_why(self.layout, self.ctx.model_config.max_model_len))
            with vllm_refusals():
                raise TerraInputError("too_many_frames", MODALITY, what="multi_modal_data['actions']", n=num_items,
                                      limit=limit, why=why)


class LlamaActionDummyInputsBuilder(TokenIdsDummyInputsMixin, BaseDummyInputsBuilder[LlamaActionProcessingInfo]):
    """Profiling inputs: `mm_counts["actions"]` whole frames with their action slots.

    The worst case vLLM asks for is the limit, 24 frames: 24 * 6 = 144 action tokens in a prompt of
    24 * 582 = 13968 tokens (vLLM pads the dummy sequence to `max_model_len` itself).
    """

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return ""  # no tokenizer; the prompt is `get_dummy_prompt_ids`

    def get_dummy_prompt_ids(self, seq_len: int, mm_counts: Mapping[str, int]) -> list[int]:
        layout = self.info.layout
        g = torch.Generator().manual_seed(0)
        codes = torch.randint(0, layout.num_codes, (mm_counts.get(MODALITY, 0), layout.image_tokens), generator=g)
        return build_prompt(codes, layout)

    def get_dummy_mm_data(
        self, seq_len: int, mm_counts: Mapping[str, int], mm_options: DummyOptions | None = None
    ) -> MultiModalDataDict:
        layout = self.info.layout
        n = mm_counts.get(MODALITY, 0)
        if n == 0:  # no item: no key (an empty [0, 3] tensor is not a frame's actions; the parser refuses it)
            return {}
        # A plausible trajectory: straight ahead, 2 m and 0.5 s per step.
        k = torch.arange(layout.action_tokens, dtype=torch.float32)
        one = torch.stack([torch.zeros_like(k), 2.0 * k, 0.5 * k], dim=1)[:, : layout.action_dim]
        return {MODALITY: one.repeat(n, 1)}  # the flat form [n*6, 3]


class LlamaActionMultiModalProcessor(TokenizerFreeProcessorMixin, BaseMultiModalProcessor[LlamaActionProcessingInfo]):
    """Checks a Terra prompt against its actions and maps frame k's six slots to action item k."""

    def __init__(self, *args, **kwargs) -> None:
        # vLLM builds the processor while an engine starts (in the front end, before the engine
        # core): no Terra engine where the front door's checks could not be installed.
        require_door()
        super().__init__(*args, **kwargs)

    def _get_mm_fields_config(
        self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object]
    ) -> Mapping[str, MultiModalFieldConfig]:
        # `actions` [n_frames, 6, 3]: item k is row k.
        return {MODALITY: MultiModalFieldConfig.batched(MODALITY)}

    def _get_prompt_updates(
        self,
        mm_items: MultiModalDataItems,
        hf_processor_mm_kwargs: Mapping[str, object],
        out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        layout = self.info.layout
        slots = [layout.placeholder_id] * layout.action_tokens
        # The slots are already in the prompt: locate the k-th run for item k and keep it as it is;
        # all six positions receive the item's embeddings.
        return [PromptReplacement(modality=MODALITY, target=slots, replacement=slots)]

    def _validate_request(self, prompt: Sequence[int], mm_items: MultiModalDataItems) -> tuple[list[int], int]:
        """Check a prompt and its parsed actions by the layout's rules; return the prompt with -3
        slots rewritten, and its number of frames."""
        info = self.info
        max_model_len = info.ctx.model_config.max_model_len
        ids, n_frames = normalize_prompt(prompt, info.layout, max_frames=info.max_prompt_frames,
                                         why=engine_limit_why(info.layout, max_model_len))
        check_actions_match(n_frames, mm_items.get_count(MODALITY, strict=False), info.layout)
        return ids, n_frames

    def _validate_continuation(
        self, prompt: Sequence[int], mm_items: MultiModalDataItems, frames_before: int
    ) -> list[int]:
        """Check a streaming session's later chunk (`[last code] + slots`, one item); return it with
        -3 slots rewritten."""
        info = self.info
        return normalize_session_chunk(prompt, mm_items.get_count(MODALITY, strict=False), frames_before, info.layout,
                                       max_frames=info.max_prompt_frames,
                                       why=engine_limit_why(info.layout, info.ctx.model_config.max_model_len))

    def apply(self, inputs: ProcessorInputs, timing_ctx) -> MultiModalInput:
        """Validate, then build the engine input directly from the frame layout.

        vLLM's generic `apply` would call an HF processor (there is none), hash every item through
        its generic serializer, and scan the prompt for each item's run of slots: work that grows
        with the prompt, for every request of every frame step. Here the slot ranges are known
        (frame k's slots start at k * frame_len + image_tokens), and an item's identity is a
        hash of its 18 floats, so the cost is O(frames). `_get_prompt_updates` above still
        describes the same ranges for vLLM's own code paths.
        """
        if not len(inputs.prompt) and not len(inputs.mm_data_items):
            return super().apply(inputs, timing_ctx)  # vLLM's profiling dummy for zero items
        frames_before = continuation_frames()
        with vllm_refusals():
            if frames_before is None:
                ids, n_frames = self._validate_request(inputs.prompt, inputs.mm_data_items)
                placeholders = action_placeholder_ranges(n_frames, self.info.layout)
            else:  # the scheduler re-bases the item onto the session (`_update_request_as_session`)
                ids = self._validate_continuation(inputs.prompt, inputs.mm_data_items, frames_before)
                placeholders = [PlaceholderRange(offset=1, length=self.info.layout.action_tokens)]
        actions = inputs.mm_data_items.get_items(MODALITY, ActionItems).data
        kwargs = MultiModalKwargsItems.from_hf_inputs(
            BatchFeature({MODALITY: actions}), self._get_mm_fields_config(BatchFeature(), {})
        )
        uuids = (inputs.mm_uuid_items or {}).get(MODALITY)
        return mm_input(
            prompt_token_ids=ids,
            mm_kwargs=kwargs,
            mm_hashes={MODALITY: action_item_hashes(actions, self.info.model_id, uuids)},
            mm_placeholders={MODALITY: placeholders},
        )


def action_placeholder_ranges(n_frames: int, layout: FrameLayout) -> list[PlaceholderRange]:
    """Where each frame's action item goes: frame k's six slots, after its image codes."""
    return [PlaceholderRange(offset=k * layout.frame_len + layout.image_tokens, length=layout.action_tokens)
            for k in range(n_frames)]


def action_item_hashes(actions: torch.Tensor, model_id: str, uuids: Sequence[str | None] | None = None) -> list[str]:
    """One identifier per frame item: the caller's `multi_modal_uuids` where given (vLLM's
    semantics), else a BLAKE2 hash of the model id and the frame's float32 actions.

    The identifier keys vLLM's encoder cache and enters the prefix-cache hash of the blocks that
    hold the slots, so equal actions must give equal ids (then a re-submitted prompt hits the
    cache) and different actions different ids (then it cannot).
    """
    rows = actions.detach().to(torch.float32).contiguous().numpy().reshape(actions.shape[0], -1)
    prefix = hashlib.blake2b(f"{model_id}\0{MODALITY}".encode(), digest_size=16).digest()
    out = []
    for k, row in enumerate(rows):
        given = uuids[k] if uuids is not None and k < len(uuids) else None
        out.append(given if given is not None else hashlib.blake2b(prefix + row.tobytes(), digest_size=16).hexdigest())
    return out


__all__ = [
    "MODALITY",
    "SEED_PLACEHOLDER",
    "ActionItems",
    "LlamaActionDataParser",
    "LlamaActionDummyInputsBuilder",
    "LlamaActionMultiModalProcessor",
    "LlamaActionProcessingInfo",
    "action_item_hashes",
    "action_placeholder_ranges",
]
