"""The server's routes on one `AsyncLLM`: `build_app(engine)` -> a FastAPI app.

    POST /v1/rollouts   one open-loop rollout -> its frames, one JSON line each (NDJSON), as made
    WS   /v1/sessions   a start, then a step per frame: the client's policy closes the loop
    GET  /health        engine alive, sessions (open, running, refused), KV-cache blocks free/total, each rank's load, the layout
    GET  /metrics       vLLM's Prometheus metrics (the engine's stats on: `make_server_engine`)
    GET  /              the toy world in the browser (static/index.html); GET /v1/toy: its start

Every message is read by `protocol` (the port's rules) before anything reaches the engine; a bad
one gets an error message naming its rule, on that connection only. A session takes one of the
server's places at its `start` (a rollout at its request) and gives it back at its end: at most
`max_sessions` at once, never more than the engine schedules at once (its `max_num_seqs` on each of
its ranks); one more is refused at once (`server_full`; HTTP 503 with `Retry-After` on POST), never
queued in silence. On N ranks vLLM's load balancer places each session (`session.WorldSession`:
a round is one request, on one rank) and every frame names its rank.
A connection that sends nothing for `idle_timeout` s while the server waits for it is closed
(`idle_timeout`), so idle clients cannot hold places. A client that goes away mid-frame has its
session aborted (`WorldSession.abort`: vLLM frees its KV blocks). `end_sessions` (the server's
shutdown) ends every live connection with an "end" message first; `watch_engine` ends them with an
`engine_dead` error once the engine has died (the server then exits: `server.serve`).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.websockets import WebSocketDisconnect

from ..port.layout import FrameLayout, TerraInputError
from ..port.vllm_patch import RequestValidationError
from .protocol import (RETRY_AFTER_S, ProtocolError, error_message, frame_message, loads, message_type, parse_rollout,
                       parse_start, parse_step)
from .engine import CapacityError, data_parallel_size, kv_blocks_per_rank, prometheus_registry, requests_per_rank
from .session import WorldSession, round_frames
from .toy import ToyDecoder

__all__ = ["IDLE_TIMEOUT_S", "CapacityError", "ServerState", "build_app", "end_sessions", "engine_capacity",
           "session_capacity", "watch_engine"]

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
REFUSALS = (TerraInputError, ProtocolError, RequestValidationError)
"""What a client is told about (by rule); anything else is the server's fault and is logged."""
SHUTDOWN = "server shutting down"
IDLE_TIMEOUT_S = 60.0
"""Seconds a WebSocket connection may send nothing while the server waits for its next message
(`--idle-timeout`); the time its frames take does not count."""
ENGINE_CHECK_S = 0.5
"""How often `watch_engine` looks at the engine (the check is one attribute read)."""
CLOSE_CODES = {"end": 1000, "shutdown": 1001, "engine_dead": 1011, "server_full": 1013, "idle_timeout": 1000}
"""The WebSocket close code after each way a connection ends (1001: going away, 1011: the server
failed, 1013: try again later)."""


class Stopped(Exception):
    """The connection's work ended early: the client left, or the server is shutting down."""


class Live:
    """One connection (or rollout) as the server sees it: stopped by `end_sessions`, with the
    `reason` (an "end" message) or the `error` (an error message, e.g. `engine_dead`) its client
    is told; `place`: it holds one of the server's places (a started session, a rollout);
    `session`: its session, once started (its `rank` counts in `/health`)."""

    def __init__(self):
        self.stop = asyncio.Event()
        self.reason: str | None = None
        self.error: ProtocolError | None = None
        self.place = False
        self.session: WorldSession | None = None


def engine_capacity(engine) -> int:
    """Sequences the engine's schedulers run at once (`max_num_seqs` on each rank): an open
    session holds one from its start to its end, even between frames, so a session beyond them
    would wait unanswered."""
    return engine.vllm_config.scheduler_config.max_num_seqs * data_parallel_size(engine)


def session_capacity(max_sessions: int | None, max_num_seqs: int, ranks: int = 1) -> int:
    """The sessions the server admits: `max_sessions`, or `max_num_seqs` on each of `ranks` when
    None; `CapacityError` when it asks for more than the engine schedules."""
    most = max_num_seqs * ranks
    if max_sessions is None:
        return most
    if not 1 <= max_sessions <= most:
        each = f" on each of {ranks} ranks" if ranks > 1 else ""
        raise CapacityError(f"--max-sessions {max_sessions} must lie in 1..{most}: the engine schedules at most "
                            f"max_num_seqs={max_num_seqs} sequences at once{each} and every open session holds one; "
                            f"raise it (--engine-arg max_num_seqs={max(-(-max_sessions // ranks), 1)}) or leave "
                            f"--max-sessions out")
    return max_sessions


