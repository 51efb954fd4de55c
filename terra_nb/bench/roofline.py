"""The memory floor of a rollout: the time no engine change can beat.

Each decode step (one new code for every rollout) reads every weight it multiplies by (all but the
embedding tables, of which it only gathers rows) and every rollout's KV cache so far. Those bytes
over the memory bandwidth are the least time the step can take: Terra's decode is far below the
GPU's compute at these batches, so this floor, not arithmetic, bounds it. At batch 1 the weights
dominate (about 3 GB a step in bf16, mostly the 262,145-code output layer), at 128 rollouts deep
into the 25-frame window the KV caches do. An engine change that removes work outside the model
(the frame loop's re-submitted prompts, the sessions) can at most close the gap between a measured
rollout and its floor, never go under it.
"""
from __future__ import annotations

import math

from terra_nb.workbook.checkpoints import head_dim, weight_shapes
from terra_nb.port.layout import FrameLayout

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}
"""Peak memory bandwidth from NVIDIA's data sheets (SXM parts: H100 80 GB HBM3, H200 141 GB HBM3e).
A spec, not a measurement: real kernels reach part of it, so the floor is optimistic."""


def bandwidth_of(device: str) -> float:
    """The data-sheet bandwidth of a device named as torch names it, e.g. 'NVIDIA H100 80GB HBM3'."""
    for key, bw in HBM_BYTES_PER_S.items():
        if key in device:
            return bw
    raise ValueError(f"no memory bandwidth on record for {device!r}; known: {sorted(HBM_BYTES_PER_S)}")


def streamed_weight_bytes(config, dtype_bytes: int = 2) -> int:
    """Bytes of the weights one decode step reads in full: every weight but the embedding tables."""
    shapes = weight_shapes(config)
    return dtype_bytes * sum(math.prod(s) for name, s in shapes.items() if "embed" not in name)


def kv_bytes_per_token(config, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token holds: keys and values, every layer, every KV head."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim(config) * dtype_bytes


def decode_step_floor_s(config, batch: int, context_tokens: float, bandwidth: float, dtype_bytes: int = 2) -> float:
    """The least time one decode step of `batch` rollouts can take, each with `context_tokens` tokens
    in its KV cache: the weights once and every rollout's cache, over `bandwidth` (bytes/s)."""
    if batch < 1 or context_tokens < 0:
        raise ValueError(f"batch must be >= 1 and context_tokens >= 0, got {batch}, {context_tokens}")
    return (streamed_weight_bytes(config, dtype_bytes) + batch * context_tokens * kv_bytes_per_token(config, dtype_bytes)) / bandwidth


def rollout_floor_s(config, batch: int, n_ctx: int, n_frames: int, bandwidth: float, dtype_bytes: int = 2) -> float:
    """The least time `batch` rollouts of `n_frames` generated frames after `n_ctx` context frames
    can take: the sum, over every code of every generated frame, of one decode step's bytes
    (weights once, each rollout's KV cache up to that code) over `bandwidth` (bytes/s)."""
    if batch < 1 or n_ctx < 1 or n_frames < 1:
        raise ValueError(f"batch, n_ctx and n_frames must be >= 1, got {batch}, {n_ctx}, {n_frames}")
    steps = FrameLayout.from_config(config).image_tokens * n_frames
    # a step's floor is linear in its context, so the sum over the steps is their count times the
    # floor of a step at their mean context
    return steps * decode_step_floor_s(config, batch, mean_context_tokens(config, n_ctx, n_frames), bandwidth,
                                       dtype_bytes)


def mean_context_tokens(config, n_ctx: int, n_frames: int) -> float:
    """The KV-cache length of one rollout's decode step, averaged over every code of `n_frames`
    generated frames after `n_ctx` context frames: code j of frame f attends to the f whole frames
    before it (codes and action slots) and the j codes of its own before it."""
    if n_ctx < 1 or n_frames < 1:
        raise ValueError(f"n_ctx and n_frames must be >= 1, got {n_ctx}, {n_frames}")
    layout = FrameLayout.from_config(config)
    P, L = layout.image_tokens, layout.frame_len
    return sum(P * f * L + P * (P - 1) // 2 for f in range(n_ctx, n_ctx + n_frames)) / (P * n_frames)


def floor_frames_per_s(config, batch: int, n_ctx: int, n_frames: int, device: str, dtype_bytes: int = 2) -> float:
    """Frames per second (all rollouts together) at the memory floor on `device`."""
    return batch * n_frames / rollout_floor_s(config, batch, n_ctx, n_frames, bandwidth_of(device), dtype_bytes)

