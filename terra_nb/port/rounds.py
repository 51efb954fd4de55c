"""How a rollout of many frames is split into generate calls ("rounds"): a helper of Terra's layout,
not a rule. The bounds it checks refuse through `layout`'s rules (`out_of_bounds`, `too_many_frames`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .layout import TerraInputError, check_at_least

__all__ = ["Round", "plan_rounds"]


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


def plan_rounds(n_ctx: int, n_frames: int, max_frames: int = 25, overlap: int = 3) -> list[Round]:
    """Split the generation of `n_frames` new frames after `n_ctx` context frames into rounds.

    The first round's window is the whole context; each later one is the last `overlap` frames of the
    video so far. Every round fills its window up to `max_frames` frames (fewer in the last round).
    `plan_rounds(3, 44)` -> rounds (start 0, window 3, 22 new) and (start 22, window 3, 22 new):
    a 47-frame video.
    """
    check_at_least("context frames", n_ctx, 1)
    check_at_least("n_frames", n_frames, 1)
    if n_ctx >= max_frames:
        raise TerraInputError("too_many_frames", "context", what="the context", n=n_ctx, limit=max_frames - 1,
                              why=f"a round is {max_frames} frames and one is left for a new frame")
    if not 1 <= overlap < max_frames:
        raise TerraInputError("out_of_bounds", "overlap", what="overlap", bound=f"in 1..{max_frames - 1}",
                              value=overlap)
    rounds, start, window, video, left = [], 0, n_ctx, n_ctx, n_frames
    while left > 0:
        n_new = min(left, max_frames - window)
        rounds.append(Round(len(rounds), start, window, n_new))
        video += n_new
        left -= n_new
        start, window = video - overlap, overlap
    return rounds
