"""Test-suite settings shared by tests/ and nbval's notebooks (the product never reads this file).

* Every vLLM engine of the run is built in the process that asks for it (a worker, a notebook
  kernel, a test's subprocess: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, inherited), as on the GPU
  runner: a tiny engine then starts without an engine-core process that imports torch and vLLM
  again. Tests of the multiprocess engine (the server's) unset it in their subprocess.
* The vLLM-CPU variables of tests/cpu_engines.py (a fixed KV cache, a core per xdist worker).
* Markers: `engine` (a module starts a vLLM engine: its own `pytestmark`), `notebook` (nbval's
  notebook cells, and tests that execute notebooks), `browser`, `gpu`. `make test-fast` runs
  `-m "not engine and not notebook and not browser and not gpu"`.

pytest-xdist splits the suite with its own `--dist loadfile`: a module's tests and a notebook's
cells stay in one worker, in order.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).parent
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _load_cpu_engines():
    spec = importlib.util.spec_from_file_location("cpu_engines", ROOT / "tests" / "cpu_engines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Before any engine or notebook kernel starts (they inherit the environment).
_load_cpu_engines().apply_cpu_engine_settings()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebook)
