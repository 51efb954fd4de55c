"""Notebook 01's checks on the HF model, as functions: parameter counts by group, one forward pass
traced with hooks, the decode schedule of `generate` (this port's rule and the seed's), and the
check that KV-cache decoding equals recomputation without a cache.

Everything here *observes* `terra_nb.port.hf_model` (hooks, `generate`, plain forwards); nothing
re-implements the model. The seed's decode rule is written out (`decode_schedule(rule="seed")`)
only to show where its logits came from.

Cached vs recomputed, in one forward: the logits that `generate` produced at decode step `j`
(with a KV cache) must equal the logits of the *uncached* model over the same prefix. A causal
model's logits at position `p` depend only on positions `<= p`, so one uncached forward over the
whole generated sequence yields the recomputed logits of every step at once (row `pos(c) - 1`
predicts code `c`); `cached_vs_recomputed` uses that and also recomputes a few steps prefix by
prefix to show the two agree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch
from matplotlib.figure import Figure

from terra_nb.workbook.checkpoints import weight_shapes
from terra_nb.port.layout import FrameLayout
from terra_nb.port.interleave import interleave_segments, segments_length
from terra_nb.port.rollout import SamplingConfig, hf_generate_kwargs
from terra_nb.workbook.show import text_table
from terra_nb.workbook.viz import ACTION_COLOR, DPI, IMAGE_COLOR, _save

__all__ = [
    "LOGIT_TOLERANCE",
    "CacheCheck",
    "DecodeStep",
    "action_sensitivity",
    "cached_vs_recomputed",
    "code_positions",
    "decode_schedule",
    "logit_tolerance",
    "parameter_groups",
    "plot_position_indices",
    "plot_step_differences",
    "text_table",
    "trace_forward",
]

LOGIT_TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-2, torch.bfloat16: 2.5e-1}
"""Largest max-abs logit difference accepted between two computations of the same logits.

