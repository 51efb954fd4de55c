"""Backend-agnostic rollouts: context frames + a trajectory -> new frames, in rounds of at most 25 frames.

The timeline of a rollout: frames `0 .. n_ctx-1` are the given context, frames `n_ctx ..
n_ctx+n_frames-1` are generated. Action row `f` (6 waypoints `(x, y, t)`) follows frame `f` in the
token sequence, so generating frame `f+1` consumes the actions of frames `<= f`; the actions of the
last generated frame are never used. A round holds at most `max_frames` (25) frames; when the
video outgrows it, a new round starts from the last `overlap` (3) frames, with positions restarting
at 0 (the public generator makes 47 frames = 3 context + 22 + 22 this way).

The backend hook (HF here, vLLM in `vllm_*.py`)::

    generate_round(window_frames [B, w, P] int64,
                   window_actions [B, w + n_new - 1, 6, 3] float32,
                   n_new: int) -> [B, n_new, P] int64 codes

`window_frames` start at position 0 of a fresh sequence; `window_actions[:, i]` belongs to window frame
`i` (and, past the window, to the new frames in order). The hook must generate the `n_new` frames
autoregressively, with frame `i`'s 6 action embeddings right after its last image code and every new
frame sampled starting from the last action position of the previous frame. `run_rollout` validates
all inputs before the first backend call (`layout.rollout_inputs`, here `prepare_inputs`) and
checks every round's output. The rounds are `rounds.plan_rounds`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .layout import FrameLayout, validate_codes
from .rounds import Round, plan_rounds
from .layout import rollout_inputs as prepare_inputs

__all__ = ["GenerateRound", "Round", "SamplingConfig", "hf_generate_kwargs", "hf_rollout", "plan_rounds",
           "prepare_inputs", "run_rollout"]

GenerateRound = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class SamplingConfig:
    """How codes are sampled, shared by the HF and vLLM backends.

    `temperature` 0 means greedy (argmax). `top_k` None or 0 = off, `top_p` 1.0 = off. `seed`
    makes sampling reproducible (None: not seeded). Defaults are the public generator's
    (temperature 0.9, no top-k, top-p 1.0). Only image codes are ever sampled: the id after them
    (bos/eos/pad, the vLLM placeholder) is masked out in both backends.
    """

    temperature: float = 0.9
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be None or >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def run_rollout(
    generate_round: GenerateRound,
    context,
    actions,
    n_frames: int,
    layout: FrameLayout,
    overlap: int = 3,
    progress: bool = True,
) -> torch.Tensor:
    """Generate `n_frames` new frames with a backend hook; return them `[B, n_frames, P]` (`[n_frames, P]` unbatched).

    Plans the rounds with `plan_rounds(n_ctx, n_frames, layout.max_frames, overlap)`, calls
    `generate_round(window_frames, window_actions, n_new)` once per round (all rollouts of the
    batch at once; see the module docstring for the hook's contract) and checks each result's shape
    and code range. Inputs are validated before any backend call.
    """
    context, actions, batched = prepare_inputs(context, actions, n_frames, layout)
    B, n_ctx = context.shape[:2]
    rounds = plan_rounds(n_ctx, n_frames, layout.max_frames, overlap)
    video = context.cpu()   # the frames are kept where each round's output lands (a GPU context too)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_frames, unit="frame", desc=f"rollout x{B}")
    try:
        for r in rounds:
            window = video[:, r.start : r.start + r.n_window]
            new = generate_round(window, actions[:, r.action_rows], r.n_new)
            new = torch.as_tensor(new).to("cpu")
            if tuple(new.shape) != (B, r.n_new, layout.image_tokens):
                raise ValueError(
                    f"backend returned shape {list(new.shape)} in round {r.index}, "
                    f"expected [{B}, {r.n_new}, {layout.image_tokens}]"
                )
            new = validate_codes(new.reshape(B * r.n_new, 1, -1), layout, f"round {r.index} output").reshape(new.shape)
            video = torch.cat([video, new], dim=1)
            if bar is not None:
                bar.update(r.n_new)
    finally:
        if bar is not None:
            bar.close()
    out = video[:, n_ctx:]
    return out if batched else out[0]


def hf_generate_kwargs(sampling: SamplingConfig, layout: FrameLayout) -> dict:
    """The `model.generate` arguments that implement a SamplingConfig (no EOS, only codes sampled)."""
    kw = dict(
        eos_token_id=None,  # exactly max_new_tokens codes, with no per-step EOS mask (min_new_tokens adds one)
        pad_token_id=layout.placeholder_id,
        suppress_tokens=[layout.placeholder_id],  # never sample the bos/eos/pad id as an image code
        use_cache=True,
    )
    if sampling.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=float(sampling.temperature),
                  top_k=int(sampling.top_k or 0),  # 0 = off (generate's own default would be 50)
                  top_p=float(sampling.top_p))
    return kw


def hf_rollout(
    model,
    context,
    actions,
    n_frames: int,
    sampling: SamplingConfig = SamplingConfig(),
    overlap: int = 3,
    progress: bool = True,
) -> torch.Tensor:
    """Roll out an HF `LlamaActionForCausalLM` (v1 or v2) with one `model.generate` call per round.

    Same inputs and output as `run_rollout`. Each round calls
    `model.generate(input_ids=window codes [B, w*P], actions=[B, w+n_new-1, 6, 3],
    max_new_tokens=n_new*P, eos_token_id=None, ...)` with the default DynamicCache. With
    `sampling.seed` set, the torch RNG is seeded inside a forked RNG state (the caller's global RNG
    is left as it was), so a seeded rollout is reproducible.
    """
    layout = FrameLayout.from_config(model.config)
    device = next(model.parameters()).device
    gen_kw = hf_generate_kwargs(sampling, layout)

    def generate_round(window: torch.Tensor, window_actions: torch.Tensor, n_new: int) -> torch.Tensor:
        B = window.shape[0]
        ids = window.reshape(B, -1).to(device)
        out = model.generate(
            input_ids=ids,
            actions=window_actions.to(device),
            max_new_tokens=n_new * layout.image_tokens,
            **gen_kw,
        )
        return out[:, ids.shape[1]:].reshape(B, n_new, layout.image_tokens).cpu()

    fork_devices = [device] if device.type == "cuda" else []
    with torch.inference_mode(), torch.random.fork_rng(devices=fork_devices):
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        return run_rollout(generate_round, context, actions, n_frames, layout, overlap, progress)
