"""How an interleaving backend (the HF model, the ONNX rollout) lays codes and action slots along
positions: a helper of Terra's layout, not a rule.

A frame is `image_tokens` codes followed by `action_tokens` action slots; the spatio-temporal
position embedding reads a position's slot in its frame and its frame number. The HF model builds
its own sequence from image codes and actions, step by step: `interleave_segments` says which new
positions are codes and which are a frame's action slots, `interleave_step` checks one forward step
by the rules of `layout` (`sequence_too_long`, `actions_missing`, ...).
"""
from __future__ import annotations

import torch

from .layout import FrameLayout, TerraInputError, batched_actions

__all__ = ["action_slot_mask", "codes_before", "interleave_segments", "interleave_step", "segments_length",
           "spatio_temporal_indices"]


def spatio_temporal_indices(positions: torch.Tensor, frame_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot within the frame and frame number of every absolute position (pos % 582, pos // 582)."""
    return positions % frame_len, torch.div(positions, frame_len, rounding_mode="floor")


def action_slot_mask(seq_len: int, layout: FrameLayout) -> torch.Tensor:
    """True where a position of an interleaved sequence holds an action vector."""
    slot, _ = spatio_temporal_indices(torch.arange(seq_len), layout.frame_len)
    return slot >= layout.image_tokens


def codes_before(position: int, layout: FrameLayout) -> int:
    """How many image codes precede absolute `position` of an interleaved sequence (= codes in a cache of that length)."""
    frame, slot = divmod(position, layout.frame_len)
    return frame * layout.image_tokens + min(slot, layout.image_tokens)


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
    for name, value in (("past_len", past_len), ("n_codes", n_codes)):
        if value < 0:
            raise TerraInputError("out_of_bounds", name, what=name, bound=">= 0", value=value)
    slot = past_len % F
    if slot >= P:
        raise TerraInputError("ends_in_action_slots", frame=past_len // F, position=past_len, slot=slot,
                              action_tokens=layout.action_tokens)
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


def interleave_step(past_len: int, n_codes: int, layout: FrameLayout, actions=None, batch_size: int = 1):
    """One forward step of an interleaving backend (HF, ONNX): the segments, their length, and the
    actions as `[B, n, 6, 3]` (None when the step completes no frame).

    Checks the step fits in a round (`sequence_too_long`) and that every frame it completes has
    its actions (`actions_missing`).
    """
    segs = interleave_segments(past_len, n_codes, layout)
    length = segments_length(segs, layout)
    if past_len + length > layout.max_len:
        raise TerraInputError("sequence_too_long", first=past_len, last=past_len + length - 1, max_len=layout.max_len,
                              max_frames=layout.max_frames, frame_len=layout.frame_len)
    done = [a for kind, a, _ in segs if kind == "actions"]
    if not done:
        return segs, length, None
    acts = None if actions is None else batched_actions(actions, batch_size, layout)
    have = 0 if acts is None else acts.shape[1]
    if have <= done[-1]:
        raise TerraInputError("actions_missing", have=have, need=done[-1] + 1,
                              why=f"frame {done[-1]} is complete and needs its actions")
    return segs, length, acts
