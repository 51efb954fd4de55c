"""Comparing rollouts token by token, scoring the same tokens with both models, and reading a
rollout's prefix-cache hits step by step.

    token_parity(hf_frames, vllm_frames)          # free-running: counts, per-frame agreement, first mismatch
    teacher_forced_parity(hf, llm, context, frames, actions)   # both models score the same frames
    prefix_cache_steps(stats, n_ctx, n_frames, layout)   # one row per generate call
    GreedyParity(name, prompt_tokens, hf, vllm)   # one prompt of the porting notebooks (10, 13)

Pictures of frames are good for the eye, but equality is decided on the codes: two rollouts agree
when every code of every frame is the same id. That is the right check in float32, where HF and
vLLM compute the same logits up to summation order. In bfloat16 it is not: the two differ by
rounding (a few 1e-2 in logprob), and wherever the two best codes are closer than that, either may
win. One such near-tie that flips makes the next token's prefix differ, and from there on the two
rollouts are two different videos, however good the port. The teacher-forced comparison removes
that cascade: both models score the *same* tokens (one rollout, fed back as the prompt), so every
position is compared on an identical prefix: top-1 agreement, the largest logprob gap, and whether
each disagreement is a near-tie within the tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from terra_nb.port.layout import FrameLayout, TerraInputError, validate_actions, validate_codes
from terra_nb.port.rounds import plan_rounds

__all__ = ["GreedyParity", "TeacherForcedParity", "compare_teacher_forced", "predicted_reuse", "prefix_cache_steps", "teacher_forced_parity",
           "token_parity"]


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
        raise TerraInputError("frames_shape", what="rollouts", expected="[n_frames, P] or [B, n_frames, P]",
                              got=list(a.shape))
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


def prefix_cache_steps(stats, n_ctx: int, n_frames: int, layout: FrameLayout, overlap: int = 3,
                       block_size: int | None = None) -> list[dict[str, Any]]:
    """One row per `generate` call of a `vllm_rollout` (its `RolloutStats`): what was cached.

    Call k submits, for every rollout of the batch, the frames so far plus their action slots; the
    rounds (see `rollout.plan_rounds`) restart from the last `overlap` frames. Columns: `step`,
    `round`, `prompt_frames`, `prompt_tokens` (summed over the batch), `cached` (tokens served by
    the prefix cache: `RequestOutput.num_cached_tokens`), `computed` (prefilled in this call) and
    `hit_rate`. With the engine's KV `block_size`, also `predicted` (`predicted_reuse`): what a
    step inside a round should find cached; None for a round's first step.
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
        row = {"step": step, "round": rnd, "prompt_frames": n, "prompt_tokens": prompt,
               "cached": hit, "computed": prompt - hit, "hit_rate": round(hit / prompt, 3)}
        if block_size is not None:
            first_of_round = step == 0 or frames_per_call[step - 1][0] != rnd
            row["predicted"] = None if first_of_round else len(cached) * predicted_reuse(n - 1, layout, block_size)
        rows.append(row)
    return rows


def predicted_reuse(prev_frames: int, layout: FrameLayout, block_size: int) -> int:
    """Tokens the prefix cache serves to the next step of a rollout whose previous request had a
    prompt of `prev_frames` frames and generated one frame.

    The engine computed the previous prompt and every generated code but the last (the last was
    sampled, never fed back), and it caches full blocks only: the new prompt, which begins with
    all of that, finds `floor((prev_frames * F + P - 1) / block_size)` blocks. It does not depend
    on the action items being equal by luck: each item keeps its hash, so the blocks holding its
    slots match (a changed action would end the reuse at its block)."""
    computed = prev_frames * layout.frame_len + layout.image_tokens - 1
    return computed // block_size * block_size


