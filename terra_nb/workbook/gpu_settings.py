"""The settings the workbook gives its vLLM engines on a GPU, as engine arguments.

The GPU runner (tools/gpu_runner.sh) runs notebooks and test groups side by side on one GPU, so
its environment caps what each engine takes (`$TERRA_NB_GPU_MEMORY_UTILIZATION`,
`$TERRA_NB_KV_CACHE_GIB`, `$TERRA_NB_ENFORCE_EAGER`). Unset, vLLM's defaults hold. The copyable
ports know nothing of this: the workbook adds these arguments where it builds an engine,

    llm = make_llm(ckpt, **gpu_engine_args(0.3))        # {} on the CPU

and the benchmark builds its stock engine with `apply_gpu_settings`, so that both sides are built
alike.
"""
from __future__ import annotations

import os

__all__ = ["EAGER_ENV", "GPU_SHARE_ENV", "KV_CACHE_ENV", "apply_gpu_settings", "gpu_engine_args",
           "gpu_memory_share"]

GPU_SHARE_ENV = "TERRA_NB_GPU_MEMORY_UTILIZATION"
"""When set (a number in (0, 1]), the most `gpu_memory_utilization` any engine here asks for on a
GPU: several processes can then share one GPU (the GPU runner runs notebooks side by side)."""

KV_CACHE_ENV = "TERRA_NB_KV_CACHE_GIB"
"""When set (GiB > 0), the KV cache of every engine here on a GPU that does not choose its own
(`kv_cache_memory_bytes`). vLLM then skips its start-up memory profiling, which measures the free
memory of the whole GPU and so fails when another process on it allocates or frees meanwhile
("No available memory for the cache blocks", "Error in memory profiling")."""

EAGER_ENV = "TERRA_NB_ENFORCE_EAGER"
"""When "1", engines here whose caller does not choose `enforce_eager` run eager on a GPU: no
torch.compile or CUDA-graph capture (a minute or more per engine start). The GPU runner's check
lanes use it; papermill keeps vLLM's default."""


def gpu_memory_share(requested: float | None) -> float | None:
    """The `gpu_memory_utilization` an engine gets on a GPU: `requested` (None: vLLM's default),
    capped by `$TERRA_NB_GPU_MEMORY_UTILIZATION` when that is set.

    vLLM sizes its KV cache as this share of the *whole* GPU minus what its own process holds, and
    refuses to start when less than the share is free; two engines at the default 0.9 cannot share
    a GPU, two at 0.4 can."""
    share = _env_number(GPU_SHARE_ENV, most=1.0)
    if share is None:
        return requested
    return share if requested is None else min(float(requested), share)


def apply_gpu_settings(kwargs: dict, fp32_attention: str | None = "ieee") -> dict:
    """What an engine of the workbook gets on a GPU: `gpu_memory_utilization` capped by
    `gpu_memory_share`, the KV cache size of `$TERRA_NB_KV_CACHE_GIB` and eager mode of
    `$TERRA_NB_ENFORCE_EAGER` where `kwargs` choose none, and for a float32 `dtype` Triton's float32
    precision `fp32_attention` (as Terra's `make_llm` sets it, for an engine built without it).
    Edits `kwargs` and returns it."""
    share = gpu_memory_share(kwargs.get("gpu_memory_utilization"))
    if share is not None:
        kwargs["gpu_memory_utilization"] = share
    kv_gib = _env_number(KV_CACHE_ENV)
    if kv_gib is not None:
        kwargs.setdefault("kv_cache_memory_bytes", int(kv_gib * 2**30))
    if os.environ.get(EAGER_ENV, "").strip() == "1":
        kwargs.setdefault("enforce_eager", True)
    if kwargs.get("dtype") == "float32" and fp32_attention is not None:
        from terra_nb.port.vllm_rollout import set_triton_fp32_precision

        set_triton_fp32_precision(fp32_attention)
    return kwargs


def gpu_engine_args(share: float | None = None, **chosen) -> dict:
    """The engine arguments a notebook passes on top of `make_llm`'s: `chosen` (e.g.
    `enforce_eager`), and where vLLM runs on a GPU, `share` as `gpu_memory_utilization` and the GPU
    runner's settings (`apply_gpu_settings`). On the CPU, `chosen` alone (`make_llm` sizes a CPU
    engine itself)."""
    from vllm.platforms import current_platform

    kwargs = dict(chosen)
    if current_platform.is_cpu():
        return kwargs
    if share is not None:
        kwargs.setdefault("gpu_memory_utilization", share)
    return apply_gpu_settings(kwargs, fp32_attention=None)  # the ports set it from the checkpoint's dtype


def _env_number(name: str, most: float | None = None) -> float | None:
    """A number > 0 (and <= `most`) from the environment variable `name`; None when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and (most is None or value <= most)):
        allowed = "a positive number" if most is None else f"a number in (0, {most:g}]"
        raise ValueError(f"{name} must be {allowed}, got {text!r}")
    return value
