"""The server as an operator runs it: `python -m terra_nb.serve` in a process of its own, with
vLLM's default multiprocess engine (an engine-core process and its workers), on the toy model.
Where a test is about the engine core and the sessions rather than the process tree (capacity, a
dead engine), the model runs in the engine core's process (the suite's setting), one fewer
process importing vLLM.

* **Stop signals.** SIGTERM (what systemd, Docker and Kubernetes send) to the server's process
  alone, with sessions open: every session gets its "end" message, and the server's whole process
  tree (server, `VLLM::EngineCore`, its workers) is gone within 30 s, the port free again. SIGINT
  and SIGHUP take the same handler (tests/test_serve_protocol.py sends them to it). SIGTERM while
  the engine starts stops the start, the engine's processes too.
* **Deaths.** `kill -9` on the server: its engine's processes go with it. The engine killed under
  open sessions: each is told (`engine_dead`), and the server exits with status 1.
* **Capacity.** An engine that schedules 2 sequences at once (`max_num_seqs=2`) and a server that
  follows it: with 2 sessions open a third start is refused with `server_full` at once, a POST gets
  503 with `Retry-After`, and the 2 sessions stream on; `/health` tells open, running and refused
  apart. A `--max-sessions` above the engine's `max_num_seqs` stops the start with a clear error
  before any engine process starts.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from terra_nb.serve.toy import ToyDecoder
from terra_nb.toyworld.tokenizer import toy_data_dir

pytestmark = pytest.mark.engine

GONE_WITHIN_S = 30
CORE_GONE_WITHIN_S = 5
START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """A new server could listen on `port` (as uvicorn binds: SO_REUSEADDR, so the closed
    connections' TIME_WAIT does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            return True
        except OSError:
            return False


def server_env(workers: bool) -> dict:
    """This test run's environment; with `workers`, vLLM's default engine (the model in a worker
    process beside the engine core): the test suite's in-process setting is dropped."""
    env = dict(os.environ)
    if workers:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return env


class ServerProcess:
    """`python -m terra_nb.serve` on the toy model in a new process group (so that a failed test
    can still clean up everything it started); `tree()` is the server and every descendant."""

    def __init__(self, tmp_path, *args: str, workers: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "server.log"
        cmd = [sys.executable, "-m", "terra_nb.serve", "--model", str(toy_data_dir() / "model"),
               "--port", str(self.port), "--log-level", "warning", *args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=server_env(workers), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> dict:
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(timeout=5) as client:  # one client: each new one loads the CA bundle (~30 ms of CPU)
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, f"the server exited ({self.proc.returncode}):\n{self.output()}"
                try:
                    return client.get(self.url + "/health").json()
                except httpx.TransportError:
                    time.sleep(0.25)
        raise TimeoutError(f"the server did not listen within {START_TIMEOUT_S} s:\n{self.output()}")

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def cleanup(self) -> None:
        """Whatever is left of the process group (only after a failure: the tests check it is empty)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


def alive(processes: list[psutil.Process]) -> list[str]:
    """Those of `processes` still running (same pid and start time; a zombie is gone)."""
    left = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {p.name()}")
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.fixture
def toy_start():
    start = ToyDecoder().start
    return {"type": "start", "context": start["context"], "actions": start["actions"], "sampling": {"temperature": 0}}


def open_session(url: str, start: dict):
    """A WebSocket session, started: (the connection, its first frame)."""
    from websockets.sync.client import connect

    ws = connect(url.replace("http", "ws", 1) + "/v1/sessions", open_timeout=60).__enter__()
    ws.send(json.dumps(start))
    first = json.loads(ws.recv(timeout=300))
    assert first["type"] == "frame" and first["index"] == 0, first
    return ws, first


def step(ws, actions) -> dict:
    ws.send(json.dumps({"type": "step", "actions": actions}))
    return json.loads(ws.recv(timeout=300))


def engine_tree(server: ServerProcess) -> list[psutil.Process]:
    """The server's process tree, which must hold vLLM's engine core."""
    tree = server.tree()
    names = " ".join(p.name() for p in tree)
    assert any("EngineCore" in p.name() for p in tree), f"no engine core under the server ({names})"
    return tree


def gone(tree: list[psutil.Process], why: str, server: ServerProcess) -> float:
    """Wait until every process of `tree` has exited (at most `GONE_WITHIN_S`): the seconds it took."""
    began = time.monotonic()
    while alive(tree) and time.monotonic() - began < GONE_WITHIN_S:
        time.sleep(0.1)
    left = alive(tree)
    assert not left, f"{len(left)} of the server's processes left {GONE_WITHIN_S} s after {why}: {left}\n" \
                     f"{server.output()}"
    return time.monotonic() - began


def stop_and_check(server: ServerProcess, sig: int, sessions: list) -> None:
    """Send `sig` to the server's process alone (as `kill` does): every session is told, and the
    whole tree is gone within `GONE_WITHIN_S`, its port free."""
    tree = engine_tree(server)
    os.kill(server.proc.pid, sig)
    for ws in sessions:
        end = json.loads(ws.recv(timeout=GONE_WITHIN_S))
        assert end["type"] == "end" and end["reason"] == "server shutting down", end
    gone(tree, signal.Signals(sig).name, server)
    assert server.proc.wait(5) == 0, server.output()
    assert port_is_free(server.port), f"port {server.port} still held after {signal.Signals(sig).name}"


def test_sigterm_at_capacity_refuses_the_extra_session_at_once_then_stops_every_process(tmp_path, toy_start):
    server = ServerProcess(tmp_path, "--engine-arg", "max_num_seqs=2", workers=False)
    try:
        health = server.wait_ready()
        assert health["sessions"] == {"open": 0, "running": 0, "refused": 0, "served": 0, "max": 2}, health
        assert health["max_num_seqs"] == 2
        a, first_a = open_session(server.url, toy_start)
        b, first_b = open_session(server.url, toy_start)

        # the third start: refused at once, the connection closed "try again later" (1013)
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.client import connect

        began = time.monotonic()
        c = connect(server.url.replace("http", "ws", 1) + "/v1/sessions").__enter__()  # the server closes it
        c.send(json.dumps(toy_start))
        refusal = json.loads(c.recv(timeout=2))
        assert time.monotonic() - began < 2
        assert refusal["rule"] == "server_full" and refusal["ends_session"] is True, refusal
        assert "max_num_seqs" in refusal["message"], refusal
        with pytest.raises(ConnectionClosed) as closed:
            c.recv(timeout=5)
        assert closed.value.rcvd.code == 1013

        body = {k: toy_start[k] for k in ("context", "actions", "sampling")}
        body["actions"] = body["actions"] * 2
        began = time.monotonic()
        response = httpx.post(server.url + "/v1/rollouts", json={**body, "n_frames": 2}, timeout=2)
        assert time.monotonic() - began < 2
        assert response.status_code == 503 and int(response.headers["Retry-After"]) >= 1, response
        assert response.json()["error"]["rule"] == "server_full"

        # the two open sessions stream on
        actions = toy_start["actions"][-1]
        for ws in (a, b):
            frame = step(ws, actions)
            assert frame["type"] == "frame" and frame["index"] == 1, frame
        health = httpx.get(server.url + "/health", timeout=30).json()
        assert health["sessions"] == {"open": 2, "running": 0, "refused": 2, "served": 2, "max": 2}, health
        assert health["requests"] == 2, health  # each open session holds its engine request between frames

        stop_and_check(server, signal.SIGTERM, [a, b])
    finally:
        server.cleanup()


def test_kill_9_on_the_server_takes_its_engine_with_it(tmp_path, toy_start):
    """SIGKILL leaves the server no say; the engine core was started to die with it (prctl's
    PR_SET_PDEATHSIG): gone within a few seconds. Its worker follows the engine core by vLLM's own
    rule (it watches a pipe from it, then shuts down), and with it the rest of the tree."""
    server = ServerProcess(tmp_path, "--engine-arg", "max_num_seqs=2")
    try:
        server.wait_ready()
        ws, _ = open_session(server.url, toy_start)
        tree = engine_tree(server)
        core = [p for p in tree if "EngineCore" in p.name()]
        os.kill(server.proc.pid, signal.SIGKILL)
        began = time.monotonic()
        while alive(core) and time.monotonic() - began < CORE_GONE_WITHIN_S:
            time.sleep(0.05)
        assert not alive(core), f"the engine core outlived kill -9 on the server by {CORE_GONE_WITHIN_S} s"
        core_s = time.monotonic() - began
        took = gone(tree, "kill -9 on the server", server)
        print(f"after kill -9 on the server: its engine core gone in {core_s:.2f} s, every process in {took:.2f} s")
    finally:
        server.cleanup()


def test_a_dead_engine_tells_every_session_and_the_server_exits_non_zero(tmp_path, toy_start):
    """The engine core killed under a session between frames and a rollout mid-stream: the session
    gets `engine_dead` and its connection closes with 1011, the rollout's stream ends with the same
    error line (HTTP 200 was sent with its first frame), and the server exits with status 1, every
    process of it gone, so that a supervisor starts it again."""
    from websockets.exceptions import ConnectionClosed

    server = ServerProcess(tmp_path, "--engine-arg", "max_num_seqs=2", workers=False)
    try:
        server.wait_ready()
        ws, first = open_session(server.url, toy_start)
        body = {k: toy_start[k] for k in ("context", "actions", "sampling")}
        body["actions"] = body["actions"] + [toy_start["actions"][-1]] * 60
        tree = engine_tree(server)
        with httpx.stream("POST", server.url + "/v1/rollouts", json={**body, "n_frames": 60}, timeout=60) as rollout:
            lines = rollout.iter_lines()
            assert json.loads(next(lines))["type"] == "frame"
            os.kill(next(p.pid for p in tree if "EngineCore" in p.name()), signal.SIGKILL)
            killed = time.monotonic()
            last = [json.loads(line) for line in lines][-1]
        assert last["type"] == "error" and last["rule"] == "engine_dead", last
        told = json.loads(ws.recv(timeout=GONE_WITHIN_S))
        assert told["type"] == "error" and told["rule"] == "engine_dead" and told["ends_session"], told
        assert "GET /health" in told["message"], told
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=GONE_WITHIN_S)
        assert closed.value.rcvd.code == 1011
        assert server.proc.wait(GONE_WITHIN_S) == 1, server.output()
        print(f"the server exited (status 1) {time.monotonic() - killed:.2f} s after its engine core was killed")
        gone(tree, "the engine's death", server)
        assert "terra_nb.serve: the engine died" in server.output(), server.output()
    finally:
        server.cleanup()


def test_sigterm_while_the_engine_starts_stops_the_start(tmp_path):
    """SIGTERM once the engine core's process exists, before /health answers: the start stops, every
    process goes, the server never listens, and it exits with status 0."""
    server = ServerProcess(tmp_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not any("EngineCore" in p.name() for p in server.tree()[1:]):
            assert server.proc.poll() is None and time.monotonic() < deadline, server.output()
            time.sleep(0.1)
        time.sleep(1)  # the front end now waits for the engine core (vLLM's start-up handshake)
        tree = server.tree()
        os.kill(server.proc.pid, signal.SIGTERM)
        took = gone(tree, "SIGTERM while starting", server)
        print(f"every process of the server was gone {took:.2f} s after SIGTERM while starting")
        assert server.proc.wait(5) == 0, server.output()
        assert "terra_nb.serve: stopped by SIGTERM" in server.log.read_text(errors="replace"), server.output()
        with pytest.raises(httpx.TransportError):
            httpx.get(server.url + "/health", timeout=2)
    finally:
        server.cleanup()


def test_max_sessions_above_the_engine_is_refused_before_the_engine_starts(tmp_path):
    server = ServerProcess(tmp_path, "--max-sessions", "3", "--engine-arg", "max_num_seqs=2")
    try:
        assert server.proc.wait(START_TIMEOUT_S) != 0
        out = server.output()
        assert "--max-sessions 3 must lie in 1..2" in out and "max_num_seqs=2" in out, out
        assert "Traceback" not in out, out
        assert "EngineCore" not in out, f"an engine core started:\n{out}"
    finally:
        server.cleanup()
