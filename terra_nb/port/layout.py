"""The token layout of a Terra sequence, the placeholder convention, and input validation.

One frame = `image_tokens` codes followed by `action_tokens` action slots (576 + 6 = 582 for
Terra); a round holds at most `max_frames` frames (25). Everything here is pure tensor logic
shared by the HF model, the vLLM port and the rollouts, so each check is written once.
"""
from __future__ import annotations

import array
from typing import Sequence

import numpy as np
import torch

from terra_nb.port.config import FrameLayout

SEED_PLACEHOLDER = -3
"""The seed marked action slots with -3; vLLM V1 needs an in-vocabulary id (see notebook 02)."""


def spatio_temporal_indices(positions: torch.Tensor, frame_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot within the frame and frame number of every absolute position (pos % 582, pos // 582)."""
    return positions % frame_len, torch.div(positions, frame_len, rounding_mode="floor")


def action_slot_mask(seq_len: int, layout: FrameLayout) -> torch.Tensor:
    """True where a position of an interleaved sequence holds an action vector."""
    slot, _ = spatio_temporal_indices(torch.arange(seq_len), layout.frame_len)
    return slot >= layout.image_tokens


def build_prompt(frames: torch.Tensor, layout: FrameLayout, placeholder: int | None = None) -> list[int]:
    """Image codes of `n` frames [n, image_tokens] -> token ids with action slots after every frame.

    `placeholder` defaults to the in-vocabulary id; pass SEED_PLACEHOLDER for the seed's form.
    """
    frames = torch.as_tensor(frames)
    if frames.dim() != 2 or frames.shape[1] != layout.image_tokens:
        raise ValueError(f"frames must have shape [n_frames, {layout.image_tokens}], got {list(frames.shape)}")
    ph = layout.placeholder_id if placeholder is None else placeholder
    slots = torch.full((frames.shape[0], layout.action_tokens), ph, dtype=torch.long)
    return torch.cat([frames.long(), slots], dim=1).flatten().tolist()


def token_array(token_ids: Sequence[int]) -> np.ndarray:
    """Token ids as a flat int64 array, converted once (a 24-frame prompt is 13968 ids); a
    ValueError for anything else (floats, nested lists, ints beyond int64, text). `array.array`
    is the fastest exact conversion of a Python list of ints."""
    if isinstance(token_ids, (torch.Tensor, np.ndarray)):
        arr = np.asarray(token_ids)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError(f"prompt token ids must be a flat list of ints, got {arr.dtype} of shape {list(arr.shape)}")
        return arr.astype(np.int64, copy=False)
    try:
        return np.frombuffer(array.array("q", token_ids), dtype=np.int64)
    except (TypeError, OverflowError):
        pass
    ids = _as_tensor(list(token_ids), "prompt token ids")  # names data that is not numbers at all
    raise ValueError(f"prompt token ids must be a flat list of ints, got {ids.dtype} of shape {list(ids.shape)}")


def from_seed_prompt(token_ids: Sequence[int], layout: FrameLayout) -> list[int]:
    """Convert a seed-style prompt (-3 in the action slots) to the in-vocabulary placeholder."""
    ids, _ = normalize_prompt(token_ids, layout, validate=False)
    return ids


def validate_prompt(token_ids: Sequence[int], layout: FrameLayout) -> int:
    """Check a placeholder prompt and return its number of frames; ValueError names the problem.

    Accepts -3 or the in-vocabulary id in the action slots.
    """
    _, n_frames = normalize_prompt(token_ids, layout)
    return n_frames


def normalize_prompt(token_ids: Sequence[int], layout: FrameLayout, validate: bool = True) -> tuple[list[int], int]:
    """Check a prompt (unless `validate=False`) and return it with -3 slots rewritten to the
    in-vocabulary placeholder, and its number of frames (complete frames when not validated).

    One conversion to an array and vectorised checks: this runs for every request of every frame
    step, so it must cost O(frames) Python work, not a Python loop over 14k ids.
    """
    ids = token_array(token_ids)
    if validate:
        _check_prompt(ids, layout)
    is_seed = ids == SEED_PLACEHOLDER
    if is_seed.any():
        return np.where(is_seed, layout.placeholder_id, ids).tolist(), ids.size // layout.frame_len
    out = token_ids if type(token_ids) is list else ids.tolist()
    return out, ids.size // layout.frame_len


def _check_prompt(ids: np.ndarray, layout: FrameLayout) -> None:
    n = ids.size
    if n == 0 or n % layout.frame_len:
        raise ValueError(
            f"prompt is not frame-aligned: {n} tokens is not a multiple of {layout.frame_len} "
            f"({layout.image_tokens} image codes + {layout.action_tokens} action slots per frame)"
        )
    n_frames = n // layout.frame_len
    if n_frames > layout.max_frames:
        raise ValueError(f"too many frames: the prompt has {n_frames}, the model allows {layout.max_frames}")
    grid = ids.reshape(n_frames, layout.frame_len)
    slots, codes = grid[:, layout.image_tokens:], grid[:, : layout.image_tokens]
    is_ph = (slots == SEED_PLACEHOLDER) | (slots == layout.placeholder_id)
    if not is_ph.all():
        f, s = np.argwhere(~is_ph)[0].tolist()
        raise ValueError(
            f"wrong action slots: frame {f} slot {s} holds {int(slots[f, s])}, expected "
            f"{SEED_PLACEHOLDER} or {layout.placeholder_id} in all {layout.action_tokens} slots of every frame"
        )
    bad = (codes < 0) | (codes >= layout.num_codes)
    if bad.any():
        f, p = np.argwhere(bad)[0].tolist()
        raise ValueError(
            f"image code out of range: frame {f} position {p} holds {int(codes[f, p])}, "
            f"codes must lie in 0..{layout.num_codes - 1}"
        )


def validate_codes(frames: torch.Tensor, layout: FrameLayout, what: str = "context") -> torch.Tensor:
    """Check image codes [..., n_frames, image_tokens] and return them as int64."""
    frames = torch.as_tensor(frames)
    if frames.dtype.is_floating_point:
        raise ValueError(f"{what} frames must hold integer codes, got dtype {frames.dtype}")
    if frames.dim() < 2 or frames.shape[-1] != layout.image_tokens:
        raise ValueError(
            f"{what} frames must have shape [..., n_frames, {layout.image_tokens}], got {list(frames.shape)}"
        )
    if frames.shape[-2] > layout.max_frames:
        raise ValueError(f"too many frames: {what} has {frames.shape[-2]}, the model allows {layout.max_frames}")
    bad = (frames < 0) | (frames >= layout.num_codes)
    if bool(bad.any()):
        v = int(frames[bad][0])
        raise ValueError(f"image code out of range in {what}: {v}; codes must lie in 0..{layout.num_codes - 1}")
    return frames.long()


def validate_actions(actions, layout: FrameLayout, n_frames: int | None = None) -> torch.Tensor:
    """Normalise actions to [n, action_tokens, action_dim] float32; ValueError names the problem.

    Accepts the seed's flat form [n*6, 3], a stacked [n, 6, 3] tensor, or a list of [6, 3].
    With `n_frames`, at least that many frames of actions are required.
    """
    a, d = layout.action_tokens, layout.action_dim
    if isinstance(actions, (list, tuple)):
        if not actions:
            raise ValueError("actions is an empty list")
        actions = [_as_tensor(x, f"actions item {i}") for i, x in enumerate(actions)]
        for i, x in enumerate(actions):
            if tuple(x.shape) != (a, d):
                raise ValueError(f"wrong action shape: item {i} has shape {list(x.shape)}, expected [{a}, {d}]")
        actions = torch.stack(actions)
    actions = _as_tensor(actions, "actions")
    if not (actions.dtype.is_floating_point or actions.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"actions must be numbers, got dtype {actions.dtype}")
    if actions.dim() == 2 and actions.shape[1] == d and actions.shape[0] % a == 0 and actions.shape[0] > 0:
        actions = actions.reshape(-1, a, d)
    if actions.dim() != 3 or tuple(actions.shape[1:]) != (a, d):
        raise ValueError(
            f"wrong action shape: got {list(actions.shape)}, expected [n_frames*{a}, {d}] or [n_frames, {a}, {d}]"
        )
    actions = actions.float()
    if not bool(torch.isfinite(actions).all()):
        raise ValueError("actions contain NaN or inf")
    if n_frames is not None and actions.shape[0] < n_frames:
        raise ValueError(f"actions cover {actions.shape[0]} frames but {n_frames} are needed")
    return actions


def _as_tensor(values, what: str) -> torch.Tensor:
    """`torch.as_tensor`, with a ValueError naming `what` for data that is not numbers (str, None,
    ragged lists, ints beyond int64) instead of torch's TypeError/RuntimeError."""
    try:
        return torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise ValueError(f"{what} could not be read as numbers ({type(values).__name__}: {e})") from None


def interleave_segments(past_len: int, n_codes: int, layout: FrameLayout) -> list[tuple[str, int, int]]:
    """How `n_codes` new image codes extend an interleaved sequence that already holds `past_len` positions.

    Returns the new positions in order as segments: ``("codes", i0, i1)`` is the slice
    ``codes[i0:i1]`` of the new codes, ``("actions", frame, frame)`` the action slots of that frame
    (`action_tokens` positions). A frame's action slots follow as soon as its last image code is
    in: after every complete frame of a prompt, and after the last code of a frame in a decode step.
    A sequence ending inside a frame's codes gets no action slots (the frame is still being made).
    `past_len` must end on an image position (the HF model never stops between action slots).
    """
    P, F = layout.image_tokens, layout.frame_len
    if past_len < 0 or n_codes < 0:
        raise ValueError(f"past_len and n_codes must be >= 0, got {past_len} and {n_codes}")
    slot = past_len % F
    if slot >= P:
        raise ValueError(
            f"the sequence ends inside the action slots of frame {past_len // F} (position {past_len}, slot {slot}); "
            f"a frame's {layout.action_tokens} action positions always come in together with its last image code"
        )
    segs: list[tuple[str, int, int]] = []
    frame, i = past_len // F, 0
    while i < n_codes:
        take = min(P - slot, n_codes - i)
        segs.append(("codes", i, i + take))
        i += take
        slot += take
        if slot == P:
            segs.append(("actions", frame, frame))
            frame, slot = frame + 1, 0
    return segs


def segments_length(segs: list[tuple[str, int, int]], layout: FrameLayout) -> int:
    """Number of positions the segments of `interleave_segments` occupy."""
    return sum(b - a if kind == "codes" else layout.action_tokens for kind, a, b in segs)


def codes_before(position: int, layout: FrameLayout) -> int:
    """How many image codes precede absolute `position` of an interleaved sequence (= codes in a cache of that length)."""
    frame, slot = divmod(position, layout.frame_len)
    return frame * layout.image_tokens + min(slot, layout.image_tokens)
