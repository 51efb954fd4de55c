"""FP8 weights on the GPU machine: the toy model served with `quantization="fp8"` beside bf16.

    python3 tools/gpu_fp8.py OUT.json         # after the vLLM bundle is unpacked (docs/benchmarks.md)

Scores every variant with `bench.quality.measure_quality` (teacher-forced top-1 agreement with HF
float32, greedy path error) and compares the greedy codes of FP8 weights with bf16's, code for
code, on the same held-out clips. Writes one result file with its provenance.
"""
from __future__ import annotations

import json
import sys

FP8_WEIGHTS = dict(dtype="bfloat16", quantization="fp8", compilation_config={"custom_ops": ["+quant_fp8"]})
VARIANTS = {
    "bf16": dict(dtype="bfloat16"),
    "bf16_fp8w": FP8_WEIGHTS,
    "bf16_fp8w_fp8kv": dict(FP8_WEIGHTS, kv_cache_dtype="fp8"),
}
N_CLIPS, N_CONTEXT, N_FRAMES = 8, 3, 6


def greedy_codes(kwargs: dict, codes, actions):
    """Greedy codes of every clip's rollout from its context, under engine settings `kwargs`."""
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm, vllm_rollout
    from terra_nb.toyworld.score import toy_checkpoint_dir

    llm = make_llm(toy_checkpoint_dir(), gpu_memory_utilization=0.15, **kwargs)
    try:
        return vllm_rollout(llm, codes[:, :N_CONTEXT], actions[:, : N_CONTEXT + N_FRAMES - 1], N_FRAMES,
                            SamplingConfig(temperature=0), progress=False)
    finally:
        shutdown_llm(llm)


def main(out_path: str) -> None:
    from terra_nb.bench.quality import clips_for_scoring, measure_quality, quality_checks

    res = measure_quality(VARIANTS, n_clips=N_CLIPS, n_context=N_CONTEXT, n_frames=N_FRAMES)
    res["checks"] = [quality_checks(res, "bf16_fp8w", "bf16"), quality_checks(res, "bf16_fp8w_fp8kv", "bf16")]
    codes, actions = clips_for_scoring(N_CLIPS, N_CONTEXT, N_FRAMES)
    try:
        base, fp8 = greedy_codes(VARIANTS["bf16"], codes, actions), greedy_codes(FP8_WEIGHTS, codes, actions)
        res["greedy_codes_fp8w_vs_bf16"] = dict(codes=int(base.numel()), equal=int((base == fp8).sum()),
                                                share=round(float((base == fp8).float().mean()), 5))
    except Exception as e:  # noqa: BLE001  (an engine this machine cannot run is the finding)
        res["greedy_codes_fp8w_vs_bf16"] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
    res["command"] = "python3 tools/gpu_fp8.py " + out_path
    with open(out_path, "w") as f:
        json.dump(res, f, indent=2, default=str)
    print(json.dumps({k: res[k] for k in ("device", "versions", "checks", "greedy_codes_fp8w_vs_bf16")}, default=str))
    for name, row in res["variants"].items():
        print(name, {k: row.get(k) for k in ("top1_agreement", "ade_m", "error")})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8_toy.json")
