"""The vLLM-CPU variables the suite sets (tests/cpu_engines.py): what
they are per pytest-xdist worker, that a caller's own value wins, and that they stay off a GPU
machine. That an engine honours them is checked on the suite's shared engine in test_vllm_engine.py."""
from __future__ import annotations

import cpu_engines
from cpu_engines import apply_cpu_engine_settings, cpu_engine_settings


def test_each_xdist_worker_gets_a_core_of_its_own_and_every_engine_a_fixed_kv_cache():
    assert cpu_engine_settings(None, cores=2) == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert cpu_engine_settings("gw0", cores=2)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert cpu_engine_settings("gw1", cores=2)["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert cpu_engine_settings("gw2", cores=2)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cpu_engine_settings("gw1", cores=1)   # nothing to spread
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cpu_engine_settings("master", cores=2)


def test_each_xdist_worker_gets_its_share_of_the_cores_as_threads():
    assert cpu_engine_settings("gw0", cores=2, workers=2)["OMP_NUM_THREADS"] == "1"
    assert cpu_engine_settings("gw3", cores=16, workers=4)["OMP_NUM_THREADS"] == "4"
    assert cpu_engine_settings("gw0", cores=2, workers=4)["OMP_NUM_THREADS"] == "1"   # never 0
    assert "OMP_NUM_THREADS" not in cpu_engine_settings(None, cores=2)   # one process: torch's default


def test_a_workers_children_run_torch_on_its_share():
    """What this worker starts (notebook kernels, subprocesses) inherits the setting, and torch obeys it."""
    import os
    import subprocess
    import sys

    threads = os.environ.get("OMP_NUM_THREADS")
    if os.environ.get("PYTEST_XDIST_WORKER") and not cpu_engines.on_gpu_machine():
        assert threads is not None, "conftest did not share the cores out among the xdist workers"
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=True).stdout
    if threads is not None:
        assert int(out) == int(threads)


def test_a_callers_value_wins_and_a_gpu_machine_gets_none(monkeypatch):
    monkeypatch.setattr(cpu_engines, "on_gpu_machine", lambda: False)
    env = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2", "VLLM_CPU_KVCACHE_SPACE": "4"}
    added = apply_cpu_engine_settings(env)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and "VLLM_CPU_KVCACHE_SPACE" not in added
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == added["VLLM_CPU_OMP_THREADS_BIND"]
    assert env["OMP_NUM_THREADS"] == added["OMP_NUM_THREADS"]
    monkeypatch.setattr(cpu_engines, "on_gpu_machine", lambda: True)
    env = {"PYTEST_XDIST_WORKER": "gw1"}
    assert apply_cpu_engine_settings(env) == {} and env == {"PYTEST_XDIST_WORKER": "gw1"}
