"""vLLM's Prometheus prefix-cache counters, read the way the engine tests compare them with the
port's own per-request figures (`RequestOutput.num_cached_tokens`, which needs no setting)."""
from __future__ import annotations


def prefix_cache_counters(llm) -> dict[str, float] | None:
    """{'queries': ..., 'hits': ...} in tokens from vLLM's Prometheus counters, summed over engines.

    Needs the engine built with `disable_log_stats=False`; None when the counters are not there
    (stats disabled). Exact on 0.32 only (`vllm_release.PROMETHEUS_PREFIX_COUNTERS_EXACT`)."""
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
