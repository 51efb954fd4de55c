"""Comparing rollouts token by token, and reading a rollout's prefix-cache hits step by step.

    token_parity(hf_frames, vllm_frames)          # counts, per-frame agreement, first mismatch
    prefix_cache_steps(stats, n_ctx, n_frames, layout)   # one row per generate call

Pictures of frames are good for the eye, but equality is decided on the codes: two rollouts agree
when every code of every frame is the same id.
"""
from __future__ import annotations

from typing import Any

import torch

from .config import FrameLayout
from .rollout import plan_rounds

__all__ = ["prefix_cache_steps", "token_parity"]


def token_parity(reference, other) -> dict[str, Any]:
    """Compare two rollouts of the same shape (`[n_frames, P]` or `[B, n_frames, P]`) code by code.

    Returns `tokens` (compared), `equal`, `mismatches`, `identical`, `frames`,
    `equal_per_frame` (equal codes of each frame, summed over rollouts), and `first_mismatch`
    (`{"rollout", "frame", "index"}` of the first differing code in frame order, or None).
    """
    a, b = torch.as_tensor(reference).cpu(), torch.as_tensor(other).cpu()
    if a.shape != b.shape:
        raise ValueError(f"rollouts differ in shape: {list(a.shape)} vs {list(b.shape)}")
    if a.dim() == 2:
        a, b = a[None], b[None]
    if a.dim() != 3:
        raise ValueError(f"rollouts must be [n_frames, P] or [B, n_frames, P], got {list(a.shape)}")
    same = a == b
    first = None
    if not bool(same.all()):
        # frame-major order: the earliest frame where any rollout differs, then the rollout, then the code
        f, r, i = (~same).permute(1, 0, 2).nonzero()[0].tolist()
        first = {"rollout": r, "frame": f, "index": i}
    return {
        "frames": a.shape[1],
        "tokens": a.numel(),
        "equal": int(same.sum()),
        "mismatches": int((~same).sum()),
        "identical": first is None,
        "equal_per_frame": same.sum(dim=(0, 2)).tolist(),
        "first_mismatch": first,
    }


def prefix_cache_steps(stats, n_ctx: int, n_frames: int, layout: FrameLayout, overlap: int = 3) -> list[dict[str, Any]]:
    """One row per `generate` call of a `vllm_rollout` (its `RolloutStats`): what was cached.

    Call k submits, for every rollout of the batch, the frames so far plus their action slots; the
    rounds (see `rollout.plan_rounds`) restart from the last `overlap` frames. Columns: `step`,
    `round`, `prompt_frames`, `prompt_tokens` (summed over the batch), `cached` (tokens served by
    the prefix cache: `RequestOutput.num_cached_tokens`), `computed` (prefilled in this call) and
    `hit_rate`.
    """
    rounds = plan_rounds(n_ctx, n_frames, layout.max_frames, overlap)
    frames_per_call = [(r.index, r.n_window + k) for r in rounds for k in range(r.n_new)]
    calls = stats.per_call_cached
    if len(calls) != len(frames_per_call):
        raise ValueError(
            f"the stats hold {len(calls)} generate calls, a rollout of {n_frames} frames after {n_ctx} "
            f"makes {len(frames_per_call)}: pass a fresh RolloutStats to each rollout"
        )
    rows = []
    for step, ((rnd, n), cached) in enumerate(zip(frames_per_call, calls)):
        prompt = n * layout.frame_len * len(cached)
        hit = sum(cached)
        rows.append({"step": step, "round": rnd, "prompt_frames": n, "prompt_tokens": prompt,
                     "cached": hit, "computed": prompt - hit, "hit_rate": round(hit / prompt, 3)})
    return rows
