"""Timing primitives of the benchmark: a synchronised clock, CPU usage, the CUDA allocator's driver
calls, and SDPA backend limits.

The bottom of the package: it imports nothing else of `terra_nb.bench` but `profiling.sync`.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from terra_nb.bench.profiling import sync


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of `fn()`, the device's queued work included (synchronised before and after)."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def cpu_usage() -> tuple[float, int]:
    """This process's CPU seconds (user + system) and involuntary context switches so far. Their
    deltas over a phase tell a CPU-bound phase (CPU seconds near its wall seconds) from one that
    waits (on the GPU, or preempted: involuntary switches)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nivcsw


def device_allocs() -> int | None:
    """How many times torch's CUDA caching allocator has asked the driver for memory so far (None
    on the CPU): a dynamic KV cache that grows past every size the allocator has cached makes it
    call the driver, a CPU-side cost in a CPU-bound decode loop."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0))


def sdpa_backends(names: tuple[str, ...] | None):
    """A context where SDPA may only use `names` (None: torch's own choice, unrestricted)."""
    import contextlib

    if names is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, n) for n in names])
