"""How a rollout of many frames is split into generate calls ("rounds"): a helper of Terra's layout,
not a rule. The bounds it checks refuse through `layout`'s rules (`out_of_bounds`, `too_many_frames`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .layout import TerraInputError, check_at_least

__all__ = ["Round", "first_round", "next_round", "plan_rounds"]


@dataclass(frozen=True)
class Round:
    """One generate call: the window is video frames `start .. start+n_window-1`; it adds `n_new` frames."""

    index: int
    start: int
    n_window: int
    n_new: int

    @property
    def action_rows(self) -> slice:
        """Rows of the rollout's actions this round consumes (`n_window + n_new - 1` rows)."""
        return slice(self.start, self.start + self.n_window + self.n_new - 1)

    @property
    def end(self) -> int:
        """Frames of the video once this round is done."""
        return self.start + self.n_window + self.n_new


def first_round(n_ctx: int, max_frames: int = 25, overlap: int = 3) -> Round:
    """The first round of a video of `n_ctx` context frames: the whole context as its window, filled
    up to `max_frames` frames (its `n_new`: the most it can make)."""
    check_at_least("context frames", n_ctx, 1)
    if n_ctx >= max_frames:
        raise TerraInputError("too_many_frames", "context", what="the context", n=n_ctx, limit=max_frames - 1,
                              why=f"a round is {max_frames} frames and one is left for a new frame")
    if not 1 <= overlap < max_frames:
        raise TerraInputError("out_of_bounds", "overlap", what="overlap", bound=f"in 1..{max_frames - 1}",
                              value=overlap)
    return Round(0, 0, n_ctx, max_frames - n_ctx)


def next_round(done: Round, max_frames: int = 25, overlap: int = 3) -> Round:
    """The round after `done` (a full one): its window is the video's last `overlap` frames, filled
    up to `max_frames` frames. The one rollover rule: rollouts plan by it (`plan_rounds`), and a
    session driven a frame at a time (`serve.WorldSession`) rolls over by it."""
    return Round(done.index + 1, done.end - overlap, overlap, max_frames - overlap)


def plan_rounds(n_ctx: int, n_frames: int, max_frames: int = 25, overlap: int = 3) -> list[Round]:
    """Split the generation of `n_frames` new frames after `n_ctx` context frames into rounds.

    The first round's window is the whole context; each later one is the last `overlap` frames of the
    video so far. Every round fills its window up to `max_frames` frames (fewer in the last round).
    `plan_rounds(3, 44)` -> rounds (start 0, window 3, 22 new) and (start 22, window 3, 22 new):
    a 47-frame video.
    """
    check_at_least("n_frames", n_frames, 1)
    full, rounds, left = first_round(n_ctx, max_frames, overlap), [], n_frames
    while True:
        rounds.append(replace(full, n_new=min(left, full.n_new)))
        left -= rounds[-1].n_new
        if left <= 0:
            return rounds
        full = next_round(full, max_frames, overlap)
