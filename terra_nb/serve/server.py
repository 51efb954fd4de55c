"""Running the server: the engine on uvicorn's event loop, from the command line or in a thread.

An `AsyncLLM` serves the event loop that first uses it, so the engine is built inside the loop
uvicorn runs (`serve`), never before it. Two ways in:

    python -m terra_nb.serve --model data/toy/model         # the command line (`make serve`)
    python -m terra_nb.serve --model data/toy/model --data-parallel-size 2   # two engine cores (`make serve DP=2`)

    with ServerThread("data/toy/model") as server:          # in this process: tests, notebooks, the load test
        server.url, server.ws_url                           # http://127.0.0.1:PORT, ws://127.0.0.1:PORT
        server.kv_blocks()                                  # {"free": ..., "total": ...} of the engine cores
        server.call(session_rollout(server.engine, ...))    # anything async, on the server's loop

Shutdown (SIGTERM, SIGINT or SIGHUP to the process, Ctrl-C, `ServerThread.stop`) first ends every
live session (`app.end_sessions`: each aborts its engine request and tells its client), then lets
uvicorn close and release the port, then stops the engine core and its workers, and only then does
the process exit (uvicorn alone re-raises the signal once it has closed, and SIGTERM's default
action would end the process before the engine is stopped, leaving its processes behind). While the
engine starts, before uvicorn listens, `StopWhileStarting` takes those signals. An engine that
dies ends every session with an `engine_dead` error, then the server (`EngineDied`: the command
line exits non-zero, for a supervisor to start it again).
"""
from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import uvicorn

from .app import IDLE_TIMEOUT_S, build_app, end_sessions, session_capacity, watch_engine
from .engine import close_engine, kv_blocks, make_server_engine

__all__ = ["STOP_SIGNALS", "EngineDied", "ServerThread", "StopWhileStarting", "TerraServer", "event_loop_factory",
           "run", "serve"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops the server cleanly: Ctrl-C, what systemd, Docker and Kubernetes send, a closed terminal."""


class EngineDied(RuntimeError):
    """The engine died while the server served: every session was told, the server stopped."""


class StopWhileStarting:
    """`STOP_SIGNALS` from `install()` until uvicorn listens (it then takes them,
    `TerraServer.capture_signals`, and gives them back once closed): the engine processes being
    started are killed and `KeyboardInterrupt` is raised; `signal` names what stopped it. vLLM
    waits for its engine core in pyzmq's poll, which runs the handler but drops what it raises:
    a wait that watches the processes then fails ("Engine core initialization failed"), and one
    that does not (its ready message) is cut short after `force_exit_s` by exiting from a timer
    thread (status 0; the engine processes are gone by then, so nothing is left behind)."""

    def __init__(self, force_exit_s: float = 3.0):
        self.signal: str | None = None
        self.force_exit_s = force_exit_s
        self._timer: threading.Timer | None = None

    def install(self) -> "StopWhileStarting":
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.handle)
        return self

    def handle(self, sig, frame) -> None:
        self.signal = signal.Signals(sig).name
        kill_engine_processes()
        if self._timer is None:
            self._timer = threading.Timer(self.force_exit_s, self._exit_now)
            self._timer.daemon = True
            self._timer.start()
        raise KeyboardInterrupt(self.signal)

    def stopped(self) -> None:
        """The stop has unwound by itself: no exit from the timer."""
        if self._timer is not None:
            self._timer.cancel()

    def _exit_now(self) -> None:
        kill_engine_processes()
        print(f"terra_nb.serve: stopped by {self.signal}", file=sys.stderr, flush=True)
        os._exit(0)


def kill_engine_processes() -> None:
    """SIGKILL this process's multiprocessing children (the engine cores, or a data-parallel
    coordinator) and theirs (the workers: a starting worker would take seconds to shut down by
    itself). multiprocessing's resource tracker is left to clean up after them."""
    import psutil  # a vLLM dependency

    for process in multiprocessing.active_children():
        with contextlib.suppress(psutil.Error):
            family = psutil.Process(process.pid).children(recursive=True)  # before they are orphaned
            process.kill()
            for child in family:
                with contextlib.suppress(psutil.Error):
                    child.kill()


def event_loop_factory():
    """uvloop's event loop where it is installed (vLLM installs it, and `vllm serve` runs on it),
    else None (asyncio's own). The server's loop carries every session's messages beside the
    engine's output handler, so its speed is the server's; uvloop's transports and callbacks cost
    less a message than asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(coro):
    """`asyncio.run(coro)` on `event_loop_factory()`'s loop."""
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(coro)


