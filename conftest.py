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
cells stay in one worker, in order; the files are handed out longest kind first (`longest_files_first`).
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
    items[:] = longest_files_first(items)


def longest_files_first(items: list) -> list:
    """`items` with whole files moved, each file's items in their order: the notebooks first, then
    the modules that start an engine, then the rest; within each kind, files in reverse name order
    (the fast tier's longest modules, the toy world's training and sweeps, sort last by name).
    pytest-xdist's `--dist loadfile` hands each worker the next file as it runs out (the Makefile
    keeps this order: `--no-loadscope-reorder`), so the minutes-long files start early, the last to
    run are short ones, and both workers finish together. xdist's own order (most tests first)
    hands out last the files of one or two long tests (a server, a cluster), and one worker runs
    them alone."""
    rank: dict = {}
    for item in items:
        kind = 0 if item.get_closest_marker("notebook") else 1 if item.get_closest_marker("engine") else 2
        rank[item.path] = min(rank.get(item.path, kind), kind)
    by_name = sorted(items, key=lambda item: str(item.path), reverse=True)  # stable: a file's items keep their order
    return sorted(by_name, key=lambda item: rank[item.path])