@dataclass
class TeacherForcedParity:
    """HF and vLLM scoring the same generated frames, position by position (N = frames x P codes).

    For every code of the generated frames, both models give the logprobs of the next token after
    the same prefix. `gap` is the largest |HF - vLLM| over the ids vLLM returned there (its top-k
    and the scored token); `hf_margin` is HF's logprob of its own top-1 minus HF's logprob of
    vLLM's top-1 (0 where they agree): how far apart the two candidates are for HF.
    """

    frames: int
    image_tokens: int
    hf_top1: torch.Tensor
    """[N] HF's argmax at each scored position."""
    vllm_top1: torch.Tensor
    """[N] vLLM's rank-1 id at each scored position."""
    gap: torch.Tensor
    """[N] max |HF - vLLM| logprob over the ids vLLM returned at each position."""
    hf_margin: torch.Tensor
    """[N] HF logprob of HF's top-1 minus HF logprob of vLLM's top-1 (>= 0; 0 where they agree)."""
    hf_top2_margin: torch.Tensor
    """[N] HF's own top-1 minus top-2 logprob: how close to a tie each position is."""
    dtype: str
    tolerance: float
    max_excused: int | None = None
    """At most this many top-1 disagreements may be excused as near-ties (None: no bound). Where
    most positions are near-ties (random weights), every flip is excused; a bound measured on
    decisive logits (the trained toy model) is what lets the verdict fail there."""

    @property
    def positions(self) -> int:
        return int(self.hf_top1.numel())

    @property
    def top1_agree(self) -> int:
        return int((self.hf_top1 == self.vllm_top1).sum())

    @property
    def max_gap(self) -> float:
        return float(self.gap.max()) if self.positions else 0.0

    @property
    def disagreements(self) -> int:
        return self.positions - self.top1_agree

    @property
    def near_tie_disagreements(self) -> int:
        """Top-1 disagreements where HF's two candidates lie within the tolerance of each other."""
        differ = self.hf_top1 != self.vllm_top1
        return int((differ & (self.hf_margin <= self.tolerance)).sum())

    @property
    def passed(self) -> bool:
        """Every logprob within the tolerance, every top-1 disagreement a near-tie, and no more
        of those than `max_excused`."""
        within_bound = self.max_excused is None or self.near_tie_disagreements <= self.max_excused
        return self.max_gap <= self.tolerance and self.near_tie_disagreements == self.disagreements and within_bound

    def at(self, frame: int, index: int) -> dict[str, Any]:
        """The scores at code `index` of generated frame `frame` (e.g. a free-running first mismatch)."""
        if not (0 <= frame < self.frames and 0 <= index < self.image_tokens):
            raise ValueError(f"no code {index} of generated frame {frame} (have {self.frames} frames x {self.image_tokens})")
        i = frame * self.image_tokens + index
        return {"frame": frame, "index": index, "hf_top1": int(self.hf_top1[i]), "vllm_top1": int(self.vllm_top1[i]),
                "hf_margin": float(self.hf_margin[i]), "hf_top2_margin": float(self.hf_top2_margin[i]),
                "gap": float(self.gap[i])}

    def summary(self) -> dict[str, Any]:
        near = int((self.hf_top2_margin <= self.tolerance).sum())
        return {
            "dtype": self.dtype,
            "scored_codes": self.positions,
            "top1_agreement": f"{self.top1_agree}/{self.positions}",
            "top1_disagreements": self.disagreements,
            "of_which_near_ties": self.near_tie_disagreements,
            "max_abs_logprob_gap": round(self.max_gap, 6),
            "tolerance": self.tolerance,
            "positions_with_hf_top2_within_tolerance": near,
            "passed": self.passed,
        }


def reference_logprobs(lp: torch.Tensor, prompt_ids: list[int], k: int = 5):
    """Another scorer's `hf_prompt_logprobs` rows in the form vLLM returns prompt logprobs
    (`weight_mapping.VllmLogprobs`): at each position `p >= 1`, the top-`k` of row `p - 1` and the
    prompt token, with their ranks. `compare_teacher_forced` then compares two HF models, e.g. one
    in bfloat16 against the same weights in float32: what the dtype alone changes."""
    from terra_nb.lessons.weight_mapping import VllmLogprobs

    prompt, ranks = [None], [None]
    for p in range(1, len(prompt_ids)):
        row = lp[p - 1]
        keep = dict.fromkeys(row.topk(k).indices.tolist() + [int(prompt_ids[p])])
        prompt.append({t: float(row[t]) for t in keep})
        ranks.append({t: int((row > row[t]).sum()) + 1 for t in keep})
    return VllmLogprobs(list(prompt_ids), prompt, ranks, int(lp[-1].argmax()), {})