class ServerState:
    """What every route shares: the engine, its layout, the limits, the live connections and rollouts."""

    def __init__(self, engine, decoder: ToyDecoder | None, max_sessions: int | None, max_frames: int,
                 idle_timeout: float = IDLE_TIMEOUT_S):
        self.engine, self.decoder = engine, decoder
        self.layout = FrameLayout.from_config(engine.model_config.hf_config)
        self.max_model_len = engine.model_config.max_model_len
        self.ranks = data_parallel_size(engine)
        self.max_sessions = session_capacity(max_sessions, engine.vllm_config.scheduler_config.max_num_seqs, self.ranks)
        self.max_frames, self.idle_timeout = max_frames, idle_timeout
        self.live: set[Live] = set()  # open connections (with a session or not) and rollouts
        self.open = 0     # of those, the ones holding a place
        self.running = 0  # live sessions with a frame being made now
        self.served = 0   # sessions and rollouts admitted since the start
        self.refused = 0  # starts and rollouts refused with server_full since the start
        self.dead: str | None = None  # why the engine died, once it has

    def connect(self) -> Live:
        """A new connection or rollout, holding no place yet (`leave` it when done)."""
        live = Live()
        self.live.add(live)
        return live

    def admit(self, live: Live) -> None:
        """`live` takes a place (`release` gives it back), or `server_full` / `engine_dead`."""
        if self.dead is not None or self.engine_dead():
            raise ProtocolError("engine_dead", error=self.dead or "vLLM reports it dead")
        if self.open >= self.max_sessions:
            self.refused += 1
            why = ("its --max-sessions" if self.max_sessions < engine_capacity(self.engine)
                   else "what its engine schedules at once, max_num_seqs"
                   + (f" on each of {self.ranks} ranks" if self.ranks > 1 else ""))
            raise ProtocolError("server_full", n=self.open, why=f"{self.max_sessions}: {why}")
        live.place = True
        self.open += 1
        self.served += 1

    def release(self, live: Live) -> None:
        if live.place:
            live.place = False
            self.open -= 1

    def engine_dead(self) -> bool:
        return bool(getattr(self.engine, "errored", False))

    @contextlib.asynccontextmanager
    async def making_frame(self):
        """Count a session as running while one of its frames is being made."""
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1

    def leave(self, live: Live) -> None:
        self.release(live)
        self.live.discard(live)

    def png(self, codes, image: bool) -> str | None:
        return self.decoder.png(codes) if image else None

    def frame(self, index: int, session: WorldSession, codes, ms: float, image: bool) -> dict:
        """The message of `session`'s frame `index`, its last out (with its rank on N ranks)."""
        message = frame_message(index, codes, ms, self.png(codes, image))
        if self.ranks > 1:
            message["rank"] = session.rank
        return message

    def sessions_per_rank(self) -> list[int]:
        """Open sessions and rollouts by the rank of their last frame."""
        counts = [0] * self.ranks
        for live in list(self.live):
            rank = live.session.rank if live.place and live.session is not None else None
            if rank is not None:
                counts[rank] += 1
        return counts


