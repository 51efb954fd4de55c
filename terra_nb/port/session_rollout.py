"""Rollouts on vLLM as streaming-input sessions: one engine request per rollout and round.

    engine = make_async_engine(checkpoint_dir)         # an AsyncLLM with make_llm's defaults
    frames = await session_rollout(engine, context, actions, n_frames=22)
    frames = session_rollout_sync(engine, context, actions, n_frames=22)      # from a script
    engine = make_session_engine(checkpoint_dir)       # from a notebook (see its docstring)
    frames = session_rollout_sync(engine, context, actions[:3], 22, policy=drive)  # closed loop

`session_rollout` takes and returns what `vllm_rollout` does (`context` `[n_ctx, P]` or
`[B, n_ctx, P]`, the same validation and errors; `[B, n_frames, P]` codes, or `[n_frames, P]`
unbatched). Where `vllm_rollout` re-submits every rollout's whole prompt at every frame step,
here each rollout is one vLLM streaming-input session per round (`AsyncLLM.generate` over an
async generator of `vllm.engine.protocol.StreamingInput`), all rollouts concurrent:

* the first chunk is the round's window, whole frames with their slots and actions (as
  `vllm_rollout.frame_request`), generating one frame (`max_tokens=P`);
* vLLM keeps the session's KV cache and drops the frame's last code (sampled, never fed), so each
  later chunk is `[that code] + 6 slots` with the frame's actions as one item: 7 tokens prefilled
  per frame, and the next frame is generated;
* a round ends after `max_frames` frames (25) and the next round opens a new session from the last
  `overlap` (3) frames, exactly as `vllm_rollout` plans them (`rounds.plan_rounds`);
* open loop (no policy), each session sends its next chunk as soon as its own frame is out
  (`_open_round`); a closed loop waits for the whole batch's frame, which the policy reads (`_round`).

**Closed loop.** With `policy=None`, `actions` covers every frame as for `vllm_rollout`
(`n_ctx + n_frames - 1` rows). With a policy, `actions` covers the context frames (`n_ctx` rows),
and `policy(step, frames)` is called after each generated frame but the last, with the generated
frames so far `[B, step + 1, P]`; it returns the actions of frame `step` (the six poses after it)
as `[B, 6, 3]` (or `[6, 3]` for all), which condition frame `step + 1`.

**Sampling.** Greedy (`temperature == 0`) equals `vllm_rollout` and HF token for token. A seeded
rollout is reproducible run to run: every chunk carries `SamplingParams.seed =
request_seed(seed, rollout, frame)`, as `vllm_rollout`'s requests do, but the engine seeds a
session's generator once, from its first chunk, and draws on from it: a round's first frame equals
`vllm_rollout`'s seeded frame, later ones do not.

**Engine and event loop.** An `AsyncLLM` serves the event loop that first uses it. Call
`await session_rollout(...)` from one loop of yours, or `session_rollout_sync(...)` (from a script
or a notebook), which runs every call on one loop of the engine's own, in a thread; not both on
one engine. The front door (`vllm_frontdoor`) checks every chunk before the engine core: a bad
chunk raises vLLM's validation error naming its rule, and the engine serves the next session.
"""
from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path

import torch

from .engine_limits import check_engine_prompt_frames
from .layout import FrameLayout, TerraInputError, batched_actions, rollout_inputs, validate_actions, validate_codes
from .rounds import plan_rounds
from .rollout import SamplingConfig
from .vllm_processing import MODALITY
from .vllm_rollout import engine_kwargs, engine_layout, frame_request, request_seed, sampling_params

__all__ = ["chunk_params", "continuation", "input_stream", "make_async_engine", "make_session_engine", "read_session",
           "session_rollout", "session_rollout_sync", "shutdown_async_engine"]


def make_async_engine(checkpoint_dir: str | Path, max_frames: int | None = None, on_config=None, **overrides):
    """An `AsyncLLM` for a Terra checkpoint with `make_llm`'s defaults (eager on the CPU; vLLM's
    periodic stats log off, as `vllm.LLM` has it); any engine argument can be overridden.

    `on_config(vllm_config)`: called with the engine's resolved `VllmConfig` (e.g. its
    `scheduler_config.max_num_seqs`) before any engine process starts; what it raises stops the start."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = engine_kwargs(checkpoint_dir, max_frames, **{"disable_log_stats": True, **overrides})
    spawn_engine_processes_after_cuda()
    args = AsyncEngineArgs(**kwargs)
    if on_config is not None:
        resolve = args.create_engine_config

        def checked(*a, **kw):  # AsyncLLM.from_engine_args resolves the config once, then starts the core
            config = resolve(*a, **kw)
            on_config(config)
            return config

        args.create_engine_config = checked
    return AsyncLLM.from_engine_args(args)


def spawn_engine_processes_after_cuda() -> None:
    """Start the `AsyncLLM`'s engine-core process by spawning, not forking, once this process has
    used CUDA: a forked child cannot ("Cannot re-initialize CUDA in forked subprocess").

    vLLM makes that switch itself when it sees CUDA initialized, but reads the setting through
    its cache of environment variables, which an engine core built earlier in this process
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, e.g. `make_llm` in a test run) has frozen at "fork"."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    from vllm import envs

    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()   # vLLM re-reads the variable; the next engine core caches again