def compare_teacher_forced(hf_lp: torch.Tensor, vllm_lp, layout: FrameLayout, n_ctx: int, dtype: torch.dtype,
                           max_excused: int | None = None, tolerance: float | None = None) -> TeacherForcedParity:
    """Compare `weight_mapping.hf_prompt_logprobs` with `weight_mapping.vllm_prompt_logprobs` of the
    same prompt (`n_ctx` context frames, then the generated frames) on the generated frames' codes.

    vLLM's prompt position `p` (the distribution of token `p` given tokens before it) is HF's row
    `p - 1`. The tolerance is `hf_lessons.logit_tolerance(dtype)`, as in notebook 05's one-prompt check;
    `max_excused` bounds the near-tie disagreements the verdict accepts (see `TeacherForcedParity`);
    `tolerance` replaces the dtype's (e.g. one measured as bf16's own effect on this model).
    """
    from terra_nb.lessons.hf_lessons import logit_tolerance
    from terra_nb.lessons.weight_mapping import logprob_gap

    L, F, P = len(vllm_lp.prompt_ids), layout.frame_len, layout.image_tokens
    if hf_lp.shape[0] != L:
        raise ValueError(f"HF scored {hf_lp.shape[0]} positions, the vLLM prompt has {L}")
    n_frames = L // F - n_ctx
    if n_ctx < 1 or n_frames < 1 or L % F:
        raise ValueError(f"a prompt of {L} tokens ({L / F:g} frames) holds no generated frame after {n_ctx} context frames")
    pos = torch.tensor([(n_ctx + f) * F + j for f in range(n_frames) for j in range(P)])
    rows = hf_lp[pos - 1].float()
    hf_top1 = rows.argmax(-1)
    top2 = rows.topk(2, dim=-1).values
    vllm_top1 = torch.tensor([next(t for t, r in vllm_lp.ranks[p].items() if r == 1) for p in pos.tolist()])
    gap = torch.tensor([max(logprob_gap(float(rows[i, t]), lp) for t, lp in vllm_lp.prompt[p].items())
                        for i, p in enumerate(pos.tolist())])
    idx = torch.arange(len(pos))
    margin = rows[idx, hf_top1] - rows[idx, vllm_top1]
    return TeacherForcedParity(n_frames, P, hf_top1, vllm_top1, gap, margin, top2[:, 0] - top2[:, 1],
                               str(dtype).replace("torch.", ""),
                               logit_tolerance(dtype) if tolerance is None else float(tolerance), max_excused)


def teacher_forced_parity(hf_model, llm, context, frames, actions, k: int = 5,
                          max_excused: int | None = None, tolerance: float | None = None) -> TeacherForcedParity:
    """Both models score the same tokens: `context` `[n_ctx, P]` followed by `frames` `[n, P]` (e.g.
    HF's greedy rollout), with their action slots, as one prompt; compared on the codes of `frames`.

    `actions` `[T, 6, 3]` must cover the frames that have a successor in the prompt; a missing last
    item (a rollout needs `n_ctx + n - 1`) is filled with the one before it: the slots after the
    last frame come after every scored position, and attention is causal, so they change nothing
    scored. vLLM returns its top-`k` and the scored token at every position (`prompt_logprobs`).
    `max_excused`, `tolerance`: see `compare_teacher_forced`. The inputs are checked by Terra's
    rules (`layout`): codes `[n, P]` in range, one row of actions per frame but the last.
    """
    from terra_nb.lessons.weight_mapping import hf_prompt_logprobs, vllm_prompt_logprobs

    layout = FrameLayout.from_config(llm.model_config.hf_config)
    context, frames = (validate_codes(torch.as_tensor(x).cpu(), layout, what) for x, what in
                       ((context, "context"), (frames, "frames")))
    for x, what in ((context, "context"), (frames, "frames")):
        if x.dim() != 2:
            raise TerraInputError("frames_shape", what=f"{what} (of one rollout)",
                                  expected=f"[n_frames, {layout.image_tokens}]", got=list(x.shape))
    prompt = torch.cat([context, frames])
    actions = validate_actions(torch.as_tensor(actions).cpu(), layout, n_frames=prompt.shape[0] - 1)
    if actions.shape[0] < prompt.shape[0]:
        actions = torch.cat([actions, actions[-1:]])
    actions = actions[: prompt.shape[0]]
    hf_lp = hf_prompt_logprobs(hf_model, prompt, actions)
    vllm_lp = vllm_prompt_logprobs(llm, prompt, actions, k=k)
    return compare_teacher_forced(hf_lp, vllm_lp, layout, context.shape[0], next(hf_model.parameters()).dtype,
                                  max_excused, tolerance)


@dataclass
class GreedyParity:
    """HF's and vLLM's greedy tokens for one prompt of the porting notebooks (10, 13). Each port's
    lesson module subclasses it with what its rows also say about a prompt (TinyVLM: how many
    images; TinyAV: whether the items went in raw or already processed)."""

    name: str
    prompt_tokens: int
    hf: list[int]
    vllm: list[int]

    @property
    def equal_count(self) -> int:
        return sum(a == b for a, b in zip(self.hf, self.vllm))

    @property
    def equal(self) -> bool:
        return self.hf == self.vllm

    def columns(self) -> dict:
        """The subclass's own columns, placed after the prompt's name."""
        return {}

    def row(self) -> dict:
        return {"prompt": self.name, **self.columns(), "prompt tokens": self.prompt_tokens,
                "tokens equal": f"{self.equal_count} of {len(self.hf)}", "equal": self.equal}