def build_app(engine, decoder: ToyDecoder | str | None = "auto", max_sessions: int | None = None,
              max_frames: int = 1000, metrics: bool = True, idle_timeout: float = IDLE_TIMEOUT_S) -> FastAPI:
    """The routes on `engine` (an `AsyncLLM` serving the event loop the app will run on).

    `decoder`: a `ToyDecoder`, None, or "auto"/"toy"/"none" (`ToyDecoder.for_model`);
    `max_sessions`: started sessions and rollouts at most (one more is refused: `server_full`); None:
    the engine's `max_num_seqs` on each of its ranks, and never above it (`CapacityError`);
    `max_frames`: new frames of a rollout, or of a session, at most (`too_many_frames`);
    `idle_timeout`: seconds a WebSocket may send nothing while the server waits for it (`idle_timeout`).
    """
    if not idle_timeout > 0:
        raise ValueError(f"idle_timeout must be > 0 s, got {idle_timeout!r}")
    layout = FrameLayout.from_config(engine.model_config.hf_config)
    if isinstance(decoder, str):
        decoder = ToyDecoder.for_model(layout, decoder)
    state = ServerState(engine, decoder, max_sessions, max_frames, idle_timeout)
    app = FastAPI(title="terra-nb world model server")
    app.state.terra = state
    if metrics:
        _mount_metrics(app)

    @app.get("/health")
    async def health():
        body = await _health(state)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/")
    async def page():
        return FileResponse(STATIC / "index.html")

    @app.get("/v1/toy")
    async def toy():
        if decoder is None:
            return JSONResponse({"error": error_message(ProtocolError("no_decoder"))}, status_code=404)
        return await asyncio.to_thread(lambda: decoder.start)  # renders a clip once: off the loop

    @app.post("/v1/rollouts")
    async def rollouts(request: Request):
        try:
            body = loads(await request.body())
            rollout = _parse(parse_rollout, body, layout, state.max_model_len, decoder is not None, max_frames)
            live = state.connect()
            try:
                state.admit(live)
            except ProtocolError:
                state.leave(live)
                raise
        except REFUSALS as err:
            if getattr(err, "rule", None) in ("server_full", "engine_dead"):
                return JSONResponse({"error": error_message(err, True)}, status_code=503,
                                    headers={"Retry-After": str(RETRY_AFTER_S)})
            return JSONResponse({"error": error_message(err, True)}, status_code=400)
        return StreamingResponse(_ndjson(_rollout_frames(state, rollout, live), state, live),
                                 media_type="application/x-ndjson")

    @app.websocket("/v1/sessions")
    async def sessions(ws: WebSocket):
        await ws.accept()
        live = state.connect()
        try:
            await _serve_session(state, ws, live)
        finally:
            state.leave(live)

    return app


async def end_sessions(app: FastAPI, reason: str = SHUTDOWN, timeout: float = 10.0,
                       error: ProtocolError | None = None) -> None:
    """Stop every live connection and rollout: each aborts its engine request, tells its client
    `{"type": "end", "reason": reason}` (or `error`, as an error message) and closes (WebSocket code
    1001; 1011 after an `engine_dead` error). Waits for them (at most `timeout` s). One already
    stopped keeps what it was told first."""
    state: ServerState = app.state.terra
    for live in list(state.live):
        if not live.stop.is_set():
            live.reason, live.error = reason, error
            live.stop.set()
    deadline = time.monotonic() + timeout
    while state.live and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def watch_engine(app: FastAPI, every: float = ENGINE_CHECK_S) -> str:
    """Return once the engine has died (vLLM's `AsyncLLM.errored`: its engine core exited or its
    output handler failed), after telling every live connection and rollout (`engine_dead`): the
    server cannot serve again, and its caller exits so that a supervisor starts it afresh."""
    state: ServerState = app.state.terra
    while not state.engine_dead():
        await asyncio.sleep(every)
    state.dead = "its engine core process exited or its output handler failed"
    logger.error("the engine has died (%s): ending every session, then the server", state.dead)
    await end_sessions(app, error=ProtocolError("engine_dead", error=state.dead))
    return state.dead


def _mount_metrics(app: FastAPI) -> None:
    """vLLM's Prometheus registry at /metrics, as vLLM's server mounts it (the regex answers
    /metrics itself instead of redirecting to /metrics/)."""
    import re

    from prometheus_client import make_asgi_app
    from starlette.routing import Mount

    route = Mount("/metrics", make_asgi_app(registry=prometheus_registry()))
    route.path_regex = re.compile("^/metrics(?P<path>.*)$")
    app.routes.append(route)