def make_session_engine(checkpoint_dir: str | Path, max_frames: int | None = None, loop_factory=None, **overrides):
    """`make_async_engine`, built on the event loop `session_rollout_sync` will run it on.

    Use it from a notebook: a cell runs inside the kernel's event loop, and an `AsyncLLM` built
    there starts its output handler on that loop, which `session_rollout_sync` then blocks (the
    call hangs). Built here, the engine serves its own loop thread from the start.
    `loop_factory`: makes that loop (e.g. `uvloop.new_event_loop`; None: asyncio's)."""
    loop = _new_loop(loop_factory)

    async def build():
        return make_async_engine(checkpoint_dir, max_frames, **overrides)

    try:
        engine = asyncio.run_coroutine_threadsafe(build(), loop).result()
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        raise
    engine.__dict__["_terra_loop"] = loop
    return engine


def chunk_params(sampling: SamplingConfig, layout: FrameLayout, rollout: int, frame: int):
    """The `SamplingParams` of the chunk that generates video frame `frame` of rollout `rollout`:
    one frame, as `vllm_rollout`'s, streamed as deltas (sessions refuse FINAL_ONLY outputs)."""
    from vllm.sampling_params import RequestOutputKind

    seed = None if sampling.greedy or sampling.seed is None else request_seed(sampling.seed, rollout, frame)
    params = sampling_params(sampling, layout, seed)
    params.output_kind = RequestOutputKind.DELTA
    return params


def continuation(code: int, actions: torch.Tensor, layout: FrameLayout) -> dict:
    """A session's chunk after a frame: its last code (dropped by vLLM, so sent again), its six
    slots, and its actions `[6, 3]` as the one item."""
    return {"prompt_token_ids": [int(code)] + [layout.placeholder_id] * layout.action_tokens,
            "multi_modal_data": {MODALITY: actions.reshape(1, layout.action_tokens, layout.action_dim).contiguous()}}


async def input_stream(feed: asyncio.Queue):
    """A session's input stream for `AsyncLLM.generate`: the chunks (`StreamingInput`) its driver
    puts on `feed`, until it puts None (the session then ends)."""
    while (chunk := await feed.get()) is not None:
        yield chunk


async def read_session(engine, chunks, params, request_id: str, made: asyncio.Queue, layout: FrameLayout) -> None:
    """Run one session (`engine.generate` over `chunks`, e.g. `input_stream(feed)`, first chunk's
    `params`), putting every frame's `P` codes on `made` as soon as they are out. A session's
    building blocks, with `continuation` and `chunk_params`: `session_rollout` drives them a round at
    a time, and a server (`terra_nb.serve.WorldSession`) a frame at a time."""
    codes: list[int] = []
    async for out in engine.generate(chunks, params, request_id):
        codes.extend(out.outputs[0].token_ids)  # deltas
        while len(codes) >= layout.image_tokens:
            made.put_nowait(codes[: layout.image_tokens])
            codes = codes[layout.image_tokens:]
    if codes:
        raise RuntimeError(f"session {request_id} ended inside a frame ({len(codes)} codes)")


def _open_session(group: asyncio.TaskGroup, engine, layout, window, window_actions, b: int, first_frame: int,
                  sampling, tag: str) -> tuple[asyncio.Queue, asyncio.Queue]:
    """Open rollout `b`'s session of a round in `group`: its first chunk (the window) queued, its
    reader running. Returns `(feed, made)`: put the next chunks on `feed` (`_send_next`), take each
    frame's codes from `made`."""
    from vllm.engine.protocol import StreamingInput

    feed, made = asyncio.Queue(), asyncio.Queue()
    params = chunk_params(sampling, layout, b, first_frame)
    feed.put_nowait(StreamingInput(frame_request(window[b], window_actions[b], layout), params))
    group.create_task(read_session(engine, input_stream(feed), params, f"terra-session-{tag}-{b}", made, layout))
    return feed, made


