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


def test_a_callers_value_wins_and_a_gpu_machine_gets_none(monkeypatch):
    monkeypatch.setattr(cpu_engines, "on_gpu_machine", lambda: False)
    env = {"PYTEST_XDIST_WORKER": "gw1", "VLLM_CPU_KVCACHE_SPACE": "4"}
    added = apply_cpu_engine_settings(env)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and "VLLM_CPU_KVCACHE_SPACE" not in added
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == added["VLLM_CPU_OMP_THREADS_BIND"]
    monkeypatch.setattr(cpu_engines, "on_gpu_machine", lambda: True)
    env = {"PYTEST_XDIST_WORKER": "gw1"}
    assert apply_cpu_engine_settings(env) == {} and env == {"PYTEST_XDIST_WORKER": "gw1"}

