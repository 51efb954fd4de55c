"""The front door of a Terra engine: every request is checked before it reaches the engine core.

vLLM calls Terra's multimodal processor (`vllm_processing`) only for requests that carry
`multi_modal_data`; those are checked there in full (codes, slots, frames, actions). A request
*without* it goes from the front end straight to the engine core, and nothing in vLLM looks at
its ids when the engine runs with `skip_tokenizer_init=True` (as Terra's must: it has no
tokenizer). Unchecked, such a request

* with an id past the embedding table (`[10**7] * 10`) kills the engine: the worker's gather
  raises (`IndexError` on the CPU, a device-side assert on a GPU) and every later request gets
  `EngineDeadError`;
* with an id just past `vocab_size` (vLLM pads the table) or a negative id is embedded as garbage;
* with action slots is served with the placeholder's embedding where the actions belong: a
  plausible-looking but wrong video.

A request that asks for more tokens than its frame has image codes left (`max_tokens` past the
frame's end, e.g. vLLM's default `max_tokens=None`) is served wrong the same way, with or without
actions: the engine would generate codes into the action slots.

**What this module does.** `install()` (called by the plugin, `vllm_plugin.register`, in every
vLLM process) wraps vLLM's `InputProcessor.process_inputs`, the one method every request passes
on its way to the engine core (`LLM.generate`/`enqueue`, `AsyncLLM.generate`, `vllm serve`). For
engines whose model is Terra's (other models pass untouched), `check_request` then looks at the
finished `EngineCoreRequest`:

* without actions: the prompt must be image codes only (0 .. num_codes-1), no action slot (the
  placeholder id or the seed's -3), no id out of the vocabulary, and no longer than one frame's
  codes (position `image_tokens` is already an action slot);
* with actions: the processor has checked the prompt already; nothing is repeated;
* always: the generated tokens must stay inside the frame's image codes.

A failed check raises `RequestValidationError` (a `ValueError` and vLLM's `VLLMValidationError`,
which its server answers with HTTP 400), naming the problem, before anything reaches the engine
core: the engine keeps serving. In a batch (`llm.generate([good, bad, good])`) vLLM adds the
requests one by one and, when one raises, aborts those already added and re-raises: the call
returns nothing, and sending the good requests again gives what they would have given alone.

**Cost.** Nothing per decode step, nothing in the engine core or the workers. Per request: O(1)
for a request with actions (the usual case); for a request without, one vectorised (numpy) pass
over its ids, which vLLM has already bounded by `max_model_len`, and a good one holds at most
`image_tokens` of them.

**Why not a tokenizer.** The issue suggested giving Terra checkpoints a small tokenizer (image
codes as tokens) so that vLLM's own `validate_token_ids` runs. That check covers only part of
the problem, and differently on the two releases: it never looks for action slots without
actions (the ids are in the vocabulary); vLLM 0.26 checks only the upper bound (negative ids
pass), 0.32 both. So a front door of our own is needed anyway, and once it exists a tokenizer
adds nothing to safety but brings in detokenisation of every generated token unless each request
says `detokenize=False` (front-end work per decode step), EOS and special-token handling from a
made-up vocabulary, a `transformers` tokenizer class of 262145 entries, and a second plugin
registration that differs between releases. The wrapped method and the request fields it reads
(`prompt_token_ids`, `mm_features`, `sampling_params.max_tokens`, `prompt_embeds`) are the same
on 0.26 and 0.32 (`vllm_compat.InputProcessor`). Limit: a caller that hands vLLM a finished
`EngineCoreRequest` itself skips `process_inputs`, and with it every check of vLLM's own too.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from terra_nb.port.config import FrameLayout, LlamaActionConfig
from terra_nb.port.layout import SEED_PLACEHOLDER
from terra_nb.port.vllm_compat import InputProcessor, RequestValidationError

__all__ = [
    "check_generation_window",
    "check_plain_prompt",
    "check_prompt_container",
    "check_request",
    "check_sampling_ids",
    "install",
    "installed",
    "terra_layout",
]

_MARK = "_terra_front_door"


def terra_layout(model_config) -> FrameLayout | None:
    """The frame layout when `model_config` is a Terra model, else None (the door stays open)."""
    hf_config = getattr(model_config, "hf_config", None)
    if getattr(hf_config, "model_type", None) != LlamaActionConfig.model_type:
        return None
    return FrameLayout.from_config(hf_config)


def _where(position: int, layout: FrameLayout) -> str:
    frame, slot = divmod(position, layout.frame_len)
    if slot < layout.image_tokens:
        return f"position {position} (frame {frame}, image code {slot})"
    return f"position {position} (frame {frame}, action slot {slot - layout.image_tokens})"


def _as_int_array(ids: Sequence[int]) -> np.ndarray:
    """`ids` as a flat int64 array; RequestValidationError when they are not integers."""
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError, OverflowError) as e:  # ragged nesting and the like
        raise RequestValidationError(f"prompt_token_ids must be a flat list of ints ({e})",
                                     parameter="prompt_token_ids") from None
    if arr.ndim != 1:
        raise RequestValidationError(f"prompt_token_ids must be a flat list of ints, got shape {list(arr.shape)}",
                                     parameter="prompt_token_ids")
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False) if arr.dtype != np.uint64 else _checked_uint64(arr)
    bad = next((i for i, t in enumerate(ids) if not (isinstance(t, (int, np.integer)) and not isinstance(t, bool))), None)
    if bad is None:  # Python ints beyond int64
        big = next(i for i, t in enumerate(ids) if not -(2**63) <= t < 2**63)
        raise RequestValidationError(f"token id {ids[big]} at position {big} is out of vocabulary",
                                     parameter="prompt_token_ids")
    raise RequestValidationError(
        f"prompt_token_ids must be ints, got {type(ids[bad]).__name__} {ids[bad]!r} at position {bad}",
        parameter="prompt_token_ids")


def _checked_uint64(arr: np.ndarray) -> np.ndarray:
    big = np.flatnonzero(arr > np.iinfo(np.int64).max)
    if big.size:
        raise RequestValidationError(f"token id {int(arr[big[0]])} at position {int(big[0])} is out of vocabulary",
                                     parameter="prompt_token_ids")
    return arr.astype(np.int64)


def _first(mask: np.ndarray) -> int | None:
    hit = np.flatnonzero(mask)
    return int(hit[0]) if hit.size else None


def check_plain_prompt(ids: Sequence[int], layout: FrameLayout) -> None:
    """A prompt sent without actions: image codes only, at most one frame's codes.

    Raises RequestValidationError naming the first problem: action slots (placeholder id or -3)
    without actions, a negative id, an id past the vocabulary, codes running into frame 0's
    action slots. Vectorised; at most `image_tokens` ids are looked at on the success path.
    """
    n = len(ids)
    # Slots first: they are the likeliest mistake (a whole rollout prompt sent without its actions).
    arr = _as_int_array(ids)
    slot = _first((arr == layout.placeholder_id) | (arr == SEED_PLACEHOLDER))
    if slot is not None:
        raise RequestValidationError(
            f"the prompt holds action slots but no multi_modal_data: {_where(slot, layout)} holds "
            f"{int(arr[slot])}; pass the actions of every frame of the prompt as "
            f"multi_modal_data={{'actions': [n_frames, {layout.action_tokens}, {layout.action_dim}]}} "
            f"(vllm_rollout.frame_request builds both)",
            parameter="multi_modal_data")
    neg = _first(arr < 0)
    if neg is not None:
        raise RequestValidationError(
            f"token id {int(arr[neg])} at position {neg} is negative; Terra's ids are image codes "
            f"0..{layout.num_codes - 1} and the action-slot id {layout.placeholder_id}",
            parameter="prompt_token_ids")
    big = _first(arr >= layout.vocab_size)
    if big is not None:
        raise RequestValidationError(
            f"token id {int(arr[big])} at position {big} is out of vocabulary (vocab_size {layout.vocab_size}: "
            f"image codes 0..{layout.num_codes - 1}, action-slot id {layout.placeholder_id})",
            parameter="prompt_token_ids")
    if n > layout.image_tokens:
        raise RequestValidationError(
            f"the prompt has no multi_modal_data but {n} tokens: positions {layout.image_tokens}.."
            f"{layout.frame_len - 1} are frame 0's action slots, so a prompt without actions holds at most "
            f"{layout.image_tokens} image codes; send whole frames, each followed by its "
            f"{layout.action_tokens} slots, with their actions in multi_modal_data",
            parameter="multi_modal_data")


def check_generation_window(prompt_len: int, max_tokens: int | None, layout: FrameLayout) -> None:
    """The tokens generated after `prompt_len` prompt tokens must stay in their frame's image codes.

    A frame's action slots follow its last code; vLLM cannot put actions there during decoding,
    so generating past them produces codes conditioned on nothing. One request makes one frame.
    """
    if max_tokens is None:
        return
    into = prompt_len % layout.frame_len
    left = layout.image_tokens - into
    if max_tokens > left:
        frame = prompt_len // layout.frame_len
        if left <= 0:
            raise RequestValidationError(
                f"max_tokens={max_tokens} runs past the frame: the prompt already holds all {layout.image_tokens} "
                f"codes of frame {frame}, whose {layout.action_tokens} action slots come next; send the frame "
                f"with its slots and its actions in multi_modal_data to generate the next one",
                parameter="max_tokens")
        raise RequestValidationError(
            f"max_tokens={max_tokens} runs past the frame: the prompt ends {into} codes into frame {frame}, "
            f"which has {left} image codes left before its {layout.action_tokens} action slots; generate at "
            f"most one frame per request (max_tokens <= {left}) and send the next frame's request with its actions",
            parameter="max_tokens")


def check_sampling_ids(params, layout: FrameLayout) -> None:
    """Token ids inside the sampling parameters (`logit_bias`, `allowed_token_ids`,
    `stop_token_ids`) must be in the vocabulary: vLLM 0.32 checks this itself, 0.26 does not (an
    out-of-range `logit_bias` id would index past the logits row on the GPU)."""
    for key in ("logit_bias", "allowed_token_ids", "stop_token_ids"):
        ids = getattr(params, key, None) or ()
        bad = [t for t in ids if not (isinstance(t, (int, np.integer)) and 0 <= int(t) < layout.vocab_size)]
        if bad:
            raise RequestValidationError(
                f"{key} holds token id {bad[0]!r}, out of vocabulary (vocab_size {layout.vocab_size}: image codes "
                f"0..{layout.num_codes - 1}, action-slot id {layout.placeholder_id})", parameter=key)


def check_prompt_container(prompt) -> None:
    """`prompt_token_ids` of a request without actions must be a list (or tuple) of ints.

    An array or tensor fails inside vLLM ("truth value of an array ... is ambiguous"), before the
    finished request could be checked; say what is wrong instead. (With actions the processor
    reads any sequence and hands vLLM a list.)
    """
    if not isinstance(prompt, Mapping) or prompt.get("type") == "multimodal" or prompt.get("multi_modal_data"):
        return
    ids = prompt.get("prompt_token_ids")
    if ids is not None and not isinstance(ids, (list, tuple)):
        raise RequestValidationError(
            f"prompt_token_ids must be a list of ints, got {type(ids).__module__}.{type(ids).__name__}; "
            f"pass ids.tolist()", parameter="prompt_token_ids")


def check_request(request, layout: FrameLayout) -> None:
    """Check a finished `EngineCoreRequest` of a Terra engine; RequestValidationError if it is bad."""
    if getattr(request, "prompt_embeds", None) is not None:
        raise RequestValidationError(
            "Terra prompts are token ids (image codes with action slots), not prompt_embeds",
            parameter="prompt_embeds")
    ids = request.prompt_token_ids
    if ids is None:
        return
    if not request.mm_features:  # with actions, the processor has checked the prompt already
        check_plain_prompt(ids, layout)
    params = request.sampling_params
    if params is not None:
        check_sampling_ids(params, layout)
        check_generation_window(len(ids), params.max_tokens, layout)


def _door(processor) -> FrameLayout | None:
    """The Terra layout of this `InputProcessor`'s model (None for other models), computed once."""
    cache = processor.__dict__
    if _MARK not in cache:
        cache[_MARK] = terra_layout(processor.model_config)
    return cache[_MARK]


def installed() -> bool:
    """Whether `InputProcessor.process_inputs` is wrapped in this process."""
    return getattr(InputProcessor.process_inputs, _MARK, False)


def install() -> None:
    """Wrap `InputProcessor.process_inputs` once per process (idempotent)."""
    if installed():
        return
    process_inputs = InputProcessor.process_inputs

    @functools.wraps(process_inputs)
    def checked_process_inputs(self, *args, **kwargs):
        layout = _door(self)
        if layout is not None:  # process_inputs(request_id, prompt, params, ...) on both releases
            check_prompt_container(kwargs["prompt"] if "prompt" in kwargs else args[1] if len(args) > 1 else None)
        request = process_inputs(self, *args, **kwargs)
        if layout is not None:
            check_request(request, layout)
        return request

    setattr(checked_process_inputs, _MARK, True)
    InputProcessor.process_inputs = checked_process_inputs
