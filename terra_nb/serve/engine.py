"""The server's engine: built with vLLM's stats on, its KV blocks read, its metrics registry.

An `AsyncLLM` always runs its engine core in a process of its own (`VLLM_ENABLE_V1_MULTIPROCESSING=0`
keeps only `vllm.LLM`'s core in-process), so the scheduler's KV-cache blocks cannot be read from
the front end. Terra's plugin, which vLLM runs in the engine core's process too, gives `EngineCore`
one utility method (`vllm_plugin.install_engine_utilities`: free and total blocks of
`scheduler.kv_cache_manager.block_pool`), and `kv_blocks` calls it as vLLM calls its own utilities
(`engine_core.call_utility_async`). The vLLM pieces below its public API used here, the same on
0.26 and 0.32 (`tests/test_serve.py` checks them on the installed release): `EngineCore.scheduler`,
`Scheduler.kv_cache_manager.block_pool`, `BlockPool.get_num_free_blocks` / `.num_gpu_blocks`,
`AsyncMPClient.call_utility_async`, `vllm.v1.metrics.prometheus.get_prometheus_registry`,
`AsyncLLM.output_processor` / `.output_handler`, `EngineCoreProc.run_engine_core` (the engine core
process's entry point, `engine_cores_die_with_this_process`), `serial_utils.MsgpackEncoder`
(`protocol.check_sampling`).

The engine core does not outlive the server: `make_server_engine` starts it through
`run_engine_core_dying_with_parent`, which asks Linux to SIGKILL it when the server dies, however
it dies (`kill -9` included; prctl's PR_SET_PDEATHSIG). Its workers, where vLLM starts any, follow
it by vLLM's own rule (each watches a pipe from the engine core and shuts down when it closes).
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import sys
from pathlib import Path

from ..port.session_rollout import make_async_engine
from ..port.vllm_plugin import KV_BLOCKS_UTILITY, install_engine_utilities

__all__ = ["SERVING_HOOKS", "close_engine", "die_with_parent", "engine_cores_die_with_this_process", "kv_blocks",
           "make_server_engine", "prometheus_registry", "serving_defaults"]

SERVING_HOOKS = (
    "vllm.v1.core.block_pool:BlockPool.get_num_free_blocks",
    "vllm.v1.engine.core_client:AsyncMPClient.call_utility_async",
    "vllm.v1.metrics.prometheus:get_prometheus_registry",
    "vllm.v1.engine.output_processor:OutputProcessor.get_num_unfinished_requests",
    "vllm.v1.engine.core:EngineCoreProc.run_engine_core",
    "vllm.v1.serial_utils:MsgpackEncoder.encode",
)
"""vLLM's names below its public API that the server calls ("module:qualified.name")."""


def make_server_engine(model: str | Path, metrics: bool = True, on_config=None, **overrides):
    """`make_async_engine` with vLLM's stats on when `metrics` (what `/metrics` shows: vLLM's
    counters and gauges are fed only then; `make_async_engine` turns them off, as `vllm.LLM` does).
    `on_config`: `make_async_engine`'s (the resolved config, before the engine starts).
    Call it on the event loop the server will run."""
    import vllm.v1.engine.core  # noqa: F401 - loaded, so the plugin's utility goes onto EngineCore here too

    # A forked engine core inherits it from here; a spawned one gets it from the plugin in its own process.
    install_engine_utilities()
    with engine_cores_die_with_this_process():
        return make_async_engine(model, disable_log_stats=not metrics, on_config=on_config,
                                 **{**serving_defaults(model), **overrides})


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_ENGINE_CORE_MAIN: list = []  # vLLM's own entry point, while `engine_cores_die_with_this_process` replaces it


@contextlib.contextmanager
def engine_cores_die_with_this_process():
    """Engine cores started inside this block run `run_engine_core_dying_with_parent` (vLLM starts
    each as `EngineCoreProc.run_engine_core` in a process of its own, forked or spawned: a partial
    of a module function pickles by name, so a spawned process finds it too)."""
    from vllm.v1.engine.core import EngineCoreProc

    original = EngineCoreProc.__dict__["run_engine_core"]
    _ENGINE_CORE_MAIN[:] = [original.__func__]
    EngineCoreProc.run_engine_core = staticmethod(functools.partial(run_engine_core_dying_with_parent,
                                                                    parent_pid=os.getpid()))
    try:
        yield
    finally:
        EngineCoreProc.run_engine_core = original


def run_engine_core_dying_with_parent(*args, parent_pid: int, **kwargs):
    """vLLM's engine core process, which dies with the process that started it (`die_with_parent`)."""
    die_with_parent(parent_pid)
    if _ENGINE_CORE_MAIN:  # forked: the patched class came along
        return _ENGINE_CORE_MAIN[0](*args, **kwargs)
    from vllm.v1.engine.core import EngineCoreProc  # spawned: vLLM imported afresh, unpatched

    return EngineCoreProc.run_engine_core(*args, **kwargs)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process as soon as the thread that started it ends (its process killed
    included); exit now if that has already happened (`parent_pid` is no longer the parent).
    Linux only: elsewhere nothing is set (docs/serving.md says how to run the server there)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def serving_defaults(model: str | Path) -> dict:
    """Engine arguments the server adds to `make_async_engine`'s: vLLM's stream interval at a
    frame's codes. A session reads whole frames, so vLLM's front end then builds one output a
    request and frame (a chunk's end always flushes) instead of one a code: per-code outputs were
    the largest share of the server's event loop (py-spy, 256 sessions on an H100: output
    processing about 40% of the loop's busy samples), and that loop also carries every session's
    messages. The load test's in-process reference gets the same arguments."""
    from ..port.config import LlamaActionConfig
    from ..port.layout import FrameLayout

    layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(model)))
    return {"stream_interval": layout.image_tokens}


async def close_engine(engine, timeout: float | None = None) -> None:
    """Stop the engine from its own loop: its output handler first (a handler still waiting on a
    stopped engine core logs it as an error), then the engine core, which vLLM kills after
    `timeout` s (None: vLLM's default)."""
    handler = getattr(engine, "output_handler", None)
    if handler is not None:
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)
        engine.output_handler = None
    engine.shutdown(timeout=timeout)


async def kv_blocks(engine) -> dict[str, int] | None:
    """{"free": ..., "total": ...} KV-cache blocks of the engine core now (a freed block that prefix
    caching keeps counts as free), or None where it cannot say (the utility is missing there)."""
    core = getattr(engine, "engine_core", None)
    if not hasattr(core, "call_utility_async"):
        return None
    try:
        free, total = await core.call_utility_async(KV_BLOCKS_UTILITY)
    except Exception:  # vLLM answers a missing method with a failure message
        return None
    return {"free": int(free), "total": int(total)}


def prometheus_registry():
    """The Prometheus registry vLLM's stat loggers write to."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return get_prometheus_registry()
