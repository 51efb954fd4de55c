"""How pytest-xdist splits the suite (`make test` runs `--dist loadgroup`), for tests/ and notebooks/.

Each test module and each notebook is one group (one worker runs it, in order: module fixtures and
nbval's kernel stay whole), except that the modules using one of the shared session engines of
tests/conftest.py (SHARED_ENGINES) form one group, so the engine is built once. Those tests also
run back to back, from where the first of them was collected, so that the engine can be shut
down after the last one. Without xdist only that order applies.

Each xdist worker computes on one thread (OMP_NUM_THREADS=1, inherited by the kernels and
subprocesses it starts; vLLM's CPU engines bind their own): two workers on two cores, rather than
two threads each spinning against the other worker's.
"""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest


def shared_engines() -> tuple[str, ...]:
    """tests/conftest.py's SHARED_ENGINES, read from its source (it may not be imported yet)."""
    tree = ast.parse((Path(__file__).parent / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHARED_ENGINES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist runs a group's tests in one worker")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:  # already read its thread count
            sys.modules["torch"].set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """A shared engine's tests back to back, their modules one xdist group; every other module or
    notebook a group of its own (`--dist loadgroup` then splits by file, like `--dist loadfile`)."""
    for name in shared_engines():
        users = [it for it in items if name in getattr(it, "fixturenames", ())]
        if not users:
            continue
        first = items.index(users[0])
        rest = [it for it in items if name not in getattr(it, "fixturenames", ())]
        items[:] = rest[:first] + users + rest[first:]
        modules = {it.path for it in users}
        for it in items:
            if it.path in modules:
                it.add_marker(pytest.mark.xdist_group(name))
    for it in items:
        if not it.get_closest_marker("xdist_group"):
            it.add_marker(pytest.mark.xdist_group(it.path.name))
