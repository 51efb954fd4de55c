"""How large a Terra engine is, and what fits it: sizing helpers, with the checks an engine's
settings and its longest prompt must pass (refused through `layout`'s rules: `too_many_frames`,
`max_model_len`, `out_of_bounds`).
"""
from __future__ import annotations

from .layout import FrameLayout, TerraInputError

__all__ = ["check_engine_frames", "check_engine_prompt_frames", "check_max_model_len", "engine_limit_why",
           "max_prompt_frames"]


def max_prompt_frames(layout: FrameLayout, max_model_len: int) -> int:
    """Most frames a prompt may hold so that one more frame can still be generated.

    A round holds at most `max_frames` frames (25), so a prompt holds at most 24; a shorter
    `max_model_len` lowers that: the prompt plus `image_tokens` new codes must fit.
    """
    return max(0, min(layout.max_frames - 1, (max_model_len - layout.image_tokens) // layout.frame_len))


def engine_limit_why(layout: FrameLayout, max_model_len: int) -> str:
    """Why an engine of `max_model_len` takes prompts of at most `max_prompt_frames` frames."""
    return (f"a round is {layout.max_frames} frames of {layout.frame_len} tokens and the last one is generated; "
            f"max_model_len {max_model_len}")


def check_engine_prompt_frames(n_frames: int, layout: FrameLayout, max_model_len: int, what: str = "the prompt",
                               param: str = "prompt_token_ids", why: str | None = None) -> None:
    """A prompt (or a rollout's longest prompt) of `n_frames` frames fits an engine of `max_model_len`."""
    limit = max_prompt_frames(layout, max_model_len)
    if n_frames > limit:
        raise TerraInputError("too_many_frames", param, what=what, n=n_frames, limit=limit,
                              why=why or engine_limit_why(layout, max_model_len))


def check_max_model_len(max_model_len: int, layout: FrameLayout) -> None:
    """An engine's `max_model_len` fits the temporal embedding's `max_frames` frames."""
    if max_model_len > layout.max_len:
        raise TerraInputError("max_model_len", value=max_model_len, max_len=layout.max_len,
                              max_frames=layout.max_frames, frame_len=layout.frame_len)


def check_engine_frames(max_frames: int, layout: FrameLayout) -> int:
    """`make_llm(max_frames=...)`: an engine's round length lies in 2..`layout.max_frames`."""
    if not 2 <= max_frames <= layout.max_frames:
        raise TerraInputError("out_of_bounds", "max_frames", what="max_frames", bound=f"in 2..{layout.max_frames}",
                              value=max_frames)
    return max_frames
