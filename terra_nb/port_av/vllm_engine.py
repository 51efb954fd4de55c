"""A vLLM engine for a TinyAV checkpoint, and a request with items in either form."""
from __future__ import annotations

import os
from pathlib import Path


def llm_kwargs(checkpoint_dir: str | Path, **overrides) -> dict:
    """The `vllm.LLM` arguments for a TinyAV folder: fp32 (parity with HF), the items per prompt
    the model declares (`vllm_processing.LIMIT_MM_PER_PROMPT`), `enable_mm_embeds=True` (without it
    vLLM refuses items passed already processed: "You must set `--enable-mm-embeds` to input
    `audio_embeds`"; it lets requests hand tensors to the model, so the parser checks them), and on
    the CPU the small settings of TinyVLM's engine (eager, no chunked prefill, a 512-token step);
    on a GPU vLLM's defaults, with full-fp32 attention for a float32 model as TinyVLM's engine."""
    from vllm.platforms import current_platform

    from .vllm_processing import LIMIT_MM_PER_PROMPT

    kwargs = dict(model=str(checkpoint_dir), dtype="float32", max_model_len=512,
                  limit_mm_per_prompt=dict(LIMIT_MM_PER_PROMPT), enable_mm_embeds=True, seed=0)
    if current_platform.is_cpu():
        kwargs.update(gpu_memory_utilization=0.2, max_num_seqs=8, enable_chunked_prefill=False,
                      max_num_batched_tokens=512, block_size=32, enforce_eager=True)
    kwargs.update(overrides)
    if not current_platform.is_cpu() and kwargs.get("dtype") == "float32":
        os.environ["TRITON_F32_DEFAULT"] = "ieee"  # exact fp32 attention (Triton's default is TF32)
    return kwargs


def make_llm(checkpoint_dir: str | Path, **overrides):
    """`vllm.LLM(**llm_kwargs(checkpoint_dir, **overrides))`; call `vllm_plugin.register()` first."""
    import vllm

    return vllm.LLM(**llm_kwargs(checkpoint_dir, **overrides))


def request(text: str, images=None, audio=None) -> dict:
    """A prompt for `llm.generate`. `images` / `audio`: a list of raw items, or a dict of the HF
    processor's output tensors for that modality (passed to the model as it is)."""
    data = {k: v for k, v in (("image", images), ("audio", audio)) if v is not None and len(v)}
    return {"prompt": text, "multi_modal_data": data} if data else {"prompt": text}
