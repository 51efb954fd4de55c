"""A vLLM engine for a TinyVLM checkpoint, and the request / counter helpers the workbook uses."""
from __future__ import annotations

import os
from pathlib import Path


def llm_kwargs(checkpoint_dir: str | Path, **overrides) -> dict:
    """The keyword arguments `make_llm` passes to `vllm.LLM` for a TinyVLM folder: fp32 (vLLM's
    "auto" would give bf16 on the CPU), prefix caching on, statistics on (for the cache counters),
    and the items per prompt the model declares (`vllm_processing.LIMIT_MM_PER_PROMPT`: TinyVLM's
    2 images), so that this file copies unchanged for a model with other modalities.

    On the CPU backend also a small KV-cache share, chunked prefill off (as `make_llm` of Terra's
    port, for the same reasons), eager mode (no torch.compile: seconds instead of a minute for a
    model this small) and 32-token KV blocks (the smallest the CPU attention takes), so that short prompts fill whole blocks the prefix
    cache can reuse. On a GPU vLLM's defaults, and for a float32 model full-fp32 attention (as
    Terra's `make_llm`). `overrides` go over all of these.
    """
    from vllm.platforms import current_platform

    from .vllm_processing import LIMIT_MM_PER_PROMPT

    kwargs = dict(
        model=str(checkpoint_dir),
        dtype="float32",
        enable_prefix_caching=True,
        disable_log_stats=False,
        max_model_len=512,
        limit_mm_per_prompt=dict(LIMIT_MM_PER_PROMPT),  # a copy: the model's constant stays as declared
        seed=0,
    )
    if current_platform.is_cpu():
        # On the CPU the share is of the NUMA node's memory, less what this process already holds:
        # 0.05 (0.72 of 14.5 GiB here) left a negative KV cache in a kernel or test worker that had
        # loaded torch and an HF model first ("requested memory for kv (-0.03/0.72 GiB)"). 0.2, as
        # `make_llm` uses for Terra.
        kwargs.update(gpu_memory_utilization=0.2, max_num_seqs=8, enable_chunked_prefill=False,
                      max_num_batched_tokens=512, block_size=32, enforce_eager=True)
    kwargs.update(overrides)
    if not current_platform.is_cpu() and kwargs.get("dtype") == "float32":
        # Triton's attention multiplies float32 in TF32 by default: exact fp32 for parity with HF.
        # Engine processes inherit it; it must be set before the engine starts.
        os.environ["TRITON_F32_DEFAULT"] = "ieee"
    return kwargs


def make_llm(checkpoint_dir: str | Path, **overrides):
    """`vllm.LLM(**llm_kwargs(checkpoint_dir, **overrides))`."""
    import vllm

    return vllm.LLM(**llm_kwargs(checkpoint_dir, **overrides))


# Why each argument of `llm_kwargs` is there, for `llm_call_text`'s comments.
KWARG_NOTES = {
    "model": "the checkpoint folder: config.json, safetensors, tokenizer, processor config",
    "dtype": 'fp32 for exact parity with HF ("auto" would pick bf16 on the CPU)',
    "enable_prefix_caching": "reuse the KV blocks of a prompt that starts the same",
    "disable_log_stats": "statistics on: the prefix- and processor-cache counters come from them",
    "max_model_len": "the longest prompt + output a request may have",
    "limit_mm_per_prompt": "at most this many images per prompt; also sizes the start-up profiling",
    "seed": "the sampler's seed",
    "gpu_memory_utilization": "the share of device memory (on the CPU: of host memory) vLLM may take",
    "max_num_seqs": "requests scheduled together",
    "enable_chunked_prefill": "off: a prompt is prefilled in one step (as Terra's CPU engines)",
    "max_num_batched_tokens": "tokens one engine step may process",
    "block_size": "tokens per KV-cache block; the prefix cache reuses whole blocks",
    "enforce_eager": "no torch.compile / CUDA graphs: a fast start for a tiny model",
    "worker_extension_cls": "a class mixed into the worker (here: counts images encoded)",
}


def llm_call_text(kwargs: dict, root: str | Path | None = None) -> str:
    """`kwargs` as the `vllm.LLM(...)` call it makes, one argument a line, each with its reason;
    a `model` path under `root` is shown relative to it."""
    lines = ["llm = vllm.LLM("]
    for k, v in kwargs.items():
        if k == "model" and root is not None and Path(v).is_relative_to(root):
            v = str(Path(v).relative_to(root))
        arg = f"    {k}={v!r},"
        note = KWARG_NOTES.get(k)
        lines.append(f"{arg:<47} # {note}" if note else arg)
    return "\n".join(lines + [")"])


def image_request(text: str, images=()) -> dict:
    """A prompt for `llm.generate`: text with one `<image>` per image."""
    request: dict = {"prompt": text}
    if images:
        request["multi_modal_data"] = {"image": list(images)}
    return request


def cache_counters(llm) -> dict[str, float]:
    """vLLM's own counters, in one dict: prefix cache (tokens) and multimodal processor cache (items)."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        for name in ("prefix_cache_queries", "prefix_cache_hits", "mm_cache_queries", "mm_cache_hits"):
            if m.name == f"vllm:{name}":
                out[name] = out.get(name, 0.0) + float(getattr(m, "value", 0.0))
    return out