def _send_next(feed: asyncio.Queue, codes, actions, b: int, frame: int, layout, sampling) -> None:
    """After a frame of rollout `b`: the chunk that generates video frame `frame` (the frame's last
    code, its six slots and `actions`), or, with `actions` None, the end of the session."""
    from vllm.engine.protocol import StreamingInput

    if actions is None:
        feed.put_nowait(None)  # the round is full: close the session
    else:
        feed.put_nowait(StreamingInput(continuation(codes[-1], actions, layout), chunk_params(sampling, layout, b, frame)))


async def _round(engine, layout, window, window_actions, n_new, first_frame, next_actions, sampling) -> torch.Tensor:
    """One round, all rollouts concurrent: one session each; returns the new frames `[B, n_new, P]`.

    `next_actions(frames)` gives, after each new frame (`frames`: `[B, P]`), the actions `[B, 6, 3]`
    of that frame, or None after the rollout's last frame.
    """
    B = window.shape[0]
    tag = uuid.uuid4().hex[:12]
    frames = []
    async with asyncio.TaskGroup() as group:
        sessions = [_open_session(group, engine, layout, window, window_actions, b, first_frame, sampling, tag)
                    for b in range(B)]
        for step in range(n_new):
            codes = torch.tensor([await made.get() for _, made in sessions], dtype=torch.long)
            frames.append(codes)
            actions = next_actions(codes)
            for b, (feed, _) in enumerate(sessions):
                _send_next(feed, codes[b], None if step == n_new - 1 else actions[b], b, first_frame + step + 1,
                           layout, sampling)
    return torch.stack(frames, dim=1)


async def _open_round(engine, layout, window, window_actions, planned, n_new, first_frame, sampling, tick) -> torch.Tensor:
    """One round of an open loop, all rollouts concurrent: one session each; returns `[B, n_new, P]`.

    Every action is known up front (`planned[b, k]`: the actions after new frame k), so each session
    sends its next chunk as soon as its own frame is out. Nothing waits for the slowest rollout, and
    the front end checks one rollout's chunk while the engine decodes the others (`_round`, which a
    policy needs, holds every rollout until the whole batch's frame is out). `tick(n)`: every
    rollout has `n` new frames.
    """
    B = window.shape[0]
    tag = uuid.uuid4().hex[:12]
    frames: list[list[list[int]]] = [[] for _ in range(B)]

    async def drive(b: int, feed: asyncio.Queue, made: asyncio.Queue) -> None:
        for step in range(n_new):
            codes = await made.get()
            frames[b].append(codes)
            _send_next(feed, codes, None if step == n_new - 1 else planned[b, step], b, first_frame + step + 1,
                       layout, sampling)
            tick(min(len(f) for f in frames))

    async with asyncio.TaskGroup() as group:
        for b in range(B):
            group.create_task(drive(b, *_open_session(group, engine, layout, window, window_actions, b, first_frame,
                                                      sampling, tag)))
    return torch.tensor(frames, dtype=torch.long)


def _rollout_inputs(context, actions, n_frames: int, layout: FrameLayout, closed_loop: bool):
    """`rollout_inputs`, asking only the context frames' actions of a closed loop."""
    if not closed_loop:
        return rollout_inputs(context, actions, n_frames, layout)
    context_t, actions_t, batched = rollout_inputs(context, actions, 1, layout)
    return context_t, actions_t[:, : context_t.shape[1]], batched


def policy_actions(out, batch: int, layout: FrameLayout) -> torch.Tensor:
    """A policy's answer `[B, 6, 3]` (or `[6, 3]` for all rollouts) -> float32 `[B, 6, 3]`."""
    out = torch.as_tensor(out)
    if out.dim() == 2:
        out = out.unsqueeze(0)
    a, d = layout.action_tokens, layout.action_dim
    if out.dim() != 3 or tuple(out.shape[1:]) != (a, d):
        raise TerraInputError("wrong_action_shape", got=f"policy output of shape {list(out.shape)}",
                              expected=f"[batch, {a}, {d}] or [{a}, {d}]")
    out = batched_actions(out.unsqueeze(1), batch, layout, what="context")[:, 0]
    return torch.stack([validate_actions(x.unsqueeze(0), layout)[0] for x in out])


