"""Terra's token layout, and every rule a Terra input must obey, in one place.

One frame = `image_tokens` codes followed by `action_tokens` action slots (576 + 6 = 582 for
Terra); a round holds at most `max_frames` frames (25). The HF model, the ONNX rollout, the vLLM
processor, the vLLM front door and the rollouts check their inputs by calling the functions here,
so each rule is written (and worded) once, and each check too: the action-slot test
(`is_slot_id`), the image-code range (`check_codes`) and the id range (`check_ids_in_vocab`) are
one function each, whatever the input (a prompt, a session's chunk, a tensor of frames).

Helpers that are not rules live beside it and refuse only through these rules: `interleave`
(positions of codes and slots for the HF and ONNX backends), `rounds` (a rollout split into
generate calls), `engine_limits` (what fits an engine of a given `max_model_len`).

**Refusals.** Every broken rule raises `TerraInputError`, a `ValueError` with

* `.rule`: the rule's id, a key of `RULES` (e.g. `"not_frame_aligned"`);
* `.param`: the parameter the problem lies in (`"prompt_token_ids"`, `"multi_modal_data"`,
  `"actions"`, `"max_tokens"`, `"context"`, ...); vLLM's `VLLMValidationError` carries the same;
* `str(err)`: the rule's `template` filled in, naming the position and value at fault.

The front door (`vllm_frontdoor`) re-raises it as vLLM's validation error with the same message,
`.rule` and `.param`. To match a message to its rule where only the text is at hand (a server's
HTTP 400 body, vLLM's wrapped error), `rule_of(text)` returns the id whose template it fits:

| rule | param | message begins |
|---|---|---|
| `prompt_not_token_ids` | prompt | Terra prompts are token ids |
| `ids_not_ints` | prompt_token_ids | prompt_token_ids must be a flat list of ints |
| `id_negative` | prompt_token_ids | token id ... is negative |
| `id_out_of_vocab` | prompt_token_ids | token id ... is out of vocabulary |
| `not_frame_aligned` | prompt_token_ids | prompt is not frame-aligned |
| `wrong_action_slots` | prompt_token_ids | wrong action slots |
| `code_out_of_range` | prompt_token_ids | image code out of range |
| `too_many_frames` | prompt_token_ids | too many frames |
| `session_chunk` | prompt_token_ids | a session's chunk after its first is |
| `slots_without_actions` | multi_modal_data | the prompt holds action slots but no multi_modal_data |
| `plain_prompt_too_long` | multi_modal_data | the prompt has no multi_modal_data but |
| `generation_window` | max_tokens | max_tokens=... runs past the frame |
| `sequence_too_long` | input_ids | sequence too long |
| `ends_in_action_slots` | past_key_values | the sequence ends inside the action slots |
| `actions_not_numbers` | actions | ... must be numbers |
| `wrong_action_shape` | actions | wrong action shape |
| `actions_not_finite` | actions | actions contain NaN or inf |
| `actions_missing` | actions | actions cover ... frames but ... are needed |
| `actions_mismatch` | multi_modal_data | actions do not match the prompt |
| `unknown_modality` | multi_modal_data | Terra's requests carry one modality |
| `batch_mismatch` | actions | batch sizes differ |
| `codes_not_ints` | context | ... frames must hold integer codes |
| `frames_shape` | context | ... must have shape |
| `out_of_bounds` | n_frames | ... out of bounds: must be ... |
| `max_model_len` | max_model_len | max_model_len ... exceeds Terra's |

The table is `RULES` itself (`Rule(id, param, template)`); a test checks that the two agree.
"""
from __future__ import annotations

import array
import math
import re
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

import numpy as np
import torch

SEED_PLACEHOLDER = -3
"""The original release marked action slots with -3; vLLM V1 needs an in-vocabulary id (notebook 02)."""

MODALITY = "actions"
"""Terra's one multimodal input: six (x, y, t) waypoints per frame, `multi_modal_data={"actions": ...}`."""


