"""Where float32 HF vs vLLM differences come from on a GPU: run notebook 05's one-prompt parity
(tiny preset, float32) and print the largest |HF - vLLM| prompt logprob.

    TRITON_F32_DEFAULT=tf32 python tools/fp32_gpu_probe.py  # Triton's default: TF32 dot products
    python tools/fp32_gpu_probe.py                          # make_llm's choice for fp32: ieee

Seen on an H200 (vLLM 0.26, before make_llm set `ieee` itself, so "unset" meant TF32):
3.0e-4 with TF32, 9.5e-7 with `ieee`, top-1 209/209 both times. The difference came from TF32
in vLLM's Triton attention kernels, not from the port (`make_llm(..., fp32_attention="ieee")`).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def main() -> int:
    from transformers import AutoModelForCausalLM

    import terra_nb  # noqa: F401  (registers the HF classes)
    from terra_nb.lessons.weight_mapping import compare_logprobs, hf_prompt_logprobs, vllm_prompt_logprobs
    from terra_nb.workbook.checkpoints import write_random_checkpoint
    from terra_nb.port.vllm_rollout import make_llm
    from terra_nb.workbook.data import load_sample

    n_frames = 3
    ckpt = write_random_checkpoint(Path(tempfile.mkdtemp()) / "tiny", "tiny", device="cpu")
    sample = load_sample("tiny")
    context = sample.context[:n_frames]
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype="auto").to("cuda").eval()
    hf_lp = hf_prompt_logprobs(hf, context, sample.actions)
    layout, dtype = hf.layout, hf.dtype
    del hf
    llm = make_llm(ckpt, max_frames=n_frames + 1)
    v = vllm_prompt_logprobs(llm, context, sample.actions, k=5)
    p = compare_logprobs(hf_lp, v, layout, dtype)
    print(json.dumps({"TRITON_F32_DEFAULT": os.environ.get("TRITON_F32_DEFAULT", "(unset)"),
                      **{k: p.summary()[k] for k in ("dtype", "max_abs_logprob_diff", "top1_agreement",
                                                     "next_token_hf", "next_token_vllm")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
