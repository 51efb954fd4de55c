"""A vLLM engine for a TinyGPTWorld checkpoint: fp32, token-id prompts, the frame table's length."""
from __future__ import annotations

import json
import os
from pathlib import Path


def llm_kwargs(checkpoint_dir: str | Path, **overrides) -> dict:
    """`vllm.LLM` arguments: float32 (vLLM's "auto" gives bf16 on the CPU), no tokenizer (prompts
    are token ids), `max_model_len` = the frames the frame table covers. On the CPU backend also a
    small memory share and eager mode (a tiny model starts in seconds instead of compiling); on a
    GPU vLLM's defaults, and for a float32 model full-fp32 attention. `overrides` go over all of these."""
    from vllm.platforms import current_platform

    config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    kwargs = dict(model=str(checkpoint_dir), dtype="float32", skip_tokenizer_init=True,
                  max_model_len=config["frame_len"] * config["max_frames"], seed=0)
    if current_platform.is_cpu():
        kwargs.update(gpu_memory_utilization=0.2, max_num_seqs=8, enforce_eager=True)
    kwargs.update(overrides)
    if not current_platform.is_cpu() and kwargs.get("dtype") == "float32":
        # Triton's attention multiplies float32 in TF32 by default: exact fp32 for parity with HF.
        os.environ["TRITON_F32_DEFAULT"] = "ieee"
    return kwargs


def make_llm(checkpoint_dir: str | Path, **overrides):
    import vllm

    return vllm.LLM(**llm_kwargs(checkpoint_dir, **overrides))


def greedy(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy token ids after each prompt (token ids in, token ids out)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
