"""Timing primitives of the benchmark: a synchronised clock, a row of trials, CPU usage, the CUDA
allocator's driver calls, SDPA backend limits, and `Progress` (rows written as they are measured).

The bottom of the package: it imports nothing else of `terra_nb.bench` but `profiling.sync`.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from terra_nb.bench.profiling import sync


def timed(fn: Callable[[], object]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def trial_row(name: str, batch: int, frames: int, trials: list[float], **extra) -> dict:
    med = statistics.median(trials)
    return dict(name=name, batch=batch, frames=frames, repeats=len(trials), trials_s=[round(t, 3) for t in trials],
                s_per_frame=med / frames, frames_per_s=batch * frames / med, **extra)


def cpu_usage() -> tuple[float, int]:
    """This process's CPU seconds (user + system) and involuntary context switches so far. Their
    deltas over a phase tell a CPU-bound phase (CPU seconds near its wall seconds) from one that
    waits (on the GPU, or preempted: involuntary switches)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nivcsw


def device_allocs() -> int | None:
    """How many times torch's CUDA caching allocator has asked the driver for memory so far (None
    on the CPU). Per HF trial (`device_allocs`): a dynamic KV cache that grows past every size the
    allocator has cached makes it call the driver, a CPU-side cost in a CPU-bound decode loop."""
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


class Progress:
    """Rows as they are measured: each is written to `partial` at once (a device call that runs out
    of time keeps what it measured), and rows starting after `deadline_s` are skipped, not lost."""

    def __init__(self, partial: Path | None = None, deadline_s: float | None = None, header: dict | None = None):
        self.partial, self.deadline_s, self.header = partial, deadline_s, header or {}
        self.t0 = time.perf_counter()
        self.rows: list[dict] = []
        self.errors: list[dict] = []
        self.extra: dict = {}

    def out_of_time(self, what: str) -> bool:
        late = self.deadline_s is not None and time.perf_counter() - self.t0 > self.deadline_s
        if late:
            self.errors.append(dict(group=what, error=f"skipped: past the {self.deadline_s:.0f} s deadline"))
        return late

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        self.flush()
        return row

    def flush(self) -> None:
        if self.partial is not None:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self.partial.write_text(json.dumps(dict(self.header, rows=self.rows, errors=self.errors, **self.extra), indent=2))
