"""Shared pytest fixtures. Keep this small; add fixtures, do not rewrite others'."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _run_probe(script: str, ckpt, extra_path=None) -> dict:
    """Run `script` with the checkpoint folder as argv[1] in a fresh interpreter, with `extra_path`
    (e.g. an unpacked vLLM 0.26 source tree) first on PYTHONPATH; return the JSON of its
    `PROBE{...}` line. Lets one test compare what two vLLM releases answer to the same calls."""
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", script, str(ckpt)], env=env, capture_output=True, text=True,
                          timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("PROBE"):])


@pytest.fixture(scope="session")
def run_probe():
    """`run_probe(script, ckpt, extra_path=None) -> dict` (see `_run_probe`)."""
    return _run_probe


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Folder of a seeded random checkpoint of the tiny preset, v1 (Linear action projection), fp32."""
    from terra_nb.port.checkpoints import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_v1", preset="tiny", seed=0, variant="v1")


@pytest.fixture(scope="session")
def tiny_ckpt_v2(tmp_path_factory):
    """Folder of a seeded random checkpoint of the tiny preset, v2 (MLP action projection), fp32."""
    from terra_nb.port.checkpoints import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_v2", preset="tiny", seed=0, variant="v2")


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's torch work on one CPU thread (tiny models on a shared 2-core machine run
    ~30x faster than with threads spinning against other processes); restores the count after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def sample():
    """The tiny preset's shipped sample (`data/sample.json`): context codes and actions."""
    from terra_nb.workbook.data import load_sample

    return load_sample("tiny")


@pytest.fixture(scope="module")
def layout(llm):
    """The frame layout of the module's engine (modules that use it define an `llm` fixture)."""
    from terra_nb.port.config import FrameLayout

    return FrameLayout.from_config(llm.model_config.hf_config)