async def _health(state: ServerState) -> dict:
    """The engine alive, the sessions (open, running, refused), the engine cores' KV blocks, each
    rank's load, the CPU time of the server's event loop so far (what the load test charges a
    frame), the limits and the layout. docs/serving.md describes every field."""
    engine, layout = state.engine, state.layout
    dead = state.engine_dead()
    blocks = [None] * state.ranks if dead else await kv_blocks_per_rank(engine)
    total = None if None in blocks else {key: sum(b[key] for b in blocks) for key in ("free", "total")}
    ranks = [{"rank": rank, "sessions": sessions, "requests": requests, "kv_blocks": kv}
             for rank, (sessions, requests, kv) in enumerate(zip(state.sessions_per_rank(), requests_per_rank(engine),
                                                                 blocks))]
    return {"status": "dead" if dead else "ok", "model": str(engine.model_config.model),
            "loop_cpu_s": time.thread_time(),  # this handler runs on the server's loop: that thread's CPU so far
            "sessions": {"open": state.open, "running": state.running, "refused": state.refused,
                         "served": state.served, "max": state.max_sessions},
            "requests": engine.output_processor.get_num_unfinished_requests(),
            "kv_blocks": total, "data_parallel_size": state.ranks, "ranks": ranks,
            "decoder": getattr(state.decoder, "name", None), "round_frames": round_frames(engine),
            "max_num_seqs": engine.vllm_config.scheduler_config.max_num_seqs, "max_frames": state.max_frames,
            "layout": {"image_tokens": layout.image_tokens, "action_tokens": layout.action_tokens,
                       "action_dim": layout.action_dim, "max_frames": layout.max_frames, "num_codes": layout.num_codes}}


