"""Engine utilities of Terra's port that work the same on vLLM 0.26 and 0.32.

* `shutdown_llm(llm)`: neither release has `LLM.shutdown()`; both stop the engine core (and free
  its memory) with `llm.llm_engine.engine_core.shutdown()`.
* `prefix_cache_counters(llm)`: vLLM's Prometheus prefix-cache counters, summed over engines (exact
  on 0.32 only: `vllm_release.PROMETHEUS_PREFIX_COUNTERS_EXACT`).

The rest of what was once this module lives by job: the differences between the two releases in
`vllm_release` (deleted with 0.26), the private vLLM methods the port wraps at runtime in
`vllm_patch` (each `Patch` with its test), and the list of every private vLLM hook the port relies
on in `vllm_hooks`. (The module keeps its name so that the notebooks' `from
terra_nb.port.vllm_compat import shutdown_llm` stays as it was.)
"""
from __future__ import annotations

__all__ = ["prefix_cache_counters", "shutdown_llm"]


def prefix_cache_counters(llm) -> dict[str, float] | None:
    """{'queries': ..., 'hits': ...} in tokens from vLLM's Prometheus counters, summed over engines.

    Needs the engine built with `disable_log_stats=False`; returns None when the counters are not
    there (stats disabled). Per request, `RequestOutput.num_cached_tokens` says the same thing and
    needs no setting.
    """
    try:
        metrics = llm.get_metrics()
    except (AssertionError, AttributeError, RuntimeError):
        return None
    out: dict[str, float] = {}
    for m in metrics:
        if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
            key = m.name.rsplit("_", 1)[-1]
            out[key] = out.get(key, 0.0) + float(getattr(m, "value", 0.0))
    return out or None


def shutdown_llm(llm, timeout: float | None = None) -> None:
    """Stop an `LLM`'s engine core and workers now (before building another engine in the same
    process, e.g. in a notebook on a GPU whose memory the first engine holds). `timeout`: seconds
    the core gets to exit before vLLM kills it (None: vLLM's default)."""
    import gc

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown(timeout=timeout)
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover - best effort
        pass
