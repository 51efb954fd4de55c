"""The toy world on the GPU machine: the trained toy checkpoint served by vLLM there (the path
notebook 08 takes with device="cuda"), its action-following score and steering, and HF parity.

    python3 tools/gpu_toy.py [out.json]       # after the vLLM bundle is unpacked (README, GPU section)
"""
from __future__ import annotations

import json
import platform
import sys
import time

import numpy as np
import torch

N_CLIPS, N_CTX, N_FRAMES = 16, 3, 12


def main(out_path: str) -> None:
    import transformers
    import vllm

    from terra_nb.lessons.parity import token_parity
    from terra_nb.toyworld import (ToyTokenizer, action_following_score, as_rollout_fn, end_errors, eval_clips,
                                   load_toy_model, random_toy_model, toy_checkpoint_dir)
    from terra_nb.toyworld.demo import steering_rollouts
    from terra_nb.toyworld.workbook import engine_rollout_fn
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm

    t0 = time.time()
    llm = make_llm(toy_checkpoint_dir(), gpu_memory_utilization=0.3)
    start_s = time.time() - t0
    fn, tok = engine_rollout_fn(llm), ToyTokenizer.load()

    clips = eval_clips(4, N_CTX, N_FRAMES)
    ctx = torch.from_numpy(np.stack([tok.encode(c.frames[:N_CTX]) for c in clips]))
    acts = torch.from_numpy(np.stack([c.actions[: N_CTX + N_FRAMES - 1] for c in clips]))
    parity = token_parity(as_rollout_fn(load_toy_model(device="cuda"))(ctx, acts, N_FRAMES).cpu(), fn(ctx, acts, N_FRAMES))

    t0 = time.time()
    rows = action_following_score({"trained (vLLM)": fn, "random weights (HF)": random_toy_model(0)},
                                  N_CLIPS, N_CTX, N_FRAMES, tokenizer=tok)
    score_s = time.time() - t0
    steer = end_errors(steering_rollouts(fn, n_context=N_CTX, n_frames=N_FRAMES, tokenizer=tok))
    shutdown_llm(llm)
    result = {
        "device": torch.cuda.get_device_name(0), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "vllm": vllm.__version__, "dtype": "float32",
        "shapes": {"clips": N_CLIPS, "context_frames": N_CTX, "generated_frames": N_FRAMES, "codes_per_frame": 64},
        "command": "python3 tools/gpu_toy.py " + out_path,
        "engine_start_s": round(start_s, 1), "score_seconds": round(score_s, 1),
        "hf_vs_vllm_greedy": parity, "score": rows, "steering": steer,
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(json.dumps({k: result[k] for k in ("device", "vllm", "engine_start_s", "score_seconds")}))
    print("parity:", {k: parity[k] for k in ("tokens", "equal", "identical")})
    for r in rows:
        print(f"{r['model']:>52}  ade {r['ade_m']:.3f}  fde {r['fde_m']:.3f}")
    for r in steer[1:]:
        print(f"{r['command']:>16} follows: {r['follows']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu_toy.json")