# ---------------------------------------------------------------------------- helpers
async def _until(work, *watch: asyncio.Future, timeout: float | None = None):
    """Run `work` unless one of `watch` finishes first (the client left, the server stops): then
    `work` is cancelled and `Stopped` raised; or unless `timeout` s pass first: `TimeoutError`."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task, *watch}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise Stopped() if done else TimeoutError()
    return task.result()


def _parse(parse, *args):
    """`parse(*args)`; what its checks did not name (a fault of the server's) is logged and still
    answered by rule (`bad_message`), so that the connection stays well-formed."""
    try:
        return parse(*args)
    except REFUSALS:
        raise
    except Exception as err:
        logger.exception("%s raised what its checks did not name", parse.__name__)
        raise ProtocolError("bad_message", problem=f"the server could not read it ({type(err).__name__}: {err})") from err


async def _send(ws: WebSocket, message: dict) -> bool:
    """Send, or False when the client is gone."""
    try:
        await ws.send_text(json.dumps(message))
        return True
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False


async def _close(ws: WebSocket, code: int = 1000) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await ws.close(code)


async def _listen(ws: WebSocket, inbox: asyncio.Queue) -> None:
    """Every message of the client onto `inbox`, in order; returns when it disconnects."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while (message := await ws.receive())["type"] != "websocket.disconnect":
            text = message.get("text")
            inbox.put_nowait(text if text is not None else message.get("bytes") or b"")  # bytes: read as JSON


# ---------------------------------------------------------------------------- WS /v1/sessions
async def _serve_session(state: ServerState, ws: WebSocket, live: Live) -> None:
    """One connection: messages in order, each awaited at most `state.idle_timeout` s; a frame is
    raced against the client leaving and the server stopping (either aborts the session, freeing
    its KV blocks). The session holds a place from its start to its end."""
    inbox: asyncio.Queue = asyncio.Queue()
    gone = asyncio.create_task(_listen(ws, inbox))
    stop = asyncio.create_task(live.stop.wait())
    session: WorldSession | None = None
    image = False

    def over() -> None:  # the session is over: its place is free (the connection may start another)
        nonlocal session
        session = None
        state.release(live)

    try:
        while True:
            try:
                text = await _until(inbox.get(), gone, stop, timeout=state.idle_timeout)
            except TimeoutError:
                await _send(ws, error_message(ProtocolError("idle_timeout", seconds=state.idle_timeout)))
                await _close(ws, CLOSE_CODES["idle_timeout"])
                return
            try:
                msg = loads(text)
                kind = message_type(msg, ("start", "step", "end"))
                if kind == "end":
                    frames = 0 if session is None else session.frames
                    if session is not None:
                        await _until(session.close(), gone, stop)
                        over()
                    await _send(ws, {"type": "end", "frames": frames, "reason": "client ended the session"})
                    await _close(ws, CLOSE_CODES["end"])
                    return
                if kind == "start":
                    if session is not None:
                        raise ProtocolError("session_open")
                    start = _parse(parse_start, msg, state.layout, state.max_model_len, state.decoder is not None)
                    state.admit(live)
                    session, image = WorldSession(state.engine, start.sampling), start.image
                    live.session = session
                    work = session.start(start.context, start.actions)
                else:
                    if session is None:
                        raise ProtocolError("no_session")
                    actions = _parse(parse_step, msg, state.layout, session.frames - 1)
                    if session.frames >= state.max_frames:
                        raise TerraInputError("too_many_frames", "actions", what="the session", n=session.frames + 1,
                                              limit=state.max_frames, why="the server's --max-frames")
                    work = session.step(actions)
                began = time.perf_counter()
                try:
                    async with state.making_frame():
                        codes = await _until(work, gone, stop)
                except REFUSALS as err:  # the engine refused a chunk: that session is over (vLLM ended it)
                    over()
                    reply = error_message(err, ends_session=True)
                except Stopped:
                    raise
                except Exception as err:  # the engine failed it: tell the client, serve the others
                    session.abort()
                    over()
                    raise _engine_failure(state, err) from err
                else:
                    reply = state.frame(session.frames - 1, session, codes, (time.perf_counter() - began) * 1e3, image)
            except REFUSALS as err:
                reply = error_message(err)
            if not await _send(ws, reply):
                return
            if reply.get("rule") in CLOSE_CODES:  # server_full, engine_dead: this connection is done
                await _close(ws, CLOSE_CODES[reply["rule"]])
                return
    except Stopped:
        if live.stop.is_set():  # the server is going down (or its engine died): say so, then close
            if live.error is not None:
                await _send(ws, error_message(live.error))
                await _close(ws, CLOSE_CODES[live.error.rule])
            else:
                await _send(ws, {"type": "end", "frames": 0 if session is None else session.frames,
                                 "reason": live.reason or SHUTDOWN})
                await _close(ws, CLOSE_CODES["shutdown"])
    finally:
        for task in (gone, stop):
            task.cancel()
        if session is not None:
            session.abort()


# ---------------------------------------------------------------------------- POST /v1/rollouts
async def _rollout_frames(state: ServerState, rollout, live: Live):
    """The rollout's messages: a frame at a time as made, then an "end" message (or an error line,
    which ends it). Each next chunk goes to the engine as soon as its frame is out, before that
    frame is written to the client (as `session_rollout`'s open loop sends it). A rollout runs
    (`/health`) from its start to its end."""
    session = live.session = WorldSession(state.engine, rollout.sampling)
    state.running += 1
    n_ctx = rollout.context.shape[0]
    stop = asyncio.create_task(live.stop.wait())
    pending = asyncio.ensure_future(session.start(rollout.context, rollout.actions[:n_ctx]))
    began = time.perf_counter()  # when the pending frame's chunk went out
    try:
        for k in range(rollout.n_frames):
            try:
                codes = await _until(pending, stop)
            except REFUSALS as err:
                yield error_message(err, ends_session=True)
                return
            except Stopped:
                raise
            except Exception as err:  # the engine failed it (or died): an error line, never a cut stream
                yield error_message(_engine_failure(state, err), ends_session=True)
                return
            ms = (time.perf_counter() - began) * 1e3
            if k + 1 < rollout.n_frames:
                pending, began = asyncio.ensure_future(session.step(rollout.actions[n_ctx + k])), time.perf_counter()
            yield state.frame(k, session, codes, ms, rollout.image)
        await session.close()
        yield {"type": "end", "frames": rollout.n_frames, "reason": "done"}
    except Stopped:
        if live.error is not None:
            yield error_message(live.error, ends_session=True)
        else:
            yield {"type": "end", "frames": session.frames, "reason": live.reason or SHUTDOWN}
    finally:  # also when the client left: Starlette cancels the response, so nothing is awaited here
        state.running -= 1
        stop.cancel()
        pending.cancel()
        session.abort()


def _engine_failure(state: ServerState, err: Exception) -> ProtocolError:
    """What an engine's failure under a frame is called: `engine_dead` once the engine has died
    (the server then exits), else `engine_error` (logged: a fault of the server's or vLLM's)."""
    if state.engine_dead():
        return ProtocolError("engine_dead", error=f"{type(err).__name__}: {err}")
    logger.error("a session or rollout failed", exc_info=err)
    return ProtocolError("engine_error", error=f"{type(err).__name__}: {err}")


async def _ndjson(messages, state: ServerState, live: Live):
    """One JSON object a line; the rollout leaves the server's count when the stream ends."""
    try:
        async for message in messages:
            yield json.dumps(message) + "\n"
    finally:
        state.leave(live)