async def session_rollout(
    engine,
    context,
    actions,
    n_frames: int,
    sampling: SamplingConfig = SamplingConfig(),
    policy=None,
    progress: bool = True,
    overlap: int = 3,
) -> torch.Tensor:
    """Roll out Terra on an `AsyncLLM` (see `make_async_engine`), one session per rollout and round.

    Inputs, output and errors as `vllm_rollout`; with `policy`, `actions` covers the context frames
    and `policy(step, frames)` supplies the rest (module docstring).
    """
    layout, _ = engine_layout(engine)
    context_t, actions_t, batched = _rollout_inputs(context, actions, n_frames, layout, policy is not None)
    B, n_ctx = context_t.shape[:2]
    longest_prompt = min(n_ctx + n_frames, layout.max_frames) - 1
    max_model_len = engine.model_config.max_model_len
    check_engine_prompt_frames(longest_prompt, layout, max_model_len, what="the rollout's longest prompt",
                               param="n_frames", why=f"{n_ctx} context + {n_frames} new in rounds of "
                               f"{layout.max_frames}; max_model_len {max_model_len}: build the engine with "
                               "make_async_engine")
    rounds = plan_rounds(n_ctx, n_frames, layout.max_frames, overlap)
    video, rows = context_t, list(actions_t.unbind(1))  # rows[k]: the actions after video frame k, [B, 6, 3]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_frames, unit="frame", desc=f"vLLM session rollout x{B}")
    made: list[torch.Tensor] = []

    def next_actions(codes: torch.Tensor):  # closed loop: the whole batch's frame is out; ask the policy
        made.append(codes)
        if bar is not None:
            bar.update(1)
        step = len(made) - 1
        if step == n_frames - 1:
            return None
        rows.append(policy_actions(policy(step, torch.stack(made, dim=1)), B, layout))
        return rows[n_ctx + step]

    def tick(n: int) -> None:  # every rollout has n new frames in this round (open loop)
        if bar is not None and done_before + n > bar.n:
            bar.update(done_before + n - bar.n)

    try:
        for r in rounds:
            window = video[:, r.start : r.start + r.n_window]
            window_actions = torch.stack(rows[r.start : r.start + r.n_window], dim=1)
            first = n_ctx + len(made)
            if policy is None:
                done_before = len(made)
                planned = torch.stack(rows[first : first + r.n_new - 1], dim=1) if r.n_new > 1 else None
                new = await _first_error(_open_round(engine, layout, window, window_actions, planned, r.n_new, first,
                                                     sampling, tick))
                made.extend(new.unbind(1))
            else:
                new = await _first_error(_round(engine, layout, window, window_actions, r.n_new, first, next_actions,
                                                sampling))
            new = validate_codes(new.reshape(B * r.n_new, 1, -1), layout, f"round {r.index} output").reshape(new.shape)
            video = torch.cat([video, new], dim=1)
    finally:
        if bar is not None:
            bar.close()
    out = video[:, n_ctx:]
    return out if batched else out[0]


async def _first_error(round_):
    """Await a round (`_round`, `_open_round`), raising the first error of its task group itself
    (a refusal stays vLLM's validation error, not an `ExceptionGroup`)."""
    try:
        return await round_
    except BaseExceptionGroup as group:
        while isinstance(group, BaseExceptionGroup):
            group = group.exceptions[0]
        raise group


def session_rollout_sync(engine, *args, **kwargs) -> torch.Tensor:
    """`session_rollout` for scripts and notebooks: runs it on the engine's own event loop."""
    return asyncio.run_coroutine_threadsafe(session_rollout(engine, *args, **kwargs), engine_loop(engine)).result()


_loops_lock = threading.Lock()


def engine_loop(engine) -> asyncio.AbstractEventLoop:
    """The event loop `session_rollout_sync` runs `engine`'s sessions on (one per engine, in a daemon
    thread): an `AsyncLLM` stays bound to the loop that first used it, and a notebook's own loop
    is busy running the cell."""
    with _loops_lock:
        loop = engine.__dict__.get("_terra_loop")
        if loop is None:
            loop = engine.__dict__["_terra_loop"] = _new_loop()
        return loop


def _new_loop(loop_factory=None) -> asyncio.AbstractEventLoop:
    """A new event loop (`loop_factory()`, default asyncio's) running forever in a daemon thread."""
    loop = (loop_factory or asyncio.new_event_loop)()
    threading.Thread(target=loop.run_forever, name="terra-session-loop", daemon=True).start()
    return loop


def shutdown_async_engine(engine, timeout: float | None = None) -> None:
    """Stop the engine (`AsyncLLM.shutdown`) and the event loop thread `session_rollout_sync` gave it.

    The output handler is cancelled first: `AsyncLLM.shutdown` stops the engine core before it,
    and a handler still waiting logs the dead core as an error. `timeout`: seconds the core gets
    to exit before vLLM kills it (None: vLLM's default).
    """
    loop = engine.__dict__.pop("_terra_loop", None)
    handler = getattr(engine, "output_handler", None)
    if loop is not None and handler is not None:
        asyncio.run_coroutine_threadsafe(_cancel(handler), loop).result()
        engine.output_handler = None
    engine.shutdown(timeout=timeout)
    if loop is not None:
        loop.call_soon_threadsafe(loop.stop)


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
