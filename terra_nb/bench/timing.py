"""Timing primitives of the benchmark: a synchronised clock and SDPA backend limits.

The bottom of the package: it imports nothing else of `terra_nb.bench`.
"""
from __future__ import annotations

import time
from typing import Callable

import torch


def sync() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that a timer brackets it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of `fn()`, the device's queued work included (synchronised before and after)."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def sdpa_backends(names: tuple[str, ...] | None):
    """A context where SDPA may only use `names` (None: torch's own choice, unrestricted)."""
    import contextlib

    if names is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, n) for n in names])
