"""The engine utilities (`terra_nb.port.vllm_compat`), without an engine."""
from __future__ import annotations

from terra_nb.port import vllm_compat as C


def test_prefix_cache_counters_reads_vllm_metrics():
    class M:
        def __init__(self, name, value):
            self.name, self.value = name, value

    class LLM:
        def get_metrics(self):
            return [M("vllm:prefix_cache_queries", 100), M("vllm:prefix_cache_hits", 60),
                    M("vllm:prefix_cache_hits", 4), M("vllm:num_requests_running", 1)]

    class NoStats:
        def get_metrics(self):
            return []

    assert C.prefix_cache_counters(LLM()) == {"queries": 100.0, "hits": 64.0}
    assert C.prefix_cache_counters(NoStats()) is None
