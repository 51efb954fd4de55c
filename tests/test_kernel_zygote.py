"""Notebook kernels forked from the zygote (terra_nb_kernel.zygote) behave as freshly started ones:
same working directory, environment, streams, interrupts and shutdown, and a kernel whose launcher is
killed dies with it. A kernel whose environment differs from the zygote's starts the ordinary way."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from types import SimpleNamespace

import pytest

from terra_nb.workbook.reproduce import KERNEL_NAME, NOTEBOOKS, CurrentEnvKernelManager, kernel_environment
from terra_nb_kernel import zygote

MARKER = "colorsys"  # the test zygote's preload: a module no kernel imports on its own, and tqdm.auto
PROBE = (f"import json, os, sys; preloaded = {MARKER!r} in sys.modules; import tqdm.auto; "
         "print(json.dumps({'preloaded': preloaded, 'pid': os.getpid(), 'ppid': os.getppid(), 'cwd': os.getcwd(), "
         "'env': dict(os.environ), 'bar': [c.__module__ for c in tqdm.auto.tqdm.__mro__]})); os.system('echo from-fd-1')")


async def _run(kc, code: str, interrupt_after: float | None = None, km=None) -> str:
    msg_id, out = kc.execute(code), []
    if interrupt_after is not None:
        await asyncio.sleep(interrupt_after)
        await km.interrupt_kernel()
    while True:
        m = await kc.get_iopub_msg(timeout=60)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            out.append(m["content"]["text"])
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return "".join(out)


async def _kernel(env: dict[str, str]):
    km = CurrentEnvKernelManager(kernel_name=KERNEL_NAME)
    await km.start_kernel(cwd=str(NOTEBOOKS), env=env)
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return km, kc


def _gone(pid: int, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def ready_zygote():
    """A zygote that preloads only `MARKER` and tqdm.auto (the workbook's preloads torch and
    transformers: the notebooks under nbval run through that one), ready to fork."""
    env = kernel_environment()
    env.pop(zygote.SOCKET_VAR, None)
    z = zygote.Zygote(env, preload=(MARKER, "tqdm.auto"))
    _wait_ready(z)
    yield z, env
    z.stop()


def _wait_ready(z: zygote.Zygote) -> None:
    end = time.monotonic() + 60
    while not os.path.exists(z.path):
        assert z.process.poll() is None and time.monotonic() < end, open(os.path.join(z.dir, "log")).read()
        time.sleep(0.05)


@pytest.fixture(scope="module")
def forked_and_ordinary(ready_zygote):
    """One kernel forked from the zygote and one refused by it (an extra variable), both probed; the
    forked one is then interrupted."""
    z, env = ready_zygote

    async def main():
        km, kc = await _kernel({**env, zygote.SOCKET_VAR: z.path})
        forked = await _run(kc, PROBE)
        interrupted = await _run(kc, "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('interrupted')",
                                 interrupt_after=1.0, km=km)
        kc.stop_channels()
        await km.shutdown_kernel()
        km, kc = await _kernel({**env, "TERRA_NB_TEST_OTHER": "1", zygote.SOCKET_VAR: z.path})
        ordinary = await _run(kc, PROBE)
        kc.stop_channels()
        await km.shutdown_kernel()
        return forked, interrupted, ordinary

    forked, interrupted, ordinary = asyncio.run(main())
    return z, forked, interrupted, ordinary


def test_a_forked_kernel_is_a_fresh_kernel_with_the_preload_already_imported(forked_and_ordinary):
    z, probe, interrupted, ordinary = forked_and_ordinary
    facts, fresh = json.loads(probe.splitlines()[0]), json.loads(ordinary.splitlines()[0])
    assert facts["preloaded"] and facts["ppid"] == z.process.pid  # a fork of the zygote, imports done
    assert facts["cwd"] == fresh["cwd"] == str(NOTEBOOKS)
    # the same environment as a kernel started the ordinary way (which had one variable more)
    assert zygote.differences(facts["env"], fresh["env"]) == ["TERRA_NB_TEST_OTHER"]
    assert zygote.SOCKET_VAR not in facts["env"]
    # the progress bar a notebook gets (imported by the zygote outside any kernel, chosen again in it)
    assert facts["bar"] == fresh["bar"] and "tqdm.notebook" in facts["bar"]
    assert "from-fd-1" in probe  # output written to file descriptor 1 reaches the notebook
    assert interrupted == "interrupted\n"
    assert _gone(facts["pid"])  # shut down: the kernel process ended, not just its launcher


def test_a_kernel_whose_environment_differs_starts_the_ordinary_way(forked_and_ordinary):
    z, _, _, ordinary = forked_and_ordinary
    fresh = json.loads(ordinary.splitlines()[0])
    assert not fresh["preloaded"] and fresh["ppid"] != z.process.pid
    assert fresh["env"]["TERRA_NB_TEST_OTHER"] == "1" and zygote.SOCKET_VAR not in fresh["env"]


def test_a_killed_launcher_takes_its_forked_kernel_with_it(ready_zygote):
    z, env = ready_zygote

    async def main():
        km, kc = await _kernel({**env, zygote.SOCKET_VAR: z.path})
        facts = json.loads((await _run(kc, PROBE)).splitlines()[0])
        kc.stop_channels()
        await km.shutdown_kernel(now=True)  # SIGKILL to the launcher's group: it cannot relay that
        return facts

    facts = asyncio.run(main())
    assert facts["ppid"] == z.process.pid and _gone(facts["pid"])


def test_the_kernel_command_and_environment_rules():
    argv = ["/venv/bin/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert zygote.kernel_argv(argv) == ["/venv/bin/python", "-m", zygote.LAUNCHER, "-f", "{connection_file}"]
    assert zygote.differences({"A": "1", "JPY_PARENT_PID": "7"}, {"A": "1", zygote.SOCKET_VAR: "/s"}) == []
    assert zygote.differences({"A": "1", "B": "2"}, {"A": "2"}) == ["A", "B"]
    assert zygote.differences({"A": "1", "VLLM_DIST_IDENT": "a"}, {"A": "1"}) == []  # nothing preloaded reads them
    # a caller that names its own zygote (or "off") is left alone
    assert zygote.kernel_environment({"A": "1", zygote.SOCKET_VAR: "off"}) == {"A": "1", zygote.SOCKET_VAR: "off"}


def test_a_new_environment_gets_a_new_zygote_and_vllms_variables_do_not(monkeypatch):
    """The starter's rule (`kernel_environment`), with a zygote that preloads only `json`: the first
    kernel of an environment starts the ordinary way while its zygote imports; the next ones get the
    socket; an environment that differs (as after an in-process engine set LD_PRELOAD) replaces the
    zygote; one that differs only in VLLM_* variables is served by it."""
    monkeypatch.setattr(zygote, "PRELOAD", ("json",))
    monkeypatch.setattr(zygote, "_zygote", None)
    monkeypatch.delenv(zygote.SOCKET_VAR, raising=False)
    env = {"PATH": os.environ["PATH"], "A": "1"}
    try:
        assert zygote.kernel_environment(env) == env
        first = zygote._zygote
        _wait_ready(first)
        assert zygote.kernel_environment(env) == {**env, zygote.SOCKET_VAR: first.path}
        polluted = {**env, "LD_PRELOAD": "libgomp.so.1"}
        assert zygote.kernel_environment(polluted) == polluted
        second = zygote._zygote
        assert second is not first and first.process.poll() is not None and not os.path.exists(first.dir)
        _wait_ready(second)
        engine = {**polluted, "VLLM_DIST_IDENT": "vllm_dist_1"}
        assert zygote.kernel_environment(engine) == {**engine, zygote.SOCKET_VAR: second.path}
    finally:
        if zygote._zygote is not None:
            zygote._zygote.stop()


def test_no_zygote_beside_a_gpu_build_of_torch(monkeypatch):
    """Forking after CUDA's driver has loaded is unsafe: a starter that has imported a CUDA (or ROCm)
    build of torch starts every kernel the ordinary way and no zygote."""
    monkeypatch.setattr(zygote, "_zygote", None)
    monkeypatch.delenv(zygote.SOCKET_VAR, raising=False)
    env = {"PATH": os.environ["PATH"]}
    for version in (SimpleNamespace(cuda="13.0", hip=None), SimpleNamespace(cuda=None, hip="6.2")):
        monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(version=version))
        assert zygote.kernel_environment(env) == env and zygote._zygote is None