float32: the two paths differ only in summation order (~1e-6 on the tiny model; on a GPU too,
because `make_llm` asks Triton for full-fp32 dot products in float32 engines, see vllm_rollout).
bfloat16/float16: 8/11 mantissa bits; K/V rounded once when cached and attention kernels that
depend on the query length (one token vs the whole prefix) move logits of magnitude ~1 by a few
1e-2 after 22 layers. The bound is absolute on logits; a check also reports the logit scale.
"""


def logit_tolerance(dtype: torch.dtype) -> float:
    """The accepted max-abs logit difference for a model computing in `dtype` (see LOGIT_TOLERANCE)."""
    if dtype not in LOGIT_TOLERANCE:
        raise ValueError(f"no tolerance for dtype {dtype}; known: {sorted(map(str, LOGIT_TOLERANCE))}")
    return LOGIT_TOLERANCE[dtype]


# --------------------------------------------------------------------------- architecture


def parameter_groups(config, variant: str | None = None) -> dict[str, int]:
    """Parameters by group, from the released weight names and shapes (`checkpoints.weight_shapes`).

    Groups: token embedding, decoder layers (attention, MLP, norms, summed over layers), final norm,
    lm_head, the two position tables, the action projection. The values sum to `count_parameters`.
    """
    groups = {
        "token embedding (model.embed_tokens)": 0,
        "attention (q, k, v, o) x layers": 0,
        "MLP (gate, up, down) x layers": 0,
        "RMSNorms": 0,
        "lm_head": 0,
        "position tables (spatio + temporal)": 0,
        "action projection": 0,
    }
    for name, shape in weight_shapes(config, variant).items():
        n = math.prod(shape)
        if name.startswith("model.embed_tokens"):
            key = "token embedding (model.embed_tokens)"
        elif ".self_attn." in name:
            key = "attention (q, k, v, o) x layers"
        elif ".mlp." in name:
            key = "MLP (gate, up, down) x layers"
        elif name.endswith("norm.weight"):
            key = "RMSNorms"
        elif name.startswith("lm_head"):
            key = "lm_head"
        elif name.startswith("pos_embedding_spatio_temporal"):
            key = "position tables (spatio + temporal)"
        elif name.startswith("action_projection"):
            key = "action projection"
        else:  # pragma: no cover - weight_shapes has no other names
            raise ValueError(f"unexpected weight {name}")
        groups[key] += n
    return groups


def trace_forward(model, **forward_kwargs) -> dict[str, Any]:
    """Run one real `model(**forward_kwargs)` and return what its parts saw, in call order.

    Forward hooks on `model.embed_tokens`, `action_projection`, `pos_embedding_spatio_temporal`,
    the Llama backbone and `lm_head` record their inputs and outputs; the result (a dict of
    tensors, for `show.show_shapes`) also holds the call's inputs and its `loss` if labels were given.
    """
    out: dict[str, Any] = {k: v for k, v in forward_kwargs.items() if torch.is_tensor(v)}
    hooks = []

    def rec(key_in: str | None, key_out: str | None):
        def hook(module, args, kwargs, output):
            if key_in is not None:
                x = kwargs.get("inputs_embeds", args[0] if args else None)
                out[key_in] = x.detach()
            if key_out is not None:
                y = getattr(output, "last_hidden_state", output)
                out[key_out] = y.detach()
        return hook

    spec = [
        (model.model.embed_tokens, None, "token_embeddings"),
        (model.action_projection, "action_projection.in", "action_projection.out"),
        (model.pos_embedding_spatio_temporal, "positions", "position_embeddings"),
        (model.model, "inputs_embeds (interleaved)", "hidden_states"),
        (model.lm_head, None, "logits"),
    ]
    try:
        for module, k_in, k_out in spec:
            hooks.append(module.register_forward_hook(rec(k_in, k_out), with_kwargs=True))
        with torch.no_grad():
            result = model(**forward_kwargs)
    finally:
        for h in hooks:
            h.remove()
    if getattr(result, "loss", None) is not None:
        out["loss"] = result.loss.detach()
    return out


# --------------------------------------------------------------------------- positions and decode steps


def code_positions(code_index, layout: FrameLayout) -> torch.Tensor:
    """Position in the interleaved sequence of image code number `code_index` (counting codes only).

    Code `c` is slot `c % P` of frame `c // P`: position `(c // P) * frame_len + c % P`. The logits
    that predict code `c` sit one position earlier (the last action slot when `c` starts a frame).
    """
    c = torch.as_tensor(code_index)
    return torch.div(c, layout.image_tokens, rounding_mode="floor") * layout.frame_len + c % layout.image_tokens


@dataclass(frozen=True)
class DecodeStep:
    """One forward of `generate`: what it feeds, where its logits are read, what they sample."""

    step: int
    cache_before: int
    fed: str
    n_positions: int
    logits_at: int
    samples: str
    actions_seen: int
    """Frames whose action slots lie at or before `logits_at` (how much of the plan the sample saw)."""

    def as_row(self) -> dict[str, Any]:
        return {"step": self.step, "cache": self.cache_before, "fed": self.fed, "positions": self.n_positions,
                "logits at": self.logits_at, "samples": self.samples, "actions seen": self.actions_seen}


def _describe(segs, layout: FrameLayout) -> str:
    parts = []
    for kind, a, b in segs:
        if kind == "codes":
            parts.append("code" if b - a == 1 else f"{b - a} codes")
        else:
            parts.append(f"{layout.action_tokens} actions (frame {a})")
    return " + ".join(parts)


def decode_schedule(n_ctx: int, n_new: int, layout: FrameLayout, rule: str = "port") -> list[DecodeStep]:
    """The forwards of `generate` for `n_ctx` context frames and `n_new` new codes.

    Step 0 is the prefill (the context codes, each frame followed by its actions); step `j >= 1`
    feeds the newest code. The logits of step `j` sample code `n_ctx * P + j`.

    * `rule="port"` (terra_nb, `hf_model`): the step that feeds the *last* code of a frame appends
      that frame's action slots in the same forward (`interleave.interleave_segments`), so the next
      frame's first code is sampled at the last action slot, as in training and in vLLM.
    * `rule="seed"`: the seed waited until the cache held a whole frame of codes and then put the
      actions *in front of* the next fed code. The step feeding the last code of a frame therefore
      read its logits at that code: the next frame's first code was sampled before the frame's
      actions were in the sequence (the off-by-one).
    """
    if rule not in ("port", "seed"):
        raise ValueError(f"rule must be 'port' or 'seed', got {rule!r}")
    P, F, A = layout.image_tokens, layout.frame_len, layout.action_tokens
    steps: list[DecodeStep] = []
    segs = interleave_segments(0, n_ctx * P, layout)
    past, n = 0, segments_length(segs, layout)
    fed = f"{n_ctx} frame{'s' if n_ctx != 1 else ''}: codes + actions"
    for j in range(n_new):
        if j > 0:
            past += n
            if rule == "port":
                segs = interleave_segments(past, 1, layout)
                n, fed = segments_length(segs, layout), _describe(segs, layout)
            elif past % F == P:  # the seed: a whole frame of codes is cached -> prepend its actions
                n, fed = A + 1, f"{A} actions (frame {past // F}) + code"
            else:
                n, fed = 1, "code"
        c = n_ctx * P + j
        at = past + n - 1
        steps.append(DecodeStep(j, past, fed, n, at, f"frame {c // P} code {c % P}", (at + 1) // F))
    return steps


# --------------------------------------------------------------------------- the seed's off-by-one, measured


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def action_sensitivity(model, codes: torch.Tensor, actions_a: torch.Tensor, actions_b: torch.Tensor,
                       frame: int) -> dict[str, float]:
    """How much the logits that sample the first code of frame `frame + 1` change when frame
    `frame`'s actions change (`actions_a` vs `actions_b`, identical elsewhere), under both rules.

    `codes` [B, >= (frame + 1) * P] image codes. The port samples that code at the last action slot
    of `frame`; the seed sampled it at the last image code of `frame` (`decode_schedule`). Returns
    the max-abs logit change at each of those positions: the seed's is exactly 0, since its
    logits were computed before the new actions entered the sequence.
    """
    layout = model.layout
    P, F = layout.image_tokens, layout.frame_len
    dev = _device(model)
    ids = torch.as_tensor(codes)[:, : (frame + 1) * P].to(dev)
    la = model(input_ids=ids, actions=actions_a.to(dev)).logits.float()
    lb = model(input_ids=ids, actions=actions_b.to(dev)).logits.float()
    port_row, seed_row = (frame + 1) * F - 1, frame * F + P - 1
    return {
        "port": float((la[:, port_row] - lb[:, port_row]).abs().max()),
        "seed": float((la[:, seed_row] - lb[:, seed_row]).abs().max()),
    }


# --------------------------------------------------------------------------- cached vs recomputed


@dataclass
class CacheCheck:
    """Result of `cached_vs_recomputed` (tensors on the CPU)."""

    step_diff: torch.Tensor
    """[n_steps] max over batch and vocabulary of |cached - recomputed| logits, per decode step."""
    n_ctx: int
    n_frames: int
    image_tokens: int
    dtype: torch.dtype
    tolerance: float
    logit_scale: float
    """max |logit| over the recomputed logits (what the tolerance is measured against)."""
    greedy_mismatches: int
    """Steps whose generated code is not the argmax of the recomputed logits (placeholder id masked).
    0 in float32; in bfloat16 a near-tie (two logits closer than the rounding noise) may flip."""
    tokens: torch.Tensor
    prefix_checks: dict[int, float] = field(default_factory=dict)
    """step -> max |cached - logits of an uncached forward over exactly that prefix| (spot checks)."""

    @property
    def n_steps(self) -> int:
        return int(self.step_diff.numel())

    @property
    def boundary_steps(self) -> list[int]:
        """Decode steps whose logits were read after actions were appended in that same decode
        step: they sample the first code of every generated frame after the first."""
        return [j for j in range(1, self.n_steps) if j % self.image_tokens == 0]

    @property
    def greedy_agrees(self) -> bool:
        return self.greedy_mismatches == 0

    @property
    def max_diff(self) -> float:
        return float(self.step_diff.max())

    @property
    def passed(self) -> bool:
        return self.max_diff <= self.tolerance and all(d <= self.tolerance for d in self.prefix_checks.values())

    def summary(self) -> dict[str, Any]:
        b = self.boundary_steps
        return {
            "dtype": str(self.dtype).replace("torch.", ""),
            "context_frames": self.n_ctx,
            "generated_frames": self.n_frames,
            "decode_steps_checked": self.n_steps,
            "frame_boundaries_in_decode": len(b),
            "max_abs_logit_diff": self.max_diff,
            "max_abs_logit_diff_at_boundaries": float(self.step_diff[b].max()) if b else None,
            "logit_scale": self.logit_scale,
            "tolerance": self.tolerance,
            "greedy_steps_disagreeing": self.greedy_mismatches,
            "passed": self.passed,
        }


@torch.no_grad()
def cached_vs_recomputed(model, context: torch.Tensor, actions: torch.Tensor, n_frames: int,
                         prefix_steps: Iterable[int] = (), chunk: int = 256) -> CacheCheck:
    """Generate `n_frames` frames greedily with the KV cache and compare every step's logits with
    the uncached model's.

    `context` [B, n_ctx, P] (or [n_ctx, P]) codes, `actions` [B or 1, >= n_ctx + n_frames - 1, 6, 3].
    `model.generate(..., output_logits=True)` gives the cached logits of each step (raw, before
    any logits processor). One uncached forward over the context plus all generated codes but the
    last gives the recomputed logits of every step (causality); `prefix_steps` are additionally
    recomputed one prefix at a time. Memory: the logits of all steps are kept ([B, steps, V]
    float32), the comparison runs in chunks of `chunk` steps.
    """
    layout = model.layout
    P = layout.image_tokens
    dev = _device(model)
    context = torch.as_tensor(context)
    if context.dim() == 2:
        context = context[None]
    B, n_ctx = context.shape[:2]
    ids = context.reshape(B, -1).to(dev)
    actions = torch.as_tensor(actions).to(dev)
    n_steps = n_frames * P
    gen = model.generate(
        input_ids=ids, actions=actions, max_new_tokens=n_steps, output_logits=True,
        return_dict_in_generate=True, **hf_generate_kwargs(SamplingConfig(temperature=0), layout),
    )
    seq = gen.sequences
    cached = gen.logits  # tuple of [B, V], one per step
    del gen
    full = model(input_ids=seq[:, :-1], actions=actions).logits  # uncached, every position
    first = n_ctx * P
    rows = (code_positions(torch.arange(first, first + n_steps), layout) - 1).to(full.device)
    diffs, mismatches, scale = [], 0, 0.0
    for s in range(0, n_steps, chunk):
        e = min(s + chunk, n_steps)
        rec = full[:, rows[s:e]].float()
        cac = torch.stack(cached[s:e], dim=1).float().to(rec.device)
        diffs.append((cac - rec).abs().amax(dim=(0, 2)).cpu())
        scale = max(scale, float(rec.abs().max()))
        rec[..., layout.placeholder_id] = float("-inf")  # generate suppresses it; only codes are sampled
        mismatches += int((rec.argmax(-1) != seq[:, first + s: first + e]).any(dim=0).sum())
    prefix_checks = {}
    for j in prefix_steps:
        logits = model(input_ids=seq[:, : first + j], actions=actions).logits[:, -1].float()
        prefix_checks[int(j)] = float((logits - cached[j].float().to(logits.device)).abs().max())
    dtype = next(model.parameters()).dtype
    return CacheCheck(
        step_diff=torch.cat(diffs), n_ctx=n_ctx, n_frames=n_frames, image_tokens=P, dtype=dtype,
        tolerance=logit_tolerance(dtype), logit_scale=scale, greedy_mismatches=mismatches,
        tokens=seq[:, first:].cpu(), prefix_checks=prefix_checks,
    )


# --------------------------------------------------------------------------- figures


def plot_position_indices(layout: FrameLayout, n_frames: int = 3, save=None) -> Figure:
    """Spatial slot `pos % frame_len` (a sawtooth) and temporal index `pos // frame_len` (a staircase)
    of every position of `n_frames` frames, action slots in orange."""
    F, P = layout.frame_len, layout.image_tokens
    pos = np.arange(n_frames * F)
    slot, frame = pos % F, pos // F
    act = slot >= P
    fig = Figure(figsize=(9, 3.6), dpi=DPI, layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for ax, y, label in ((ax1, slot, f"spatial row\npos % {F}"), (ax2, frame, f"temporal row\npos // {F}")):
        ax.scatter(pos[~act], y[~act], s=2, color=IMAGE_COLOR, label=f"image code ({P} per frame)")
        ax.scatter(pos[act], y[act], s=6, color=ACTION_COLOR, label=f"action slot ({layout.action_tokens} per frame)")
        ax.set_ylabel(label, fontsize=9)
        for f in range(1, n_frames):
            ax.axvline(f * F - 0.5, color="0.8", lw=0.8, zorder=0)
    ax2.set_yticks(range(n_frames))
    ax2.set_xlabel("absolute position p in the interleaved sequence")
    ax1.legend(fontsize=8, loc="upper left", markerscale=3)
    ax1.set_title(f"embedding(p) = spatio[p % {F}] + temporal[p // {F}]  "
                  f"({F} + {layout.max_frames} rows, first {n_frames} frames shown)", fontsize=10)
    return _save(fig, save)


def plot_step_differences(check: CacheCheck, save=None, floor: float = 1e-9) -> Figure:
    """Max |cached - recomputed| logit difference of every decode step (log scale), with frame
    boundaries and the tolerance; exact zeros are drawn at `floor`."""
    d = check.step_diff.double().clamp_min(floor).numpy()
    steps = np.arange(len(d))
    fig = Figure(figsize=(9, 3.2), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.semilogy(steps, d, lw=0.8, color=IMAGE_COLOR, label="max |cached - recomputed| per step")
    b = check.boundary_steps
    if b:
        ax.scatter(b, d[b], color=ACTION_COLOR, zorder=3, s=28,
                   label="first code of a frame (actions appended in that decode step)")
    ax.scatter([0], d[:1], color="k", zorder=3, s=20, label="step 0 (prefill)")
    for j in range(check.image_tokens, len(d), check.image_tokens):
        ax.axvline(j - 0.5, color="0.75", lw=0.8, zorder=0)
    ax.axhline(check.tolerance, color="#C44E52", ls="--", lw=1, label=f"tolerance {check.tolerance:g}")
    ax.set_ylim(floor / 2, max(check.tolerance, float(d.max())) * 20)
    ax.set_xlabel(f"decode step (one new code each; {check.image_tokens} per frame)")
    ax.set_ylabel(f"max abs logit diff\n(0 drawn at {floor:g})", fontsize=9)
    ax.set_title(f"KV-cache decoding vs recomputation, {check.n_frames} frames, {str(check.dtype).replace('torch.', '')}",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper center", ncol=2, bbox_to_anchor=(0.5, -0.22), frameon=False)
    return _save(fig, save)
