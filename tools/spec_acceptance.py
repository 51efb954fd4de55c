"""Frame copy's acceptance, counted by vLLM and simulated, on the same clips (a one-off check of
`terra_nb.bench.faster.frame_copy_acceptance`; notebook 12 reads its file with `faster.acceptance_rows`).

    python3 tools/spec_acceptance.py --out results/faster/cpu_spec_acceptance_toy.json

Greedy rollouts of the toy model by HF (the reference codes) and by a vLLM engine with frame copy,
statistics on; runs on the CPU in a few minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from terra_nb.bench.faster import frame_copy_acceptance, workload_inputs


def spec_counters(llm) -> dict:
    """vLLM's spec-decode totals of a `vllm.LLM` now (`settings.engine_counters`) and its accepted
    drafts per position (`spec_decode_num_accepted_tokens_per_pos`, a vector)."""
    from terra_nb.bench.settings import engine_counters

    out = dict(engine_counters(llm), accepted_per_pos=[])
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = [int(v) for v in m.values]
    return out


def _delta(before: Mapping, after: Mapping) -> dict:
    pos = [a - b for a, b in zip(after["accepted_per_pos"], before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"]))]
    return dict({k: int(after[k] - before[k]) for k in after if k != "accepted_per_pos"}, accepted_per_pos=pos)


def acceptance_run(k: int = 8, n_clips: int = 8, n_frames: int = 12, n_context: int = 3) -> dict:
    """Frame copy's acceptance, counted by vLLM and simulated, on the same clips: the GPU plans' toy
    workload (`workload_inputs`) and the toy world's held-out clips (`eval_clips`), each rolled out
    greedily by HF (the reference codes) and by a vLLM engine with frame copy (`k` drafts at most,
    statistics on). Per clip: vLLM's counter deltas (`spec_counters`), `frame_copy_acceptance` on
    HF's codes, and whether vLLM's codes equal HF's. Runs on the CPU in a few minutes."""
    import torch

    from terra_nb.port.rollout import SamplingConfig, hf_rollout
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm, vllm_rollout
    from terra_nb.toyworld.score import eval_clips, load_toy_model, toy_checkpoint_dir
    from terra_nb.workbook.show import environment_info

    wl = workload_inputs(n_context)
    clips = [("GPU toy workload", wl.sample.context, wl.sample.actions)]
    for c in eval_clips(n_clips, n_context, n_frames):
        clips.append((c.kind, torch.from_numpy(wl.tokenizer.encode(c.frames[:n_context])), torch.from_numpy(c.actions)))
    greedy, hf = SamplingConfig(temperature=0.0), load_toy_model()
    llm = make_llm(toy_checkpoint_dir(), speculative_k=k, disable_log_stats=False)
    rows = []
    try:
        for name, ctx, actions in clips:
            ref = hf_rollout(hf, ctx, actions, n_frames, sampling=greedy, progress=False).cpu()
            before = spec_counters(llm)
            got = vllm_rollout(llm, ctx, actions, n_frames, greedy, progress=False).cpu()
            sim = frame_copy_acceptance(np.concatenate([ctx.numpy(), ref.numpy()]), k, n_context, int(actions.shape[-2]))
            rows.append(dict(clip=name, vllm=_delta(before, spec_counters(llm)), simulated=sim,
                             codes_equal=int((got == ref).sum()), codes=int(ref.numel())))
    finally:
        shutdown_llm(llm)
    env = environment_info()
    return dict(kind="spec_acceptance", k=k, n_context=n_context, n_frames=n_frames, device=env["device"],
                versions={key: env[key] for key in ("vllm", "torch", "python")}, commit=env["git_commit"], clips=rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python3 tools/spec_acceptance.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--clips", type=int, default=8)
    ap.add_argument("--frames", type=int, default=12)
    a = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    args = sys.argv[1:] if argv is None else argv
    res = dict(acceptance_run(a.k, a.clips, a.frames), command="python3 tools/spec_acceptance.py " + shlex.join(args))
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