# ---------------------------------------------------------------------------- the layout
@dataclass(frozen=True)
class FrameLayout:
    """Where every token of a Terra sequence sits: [576 image codes, 6 actions] per frame."""

    image_tokens: int = 576
    action_tokens: int = 6
    max_frames: int = 25
    action_dim: int = 3
    vocab_size: int = 262145

    @classmethod
    def from_config(cls, config) -> "FrameLayout":
        return cls(
            image_tokens=config.num_image_patches,
            action_tokens=config.num_action_embeddings,
            max_frames=config.num_temporal_embeddings,
            action_dim=config.action_dim,
            vocab_size=config.vocab_size,
        )

    @property
    def frame_len(self) -> int:
        """Tokens per frame including its action slots (582 for Terra)."""
        return self.image_tokens + self.action_tokens

    @property
    def max_len(self) -> int:
        return self.frame_len * self.max_frames

    @property
    def num_codes(self) -> int:
        """Image codes are 0 .. vocab_size - 2; the last id is bos/eos/pad."""
        return self.vocab_size - 1

    @property
    def grid_shape(self) -> tuple[int, int]:
        """(rows, cols) of the code grid for rendering: Terra 576 -> (18, 32), tiny 64 -> (8, 8).

        The factor pair rows <= cols whose aspect is closest to the camera's 9:16
        (288x512 pixels, 16x16 per code).
        """
        n = self.image_tokens
        pairs = [(r, n // r) for r in range(1, math.isqrt(n) + 1) if n % r == 0]
        return min(pairs, key=lambda rc: abs(math.log((rc[0] / rc[1]) / (9 / 16))))

    @property
    def placeholder_id(self) -> int:
        """In-vocabulary id that fills action slots inside vLLM (262144 for Terra)."""
        return self.vocab_size - 1


# ---------------------------------------------------------------------------- the rules
class Rule(NamedTuple):
    id: str
    param: str
    template: str

    @property
    def pattern(self) -> re.Pattern:
        """A regex matching any message this rule's template produces."""
        parts = re.split(r"\{[a-z_]*(?:![rs])?\}", self.template.replace("{{", "{").replace("}}", "}"))
        return re.compile(".*?".join(re.escape(p) for p in parts), re.S)


_RULES = (
    Rule("prompt_not_token_ids", "prompt",
         "Terra prompts are token ids (image codes with action slots), not {got}; pass "
         "{{'prompt_token_ids': [...]}} to an engine built with skip_tokenizer_init=True"),
    Rule("ids_not_ints", "prompt_token_ids", "prompt_token_ids must be a flat list of ints, got {got}"),
    Rule("id_negative", "prompt_token_ids",
         "token id {value} at {where} is negative; Terra's ids are image codes 0..{last_code} and the "
         "action-slot id {placeholder}"),
    Rule("id_out_of_vocab", "prompt_token_ids",
         "token id {value} at {where} is out of vocabulary (vocab_size {vocab_size}: image codes "
         "0..{last_code}, action-slot id {placeholder})"),
    Rule("not_frame_aligned", "prompt_token_ids",
         "prompt is not frame-aligned: {n} tokens is not a multiple of {frame_len} ({image_tokens} image "
         "codes + {action_tokens} action slots per frame)"),
    Rule("wrong_action_slots", "prompt_token_ids",
         "wrong action slots: {where} holds {value}, expected {seed} or {placeholder} in all "
         "{action_tokens} slots of every frame"),
    Rule("code_out_of_range", "prompt_token_ids",
         "image code out of range: {where} holds {value}; codes must lie in 0..{last_code}"),
    Rule("too_many_frames", "prompt_token_ids", "too many frames: {what} holds {n}, at most {limit} fit ({why})"),
    Rule("session_chunk", "prompt_token_ids",
         "a session's chunk after its first is {chunk_len} ids (the last code of the frame just generated, "
         "which the session drops, and its {action_tokens} action slots), got {n}"),
    Rule("slots_without_actions", "multi_modal_data",
         "the prompt holds action slots but no multi_modal_data: {where} holds {value}; pass the actions "
         "of every frame of the prompt as multi_modal_data={{'actions': [n_frames, {action_tokens}, "
         "{action_dim}]}} (vllm_rollout.frame_request builds both)"),
    Rule("plain_prompt_too_long", "multi_modal_data",
         "the prompt has no multi_modal_data but {n} tokens: positions {image_tokens}..{last_slot} are "
         "frame 0's action slots, so a prompt without actions holds at most {image_tokens} image codes; "
         "send whole frames, each followed by its {action_tokens} slots, with their actions in multi_modal_data"),
    Rule("generation_window", "max_tokens",
         "max_tokens={max_tokens} runs past the frame: the prompt ends {into} codes into frame {frame}, "
         "which has {left} image codes left before its {action_tokens} action slots; generate at most one "
         "frame per request and send the next frame with its slots and its actions in multi_modal_data"),
    Rule("sequence_too_long", "input_ids",
         "sequence too long: positions {first}..{last} exceed the model's {max_len} ({max_frames} frames "
         "of {frame_len})"),
    Rule("ends_in_action_slots", "past_key_values",
         "the sequence ends inside the action slots of frame {frame} (position {position}, slot {slot}); "
         "a frame's {action_tokens} action positions always come in together with its last image code"),
    Rule("actions_not_numbers", "actions", "{what} must be numbers, got {got}"),
    Rule("wrong_action_shape", "actions", "wrong action shape: got {got}, expected {expected}"),
    Rule("actions_not_finite", "actions", "actions contain NaN or inf (first at frame {frame}, slot {slot})"),
    Rule("actions_missing", "actions", "actions cover {have} frames but {need} are needed ({why})"),
    Rule("actions_mismatch", "multi_modal_data",
         "actions do not match the prompt: the prompt holds {n_frames} frames with {action_tokens} action "
         "slots each, the actions cover {n_items} frames; pass one [{action_tokens}, {action_dim}] per "
         "frame of the prompt"),
    Rule("unknown_modality", "multi_modal_data",
         "Terra's requests carry one modality, {modality!r}: got {got}"),
    Rule("batch_mismatch", "actions", "batch sizes differ: actions hold {have} rollouts but {what} holds {batch}"),
    Rule("codes_not_ints", "context", "{what} frames must hold integer codes, got dtype {dtype}"),
    Rule("frames_shape", "context", "{what} must have shape {expected}, got {got}"),
    Rule("out_of_bounds", "n_frames", "{what} out of bounds: must be {bound}, got {value}"),
    Rule("max_model_len", "max_model_len",
         "max_model_len {value} exceeds Terra's {max_len} positions ({max_frames} frames of {frame_len}); "
         "the temporal embedding has no row for later frames"),
)
RULES: Mapping[str, Rule] = {r.id: r for r in _RULES}
"""Rule id -> `Rule(id, param, template)`: every refusal of a Terra input, one message each."""
_PATTERNS = {r.id: r.pattern for r in _RULES}


class TerraInputError(ValueError):
    """A Terra input broke a rule: `.rule` (a key of `RULES`), `.param` (the parameter at fault)."""

    def __init__(self, rule: str, param: str | None = None, **fields):
        spec = RULES[rule]
        self.rule = rule
        self.param = param or spec.param
        self.fields = fields
        super().__init__(spec.template.format(**fields))


def rule_of(message: str | BaseException) -> str | None:
    """The id of the rule whose message `message` is (or contains), None for any other text."""
    rule = getattr(message, "rule", None)
    if rule in RULES:
        return rule
    text = str(message)
    hits = [r for r in _RULES if _PATTERNS[r.id].search(text)]
    # Where several fit (a field's text may echo another rule's words), the most literal template wins.
    return max(hits, key=lambda r: len(re.sub(r"\{[a-z_]*(?:![rs])?\}", "", r.template))).id if hits else None


def _id_fields(layout: FrameLayout) -> dict:
    return dict(last_code=layout.num_codes - 1, placeholder=layout.placeholder_id, vocab_size=layout.vocab_size)


def where(position: int, layout: FrameLayout) -> str:
    """'position 73 (frame 1, image code 3)' / 'position 66 (frame 0, action slot 2)'."""
    frame, slot = divmod(position, layout.frame_len)
    if slot < layout.image_tokens:
        return f"position {position} (frame {frame}, image code {slot})"
    return f"position {position} (frame {frame}, action slot {slot - layout.image_tokens})"


def _first(mask: np.ndarray) -> int | None:
    hit = np.flatnonzero(mask)
    return int(hit[0]) if hit.size else None


def is_slot_id(ids: np.ndarray, layout: FrameLayout) -> np.ndarray:
    """Where `ids` hold an action-slot id, in either spelling: the seed's -3 or the in-vocabulary
    placeholder (`layout.placeholder_id`)."""
    return (ids == SEED_PLACEHOLDER) | (ids == layout.placeholder_id)


def check_slots(slots: np.ndarray, positions: np.ndarray, layout: FrameLayout) -> None:
    """Every id of `slots` (at absolute `positions`, same shape) is an action-slot id
    (`wrong_action_slots`, naming the first that is not)."""
    bad = ~is_slot_id(slots, layout)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise TerraInputError("wrong_action_slots", where=where(int(positions[i]), layout), value=int(slots[i]),
                              seed=SEED_PLACEHOLDER, placeholder=layout.placeholder_id,
                              action_tokens=layout.action_tokens)


def check_codes(codes, layout: FrameLayout, where_of, param: str | None = None) -> None:
    """Every image code of `codes` (an array or tensor of ids) lies in 0..num_codes-1
    (`code_out_of_range`); `where_of(index)` names the place of the first that does not."""
    codes = codes.numpy(force=True) if isinstance(codes, torch.Tensor) else np.asarray(codes)
    bad = (codes < 0) | (codes >= layout.num_codes)
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        raise TerraInputError("code_out_of_range", param, where=where_of(i), value=int(codes[i]),
                              last_code=layout.num_codes - 1)


def check_modality(modality: str) -> None:
    """A request's multimodal data is Terra's actions (`unknown_modality` for any other)."""
    if modality != MODALITY:
        raise TerraInputError("unknown_modality", modality=MODALITY, got=repr(modality))


def check_at_least(name: str, value: int, low: int) -> None:
    """`value` (the parameter `name`) is at least `low` (`out_of_bounds`)."""
    if value < low:
        raise TerraInputError("out_of_bounds", name, what=name, bound=f">= {low}", value=value)


# ---------------------------------------------------------------------------- prompts
def build_prompt(frames: torch.Tensor, layout: FrameLayout, placeholder: int | None = None) -> list[int]:
    """Image codes of `n` frames [n, image_tokens] -> token ids with action slots after every frame.

    `placeholder` defaults to the in-vocabulary id; pass SEED_PLACEHOLDER for the -3 form.
    """
    frames = torch.as_tensor(frames)
    if frames.dim() != 2 or frames.shape[1] != layout.image_tokens:
        raise TerraInputError("frames_shape", what="frames", expected=f"[n_frames, {layout.image_tokens}]",
                              got=list(frames.shape))
    ph = layout.placeholder_id if placeholder is None else placeholder
    slots = torch.full((frames.shape[0], layout.action_tokens), ph, dtype=torch.long)
    return torch.cat([frames.long(), slots], dim=1).flatten().tolist()


def token_array(token_ids: Sequence[int], layout: FrameLayout | None = None) -> np.ndarray:
    """Token ids as a flat int64 array, converted once (a 24-frame prompt is 13968 ids).

    Refuses (`ids_not_ints`) floats, nested lists, text, and (`id_out_of_vocab`) ints beyond int64.
    `array.array` is the fastest exact conversion of a Python list of ints.
    """
    if isinstance(token_ids, str) or token_ids is None:
        raise TerraInputError("prompt_not_token_ids", got=type(token_ids).__name__)
    if isinstance(token_ids, (torch.Tensor, np.ndarray)):
        arr = np.asarray(token_ids)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise TerraInputError("ids_not_ints", got=f"{arr.dtype} of shape {list(arr.shape)}")
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            _refuse_big_id(arr.tolist(), layout)
        return arr.astype(np.int64, copy=False)
    try:
        return np.frombuffer(array.array("q", token_ids), dtype=np.int64)
    except (TypeError, OverflowError):
        pass
    ids = list(token_ids)
    bad = next((i for i, t in enumerate(ids) if not isinstance(t, (int, np.integer)) or isinstance(t, bool)), None)
    if bad is None:
        _refuse_big_id(ids, layout)
    raise TerraInputError("ids_not_ints", got=f"{type(ids[bad]).__name__} {ids[bad]!r} at position {bad}")


def _refuse_big_id(ids: list, layout: FrameLayout | None) -> None:
    i = next(i for i, t in enumerate(ids) if not -(2**63) <= int(t) < 2**63)
    lay = layout or FrameLayout()
    raise TerraInputError("id_out_of_vocab", value=ids[i], where=f"position {i}", **_id_fields(lay))


def check_prompt_container(ids) -> None:
    """`prompt_token_ids` handed to vLLM without actions must be a list or tuple (an array fails
    inside vLLM with "truth value of an array ... is ambiguous" before it could be checked)."""
    if ids is not None and not isinstance(ids, (list, tuple)):
        raise TerraInputError("ids_not_ints", got=f"{type(ids).__module__}.{type(ids).__name__}; pass ids.tolist()")


def from_seed_prompt(token_ids: Sequence[int], layout: FrameLayout) -> list[int]:
    """Convert a -3 prompt (the original release's form) to the in-vocabulary placeholder."""
    ids, _ = normalize_prompt(token_ids, layout, validate=False)
    return ids


def validate_prompt(token_ids: Sequence[int], layout: FrameLayout) -> int:
    """Check a placeholder prompt and return its number of frames; TerraInputError names the problem.

    Accepts -3 or the in-vocabulary id in the action slots.
    """
    _, n_frames = normalize_prompt(token_ids, layout)
    return n_frames


def normalize_prompt(
    token_ids: Sequence[int], layout: FrameLayout, validate: bool = True, max_frames: int | None = None,
    why: str | None = None,
) -> tuple[list[int], int]:
    """Check a prompt (unless `validate=False`) and return it with -3 slots rewritten to the
    in-vocabulary placeholder, and its number of frames (complete frames when not validated).

    `max_frames` (default `layout.max_frames`) is the most frames the prompt may hold, `why` says
    where that limit comes from. One conversion to an array and vectorised checks: this runs for
    every request of every frame step, so it costs O(frames) Python work, not a loop over 14k ids.
    """
    ids = token_array(token_ids, layout)
    if validate:
        check_prompt(ids, layout, max_frames, why)
    is_seed = ids == SEED_PLACEHOLDER
    if is_seed.any():
        return np.where(is_seed, layout.placeholder_id, ids).tolist(), ids.size // layout.frame_len
    out = token_ids if type(token_ids) is list else ids.tolist()
    return out, ids.size // layout.frame_len


def check_prompt(ids: np.ndarray, layout: FrameLayout, max_frames: int | None = None, why: str | None = None) -> None:
    """A prompt with actions: whole frames, placeholder slots, codes in range, not too many frames."""
    n = ids.size
    if n == 0 or n % layout.frame_len:
        raise TerraInputError("not_frame_aligned", n=n, frame_len=layout.frame_len,
                              image_tokens=layout.image_tokens, action_tokens=layout.action_tokens)
    n_frames = n // layout.frame_len
    limit = layout.max_frames if max_frames is None else max_frames
    if n_frames > limit:
        raise TerraInputError("too_many_frames", what="the prompt", n=n_frames, limit=limit,
                              why=why or f"a round is {layout.max_frames} frames")
    grid = ids.reshape(n_frames, layout.frame_len)
    positions = np.arange(n).reshape(n_frames, layout.frame_len)
    P = layout.image_tokens
    check_slots(grid[:, P:], positions[:, P:], layout)  # slots first: where a bad id sits names the rule
    check_codes(grid[:, :P], layout, lambda i: where(int(positions[i]), layout))


def normalize_session_chunk(
    token_ids: Sequence[int], n_items: int, frames_before: int, layout: FrameLayout, max_frames: int | None = None,
    why: str | None = None,
) -> list[int]:
    """Check a streaming session's chunk after its first; return it with -3 slots rewritten.

    Before the chunk the session holds `frames_before` whole frames (codes and slots) and the codes
    of the newest frame but its last, which vLLM drops (it was sampled, never fed). The chunk
    re-sends that code and the frame's `action_tokens` slots, with exactly one action item (for
    offset 1): `[code] + slots`.
    The frames then in the session's prompt (`frames_before + 1`) obey the prompt's frame limit
    (`max_frames`, `why`), so a chunk cannot run the session past the engine's window.
    """
    ids = token_array(token_ids, layout)
    chunk_len = 1 + layout.action_tokens
    if ids.size != chunk_len:
        raise TerraInputError("session_chunk", n=ids.size, chunk_len=chunk_len, action_tokens=layout.action_tokens)
    # As in `check_prompt`, where a bad id sits names the rule: slots first, then the code.
    position = (frames_before + 1) * layout.frame_len - layout.action_tokens - 1  # the re-sent code's place
    positions = position + np.arange(chunk_len)
    check_slots(ids[1:], positions[1:], layout)
    check_codes(ids[:1], layout, lambda i: where(position, layout))
    check_actions_match(1, n_items, layout)
    limit = layout.max_frames if max_frames is None else max_frames
    if frames_before + 1 > limit:
        raise TerraInputError("too_many_frames", what="the session's prompt", n=frames_before + 1, limit=limit,
                              why=why or f"a round is {layout.max_frames} frames")
    return np.where(np.r_[False, is_slot_id(ids[1:], layout)], layout.placeholder_id, ids).tolist()


def check_actions_match(n_frames: int, n_items: int, layout: FrameLayout) -> None:
    """A prompt with actions carries exactly one action item per frame."""
    if n_items != n_frames:
        raise TerraInputError("actions_mismatch", n_frames=n_frames, n_items=n_items,
                              action_tokens=layout.action_tokens, action_dim=layout.action_dim)


def check_plain_prompt(ids: Sequence[int], layout: FrameLayout) -> None:
    """A prompt sent without actions: image codes only, at most one frame's codes.

    Refuses, naming the first problem: action slots (placeholder id or -3) without actions, a
    negative id, an id past the vocabulary, codes running into frame 0's action slots. Vectorised.
    """
    arr = token_array(ids, layout)
    # Slots first: they are the likeliest mistake (a whole rollout prompt sent without its actions).
    slot = _first(is_slot_id(arr, layout))
    if slot is not None:
        raise TerraInputError("slots_without_actions", where=where(slot, layout), value=int(arr[slot]),
                              action_tokens=layout.action_tokens, action_dim=layout.action_dim)
    check_ids_in_vocab(arr, layout)
    if arr.size > layout.image_tokens:
        raise TerraInputError("plain_prompt_too_long", n=arr.size, image_tokens=layout.image_tokens,
                              last_slot=layout.frame_len - 1, action_tokens=layout.action_tokens)


def check_ids_in_vocab(arr: np.ndarray, layout: FrameLayout, param: str = "prompt_token_ids",
                       name: str = "position") -> None:
    """Every id lies in 0..vocab_size-1 (`id_negative`, `id_out_of_vocab`)."""
    neg = _first(arr < 0)
    if neg is not None:
        raise TerraInputError("id_negative", param, value=int(arr[neg]), where=f"{name} {neg}", **_id_fields(layout))
    big = _first(arr >= layout.vocab_size)
    if big is not None:
        raise TerraInputError("id_out_of_vocab", param, value=int(arr[big]), where=f"{name} {big}",
                              **_id_fields(layout))


def check_sampling_ids(params, layout: FrameLayout) -> None:
    """Token ids inside sampling parameters (`logit_bias`, `allowed_token_ids`, `stop_token_ids`)
    are in the vocabulary. vLLM 0.32 checks all three itself; 0.26 checks only `logit_bias`
    (`SamplingParams.verify`, before this runs), and an out-of-range `allowed_token_ids` id would
    index past the logits row on the GPU."""
    for key in ("logit_bias", "allowed_token_ids", "stop_token_ids"):
        ids = list(getattr(params, key, None) or ())
        bad = next((i for i, t in enumerate(ids) if not isinstance(t, (int, np.integer)) or isinstance(t, bool)), None)
        if bad is not None:
            raise TerraInputError("id_out_of_vocab", key, value=repr(ids[bad]), where=f"{key} entry {bad}",
                                  **_id_fields(layout))
        if ids:
            check_ids_in_vocab(token_array(ids, layout), layout, param=key, name=f"{key} entry")


def check_generation_window(prompt_len: int, max_tokens: int | None, layout: FrameLayout) -> None:
    """The tokens generated after `prompt_len` prompt tokens stay in their frame's image codes.

    A frame's action slots follow its last code; vLLM cannot put actions there while decoding, so
    generating past them produces codes conditioned on nothing. One request makes one frame.
    """
    if max_tokens is None:
        return
    into = min(prompt_len % layout.frame_len, layout.image_tokens)
    left = layout.image_tokens - into
    if max_tokens > left:
        raise TerraInputError("generation_window", max_tokens=max_tokens, into=into,
                              frame=prompt_len // layout.frame_len, left=left, action_tokens=layout.action_tokens)


# ---------------------------------------------------------------------------- codes and actions
def validate_codes(frames: torch.Tensor, layout: FrameLayout, what: str = "context") -> torch.Tensor:
    """Check image codes [..., n_frames, image_tokens] and return them as int64."""
    frames = torch.as_tensor(frames)
    if frames.dtype.is_floating_point or frames.dtype == torch.bool:
        raise TerraInputError("codes_not_ints", what, what=what, dtype=frames.dtype)
    if frames.dim() < 2 or frames.shape[-1] != layout.image_tokens:
        raise TerraInputError("frames_shape", what, what=f"{what} frames",
                              expected=f"[..., n_frames, {layout.image_tokens}]", got=list(frames.shape))
    if frames.shape[-2] > layout.max_frames:
        raise TerraInputError("too_many_frames", what, what=what, n=frames.shape[-2], limit=layout.max_frames,
                              why=f"a round is {layout.max_frames} frames")
    check_codes(frames, layout, lambda i: f"{what}{list(i)}", param=what)
    return frames.long()


def validate_actions(actions, layout: FrameLayout, n_frames: int | None = None) -> torch.Tensor:
    """Normalise actions to [n, action_tokens, action_dim] float32; TerraInputError names the problem.

    Accepts the flat form [n*6, 3], a stacked [n, 6, 3] tensor, or a list of [6, 3].
    With `n_frames`, at least that many frames of actions are required.
    """
    a, d = layout.action_tokens, layout.action_dim
    if isinstance(actions, (list, tuple)):
        if not actions:
            raise TerraInputError("wrong_action_shape", got="an empty list", expected=f"one [{a}, {d}] per frame")
        actions = [_as_tensor(x, f"actions item {i}") for i, x in enumerate(actions)]
        for i, x in enumerate(actions):
            if tuple(x.shape) != (a, d):
                raise TerraInputError("wrong_action_shape", got=f"item {i} of shape {list(x.shape)}",
                                      expected=f"[{a}, {d}] per frame")
        actions = torch.stack(actions)
    actions = _as_tensor(actions, "actions")
    if not (actions.dtype.is_floating_point or actions.dtype in (torch.int32, torch.int64)):
        raise TerraInputError("actions_not_numbers", what="actions", got=f"dtype {actions.dtype}")
    if actions.dim() == 2 and actions.shape[1] == d and actions.shape[0] % a == 0 and actions.shape[0] > 0:
        actions = actions.reshape(-1, a, d)
    if actions.dim() != 3 or tuple(actions.shape[1:]) != (a, d):
        raise TerraInputError("wrong_action_shape", got=list(actions.shape),
                              expected=f"[n_frames*{a}, {d}] or [n_frames, {a}, {d}]")
    actions = actions.float()
    _check_finite(actions)
    if n_frames is not None and actions.shape[0] < n_frames:
        raise TerraInputError("actions_missing", have=actions.shape[0], need=n_frames,
                              why="one row of actions follows every frame but the last generated one")
    return actions


def _check_finite(actions: torch.Tensor) -> None:
    """[..., frames, slots, dim] float actions are finite (values beyond float32 became inf)."""
    bad = ~torch.isfinite(actions)
    if bool(bad.any()):
        idx = torch.nonzero(bad)[0].tolist()
        raise TerraInputError("actions_not_finite", frame=idx[-3], slot=idx[-2])


def batched_actions(actions, batch_size: int, layout: FrameLayout, what: str = "input_ids") -> torch.Tensor:
    """Batched actions `[B, n*6, 3]` or `[B, n, 6, 3]` -> `[B, n, 6, 3]` (B may be 1 and is broadcast)."""
    a, d = layout.action_tokens, layout.action_dim
    actions = torch.as_tensor(actions)
    if actions.dim() == 3 and actions.shape[-1] == d and actions.shape[1] % a == 0:
        actions = actions.reshape(actions.shape[0], -1, a, d)
    if actions.dim() != 4 or tuple(actions.shape[2:]) != (a, d):
        raise TerraInputError("wrong_action_shape", got=list(actions.shape),
                              expected=f"[batch, n_frames*{a}, {d}] or [batch, n_frames, {a}, {d}]")
    if actions.shape[0] not in (1, batch_size):
        raise TerraInputError("batch_mismatch", have=actions.shape[0], what=what, batch=batch_size)
    return actions.expand(batch_size, *actions.shape[1:])


def _as_tensor(values, what: str) -> torch.Tensor:
    """`torch.as_tensor`, refusing data that is not numbers (str, None, ragged lists, ints beyond
    int64) by name instead of torch's TypeError/RuntimeError."""
    try:
        return torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise TerraInputError("actions_not_numbers", what=what, got=f"{type(values).__name__} ({e})") from None


# ---------------------------------------------------------------------------- rollouts
def rollout_inputs(context, actions, n_frames: int, layout: FrameLayout) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate and normalise rollout inputs -> (context [B, n_ctx, P] int64, actions [B, T, 6, 3] float32, batched).

    `context` is `[n_ctx, P]` (one rollout) or `[B, n_ctx, P]`; `actions` `[T, 6, 3]` / `[T*6, 3]`
    (shared by all rollouts) or `[B, T, 6, 3]`. At least `n_ctx + n_frames - 1` action rows are needed.
    """
    context = validate_codes(context, layout, "context")
    if context.dim() not in (2, 3):
        raise TerraInputError("frames_shape", what="context", got=list(context.shape),
                              expected=f"[n_ctx, {layout.image_tokens}] or [batch, n_ctx, {layout.image_tokens}]")
    batched = context.dim() == 3
    if not batched:
        context = context.unsqueeze(0)
    B, n_ctx = context.shape[:2]
    check_at_least("context frames", n_ctx, 1)
    check_at_least("n_frames", n_frames, 1)
    need = n_ctx + n_frames - 1
    actions = torch.as_tensor(actions) if not isinstance(actions, (list, tuple)) else actions
    if isinstance(actions, torch.Tensor) and actions.dim() == 4:
        if actions.shape[0] != B:
            raise TerraInputError("batch_mismatch", have=actions.shape[0], what="context", batch=B)
        actions = torch.stack([validate_actions(a, layout, n_frames=need) for a in actions])
    else:
        actions = validate_actions(actions, layout, n_frames=need).unsqueeze(0).expand(B, -1, -1, -1)
    return context, actions, batched

