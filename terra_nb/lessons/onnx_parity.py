"""Checking the ONNX graph against the HF model: logits step by step, and timing both on the CPU.

    rows = logit_steps(decoder, hf, context, actions, codes)   # one row per decoding step
    summary = summarize_steps(rows)                            # the worst step, at frame boundaries too
    ms = ms_per_token(lambda: onnx_rollout(...), n_tokens)     # median wall time per generated code

`logit_steps` is teacher-forced: both backends get the same codes (e.g. HF's greedy rollout), so a
difference in one step cannot change what the next step sees, and every step is compared, the
prefill and the frame-boundary steps (a code + 6 action slots) included.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.onnx.rollout import OnnxDecoder, step_inputs

__all__ = ["load_reference", "logit_steps", "ms_per_token", "plot_logit_steps", "summarize_steps"]


def load_reference(checkpoint: str | Path, dtype="auto", device: str = "cpu"):
    """The HF model of a checkpoint folder, in eval mode, without the weight-loading progress bar."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).to(device).eval()
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _step_kind(feed: dict, layout: FrameLayout) -> str:
    n = feed["position_ids"].shape[1]
    if n == 1:
        return "code"
    if n == 1 + layout.action_tokens and int(feed["position_ids"][0, 0]) % layout.frame_len == layout.image_tokens - 1:
        return f"code + {layout.action_tokens} actions"
    return "prefill"


def logit_steps(decoder: OnnxDecoder, model, context, actions, codes) -> list[dict]:
    """Feed the context, then `codes` one at a time, to the ONNX graph and to HF; compare each step.

    `context` `[n_ctx, P]`, `actions` `[T, 6, 3]`, `codes` `[n, P]` (frames following the context in
    one round). Rows: `step`, `kind` (prefill / code / code + 6 actions), `positions`, `frame` (of
    the code sampled from this step's logits), `max_abs_diff` of the last-position logits, and
    whether both argmaxes agree.
    """
    from transformers.cache_utils import DynamicCache

    layout = decoder.layout
    context, codes = torch.as_tensor(context).long(), torch.as_tensor(codes).long()
    acts = torch.as_tensor(actions).float()[None]
    stream = codes.reshape(-1)
    chunks = [context.reshape(1, -1)] + [stream[i: i + 1][None] for i in range(stream.numel() - 1)]
    past, cache, past_len, rows = decoder.empty_cache(1), DynamicCache(), 0, []
    with torch.inference_mode():
        for step, chunk in enumerate(chunks):
            feed = step_inputs(chunk, acts, past_len, layout)
            ort_logits, past = decoder.step(feed, past)
            hf_logits = model(input_ids=chunk.to(model.device), actions=acts.to(model.device),
                              past_key_values=cache, logits_to_keep=1).logits[:, -1].float().cpu().numpy()
            n = feed["position_ids"].shape[1]
            rows.append({"step": step, "kind": _step_kind(feed, layout),
                         "positions": f"{past_len}..{past_len + n - 1}",
                         "frame": (past_len + n) // layout.frame_len,
                         "max_abs_diff": float(np.abs(ort_logits - hf_logits).max()),
                         "argmax_equal": bool((ort_logits.argmax(-1) == hf_logits.argmax(-1)).all())})
            past_len += n
    return rows


def summarize_steps(rows: list[dict]) -> dict:
    """The worst step overall, in the prefill, in plain code steps and at frame boundaries."""
    def worst(keep: Callable[[str], bool]) -> float:
        vals = [r["max_abs_diff"] for r in rows if keep(r["kind"])]
        return max(vals) if vals else float("nan")

    at_boundary = lambda kind: kind.startswith("code + ")  # noqa: E731
    return {"steps": len(rows), "max_abs_diff": max(r["max_abs_diff"] for r in rows),
            "prefill": worst(lambda kind: kind == "prefill"), "code_steps": worst(lambda kind: kind == "code"),
            "frame_boundary_steps": worst(at_boundary),
            "boundaries": sum(at_boundary(r["kind"]) for r in rows),
            "argmax_equal": sum(r["argmax_equal"] for r in rows)}


def plot_logit_steps(rows: list[dict], tolerance: float, save=None):
    """max |ONNX - HF| of every step on a log scale, frame-boundary steps marked, the tolerance drawn."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.8))
    steps = [r["step"] for r in rows]
    ax.semilogy(steps, [max(r["max_abs_diff"], 1e-9) for r in rows], lw=0.8, label="max |ONNX - HF| (logits)")
    marks = [r for r in rows if r["kind"] != "code"]
    ax.scatter([r["step"] for r in marks], [max(r["max_abs_diff"], 1e-9) for r in marks], color="C3", s=18,
               zorder=3, label="prefill / code + action slots")
    ax.axhline(tolerance, color="grey", ls=":", label=f"tolerance {tolerance:g}")
    ax.set_ylim(top=tolerance * 20)  # room for the legend above the tolerance line
    ax.set_xlabel("decoding step (one onnxruntime call each)")
    ax.set_ylabel("max abs diff")
    ax.legend(fontsize=7, loc="upper right", ncol=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if save is not None:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save, dpi=110)
    return fig


def ms_per_token(fn: Callable[[], object], n_tokens: int, repeats: int = 5) -> dict:
    """Wall time of `fn()` per generated token (ms) over `repeats` runs after one warm-up.

    `ms_per_token` is the best run, the one least disturbed by other processes on a shared
    machine; the median is kept beside it.
    """
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    best, median = min(times), statistics.median(times)
    return {"tokens": n_tokens, "repeats": repeats, "ms_per_token": round(1000 * best / n_tokens, 3),
            "ms_per_token_median": round(1000 * median / n_tokens, 3)}
