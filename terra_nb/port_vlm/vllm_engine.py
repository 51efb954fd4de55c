"""A vLLM engine for a TinyVLM checkpoint, and the request / counter helpers the workbook uses."""
from __future__ import annotations

from pathlib import Path


def make_llm(checkpoint_dir: str | Path, **overrides):
    """`vllm.LLM` for a TinyVLM folder: fp32 (vLLM's "auto" would give bf16 on the CPU), prefix
    caching on, statistics on (for the cache counters), at most 2 images per prompt.

    On the CPU backend also a small KV-cache share, chunked prefill off (as `make_llm` of Terra's
    port, for the same reasons), eager mode (no torch.compile: seconds instead of a minute for a
    model this small) and 32-token KV blocks (the smallest the CPU attention takes), so that short prompts fill whole blocks the prefix
    cache can reuse. On a GPU the settings of Terra's engines (`apply_gpu_settings`: memory cap,
    full-fp32 attention for a float32 model).
    """
    import vllm
    from vllm.platforms import current_platform

    from terra_nb.port.vllm_rollout import apply_gpu_settings

    kwargs = dict(
        model=str(checkpoint_dir),
        dtype="float32",
        enable_prefix_caching=True,
        disable_log_stats=False,
        max_model_len=512,
        limit_mm_per_prompt={"image": 2},
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
    if not current_platform.is_cpu():
        apply_gpu_settings(kwargs)
    return vllm.LLM(**kwargs)


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