class TerraServer(uvicorn.Server):
    """uvicorn's server, which ends the live sessions before closing their connections and leaves
    the process to the caller once closed: the engine is still to be stopped."""

    async def shutdown(self, sockets=None) -> None:
        await end_sessions(self.config.app)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        """Every one of `STOP_SIGNALS` asks for a graceful exit (uvicorn's `handle_exit`), and none is
        raised again after it (uvicorn's own does, and SIGTERM's default action kills the process)."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only: a ServerThread is stopped by `stop()`
            return
        before = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)


async def serve(model: str | Path, host: str = "127.0.0.1", port: int = 8000, *, sock: socket.socket | None = None,
                metrics: bool = True, decoder: str = "auto", max_sessions: int | None = None, max_frames: int = 1000,
                idle_timeout: float = IDLE_TIMEOUT_S, log_level: str = "info", log_config=uvicorn.config.LOGGING_CONFIG,
                on_ready=None, engine_args: dict | None = None, engine_shutdown_timeout: float | None = None) -> None:
    """Build the engine on this loop, serve until told to stop, stop the engine; `EngineDied` once
    the engine has died (after every session was told and uvicorn closed).

    `sock`: a bound socket to serve on (host/port ignored); `on_ready(server, app)`: called once
    uvicorn listens; `engine_args`: `make_server_engine` overrides (e.g. `max_num_seqs`,
    `data_parallel_size`); `max_sessions`: sessions and rollouts at once (None: the engine's
    `max_num_seqs` on each of its ranks; above it a `CapacityError` before the engine starts); `idle_timeout`: seconds a WebSocket may send
    nothing (`app.build_app`); `engine_shutdown_timeout`: seconds the engine core gets to exit
    before vLLM kills it (`close_engine`)."""
    def check(config) -> None:
        session_capacity(max_sessions, config.scheduler_config.max_num_seqs, config.parallel_config.data_parallel_size)

    engine = make_server_engine(model, metrics=metrics, on_config=check, **(engine_args or {}))
    watch, died = None, None
    try:
        app = build_app(engine, decoder=decoder, max_sessions=max_sessions, max_frames=max_frames, metrics=metrics,
                        idle_timeout=idle_timeout)
        # No per-message deflate: a frame's message is a few hundred bytes of codes on a local
        # network, and compressing each one (both ways, every session) is work on this loop.
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, log_config=log_config,
                                access_log=False, timeout_graceful_shutdown=10, ws_per_message_deflate=False)
        server = TerraServer(config)
        task = asyncio.create_task(server.serve(sockets=None if sock is None else [sock]))
        watch = asyncio.create_task(watch_engine(app))
        watch.add_done_callback(lambda _: setattr(server, "should_exit", True))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if on_ready is not None and server.started:
            on_ready(server, app)
        await task
        if watch.done() and not watch.cancelled():
            died = watch.result()
    finally:
        if watch is not None:
            watch.cancel()
        await close_engine(engine, engine_shutdown_timeout)
    if died is not None:
        raise EngineDied(f"the engine died ({died}); every session was told")


class ServerThread:
    """The server in this process, on its own event loop in a daemon thread, on a known port
    (0: a free one). `start()` returns once it listens (or raises what stopped it)."""

    def __init__(self, model: str | Path, host: str = "127.0.0.1", port: int = 0, **options):
        self.model, self.host, self.options = model, host, options
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.url, self.ws_url = f"http://{host}:{self.port}", f"ws://{host}:{self.port}"
        self.server = self.app = self.loop = None
        self._ready, self._error = threading.Event(), None
        self._thread = threading.Thread(target=self._run, name=f"terra-serve-{self.port}", daemon=True)

    @property
    def engine(self):
        return self.app.state.terra.engine

    def start(self, timeout: float = 600) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the server did not start within {timeout} s")
        if self._error is not None or self.app is None:
            raise RuntimeError(f"the server did not start: {self._error!r}") from self._error
        return self

    def _run(self) -> None:
        def ready(server, app):
            self.server, self.app = server, app
            self._ready.set()

        async def main():
            self.loop = asyncio.get_running_loop()
            await serve(self.model, self.host, sock=self.sock, on_ready=ready, log_level="warning", log_config=None,
                        **self.options)

        try:
            run(main())
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
        finally:
            self._ready.set()

    def call(self, coro, timeout: float | None = None):
        """Run a coroutine on the server's loop (where its engine lives) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def kv_blocks(self) -> dict | None:
        """{"free": ..., "total": ...} KV-cache blocks of the engine cores now (every rank's added up)."""
        return self.call(kv_blocks(self.engine), timeout=30)

    def stop(self, timeout: float = 60) -> None:
        """Shut down as Ctrl-C would (every session ended first), and wait for it."""
        if self.server is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(setattr, self.server, "should_exit", True)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the server did not stop within {timeout} s")

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
