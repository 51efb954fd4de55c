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


VLLM026_CANDIDATES = ("/tmp/vllm026/src", "/tmp/v026/src")


@pytest.fixture(scope="session")
def vllm026_src():
    """Where vLLM 0.26's code is, for the probes that run it beside the installed release:

    * `None` when the installed vLLM *is* 0.26 (the GPU runner, `make test BACKEND=gpu`): the
      probes run against the installed package;
    * else an unpacked 0.26 wheel: `$TERRA_VLLM026_SRC`, `/tmp/vllm026/src` or `/tmp/v026/src`
      (`pip download --no-deps vllm==0.26.0 -d /tmp/v026 && unzip -q /tmp/v026/*.whl -d /tmp/v026/src`).

    Skips, saying so, where neither is: CPU CI does not fetch the wheel (303.7 MB, 22 s to download
    and 19 s / 709 MB to unpack, measured 2026-11-23), so the probes belong to the GPU runner there.
    """
    import vllm

    if vllm.__version__.startswith("0.26"):
        return None
    env = os.environ.get("TERRA_VLLM026_SRC")
    for path in ([env] if env else []) + list(VLLM026_CANDIDATES):
        if os.path.isdir(os.path.join(path, "vllm", "v1")):
            return path
    pytest.skip(f"no vLLM 0.26 here (installed: {vllm.__version__}; no unpacked 0.26 wheel at $TERRA_VLLM026_SRC "
                f"or {' / '.join(VLLM026_CANDIDATES)}): the GPU runner runs this probe against its vLLM 0.26")


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
