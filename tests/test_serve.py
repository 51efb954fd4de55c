"""The world-model server (`terra_nb.serve`) over real HTTP and WebSocket, on the trained toy model.

One server for the module (`ServerThread`: uvicorn and the engine on their own event loop in a
thread of this process, on a free port), driven by the copyable client (`serve/client.py`) and, where
a test needs the raw protocol, by `websockets`/`httpx` directly. The reference is the in-process
`session_rollout` on the same engine (run on the server's loop): greedy frames must equal it token
for token, open loop (POST /v1/rollouts) and closed loop (WS /v1/sessions, the policy in the client).
The last test shuts the server down under an open session.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import numpy as np
import pytest
import torch

from terra_nb.port.layout import rule_of
from terra_nb.port.rollout import SamplingConfig
from terra_nb.port.session_rollout import session_rollout
from terra_nb.serve import ServerThread
from terra_nb.serve.client import AsyncClient, Client, ServerError
from terra_nb.serve.toy import ToyDecoder, arc_actions
from terra_nb.toyworld.tokenizer import toy_data_dir
from terra_nb.workbook.paths import REPO
from test_serve_protocol import vllm_refuses

GREEDY = SamplingConfig(temperature=0)
MAX_FRAMES = 6  # the server's --max-frames: a rollout of 7 is refused before the engine
IDLE_S = 6.0    # the server's --idle-timeout: long enough for every other test's client, short to wait for
P = 64


pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server():
    share = {"gpu_memory_utilization": 0.3, "enforce_eager": True} if torch.cuda.is_available() else {}
    srv = ServerThread(toy_data_dir() / "model", max_frames=MAX_FRAMES, idle_timeout=IDLE_S, engine_args=share).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, timeout=120)


@pytest.fixture(scope="module")
def toy():
    """The toy world's demo start: 3 context frames (codes) and their actions."""
    start = ToyDecoder().start
    return torch.tensor(start["context"]), torch.tensor(start["actions"], dtype=torch.float32)


def in_process(server, *args, **kwargs):
    """`session_rollout` on the server's own engine (on its loop), the reference: started now and
    run beside the client's requests (vLLM batches them), its `result()` the frames."""
    return asyncio.run_coroutine_threadsafe(session_rollout(server.engine, *args, progress=False, **kwargs),
                                            server.loop)


def ws_connect(server):
    """A raw WebSocket to /v1/sessions (entered: websockets 17 warns about a connection used without `with`)."""
    from websockets.sync.client import connect

    return connect(server.ws_url + "/v1/sessions").__enter__()


def differ(a, b) -> str:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    diff = (a != b).flatten().nonzero().flatten().tolist()
    return f"{len(diff)} of {a.numel()} codes differ, first at {diff[:5]}"


def steer(frame) -> np.ndarray:
    """A deterministic client policy: turn left after a frame whose codes sum to an odd number,
    right otherwise (so the actions depend on what was generated)."""
    return arc_actions(8.0, 0.05 if int(np.sum(frame)) % 2 else -0.05)


DOCS = (REPO / "docs" / "serving.md").read_text()


def section(text: str, heading: str) -> str:
    """A section of a markdown page: from `heading` to the next heading of its level."""
    level = heading.split(" ")[0] + " "
    body = text.split(heading + "\n", 1)[1]
    return body.split("\n" + level, 1)[0]


def flat_keys(obj: dict, prefix: str = "") -> list[str]:
    """{"a": {"b": 1}, "c": 2} -> ["a", "a.b", "c"]: every field of a JSON object, nested ones dotted."""
    keys = []
    for key, value in obj.items():
        keys.append(prefix + key)
        if isinstance(value, dict) and key != "kv_blocks":
            keys.extend(flat_keys(value, prefix + key + "."))
    return keys


def wait_for(predicate, timeout: float = 30.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()


# ---------------------------------------------------------------------------- health
def test_health_metrics_and_page(server, client):
    health = client.health()
    assert health["status"] == "ok" and health["decoder"] == "toy"
    max_num_seqs = server.engine.vllm_config.scheduler_config.max_num_seqs
    assert health["sessions"] == {"open": 0, "running": 0, "refused": 0, "served": 0, "max": max_num_seqs}
    assert health["max_num_seqs"] == max_num_seqs and health["requests"] == 0
    assert health["layout"]["image_tokens"] == P and health["round_frames"] == 25
    blocks = health["kv_blocks"]
    assert blocks is not None, "the engine core has no terra_kv_blocks utility (the plugin did not run there)"
    assert 0 < blocks["free"] < blocks["total"]
    metrics = httpx.get(server.url + "/metrics", timeout=30)
    assert metrics.status_code == 200 and "vllm:num_requests_running" in metrics.text
    page = httpx.get(server.url + "/", timeout=30)
    assert page.status_code == 200 and "/v1/sessions" in page.text and "ArrowLeft" in page.text
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", section(DOCS, "## `GET /health`"), re.M))
    fields = {key for key in flat_keys(health) if key != "sessions" and not key.startswith("layout.")}
    assert documented == fields, (sorted(fields - documented), sorted(documented - fields))
    assert all(f"`{key}`" in DOCS for key in health["layout"])


def test_the_toy_start_fields_are_documented(server):
    toy = httpx.get(server.url + "/v1/toy", timeout=60).json()
    text = section(DOCS, "## `GET /v1/toy`")
    assert all(f"`{key}`" in text for key in toy), [key for key in toy if f"`{key}`" not in text]
    assert f"`{toy['action_scale']}`" in text and f"{toy['dt']} s" in text


# ---------------------------------------------------------------------------- parity
def test_open_loop_rollout_streams_the_in_process_frames(server, client, toy):
    """POST /v1/rollouts: the frames arrive one NDJSON line each, greedy equal to `session_rollout`."""
    ctx, ctx_actions = toy
    actions = torch.cat([ctx_actions, torch.from_numpy(arc_actions(9.0, 0.03))[None]])  # 3 + 2 - 1 rows
    ref = in_process(server, ctx, actions, 2, GREEDY)
    frames = list(client.rollout(ctx, actions, 2, sampling={"temperature": 0}))
    assert [f["index"] for f in frames] == [0, 1] and all(f["ms"] > 0 for f in frames)
    got, ref = torch.tensor([f["codes"] for f in frames]), ref.result(300)
    assert got.shape == ref.shape == (2, P)
    assert torch.equal(got, ref), differ(got, ref)


def test_the_server_streams_whole_frames_and_they_equal_hf(server, client, toy):
    """The server's engine sends a frame's codes at once (vLLM's stream interval at 64 codes:
    `engine.serving_defaults`), the in-process references above run on that same engine, so here
    the frames are checked against HF's greedy rollout, an engine that streams nothing."""
    from terra_nb.port.hf_model import LlamaActionForCausalLM
    from terra_nb.port.rollout import hf_rollout

    assert server.engine.vllm_config.scheduler_config.stream_interval == P
    ctx, ctx_actions = toy
    actions = torch.cat([ctx_actions, torch.from_numpy(arc_actions(9.0, 0.03))[None].expand(2, -1, -1)])
    frames = list(client.rollout(ctx, actions, 3, sampling={"temperature": 0}))
    hf = LlamaActionForCausalLM.from_pretrained(str(toy_data_dir() / "model")).eval()
    ref = hf_rollout(hf, ctx, actions, 3, GREEDY, progress=False)
    got = torch.tensor([f["codes"] for f in frames])
    assert got.shape == ref.shape == (3, P)
    assert torch.equal(got, ref), differ(got, ref)


def test_closed_loop_session_equals_session_rollout_across_a_round(server, toy):
    """WS /v1/sessions with the policy in the client (the async client), greedy, from a 24-frame
    context: the first frame fills the window (25 frames) and the second opens a new session on
    the last 3, as `session_rollout` plans it. Equal to `session_rollout` with the same policy."""
    g = torch.Generator().manual_seed(39)
    ctx = torch.randint(0, 512, (24, P), generator=g)
    ctx_actions = torch.from_numpy(np.stack([arc_actions(6.0 + k % 5, 0.01 * (k % 3 - 1)) for k in range(24)]))

    async def drive():
        async with AsyncClient(server.url, timeout=120) as client:
            async with client.session(ctx, ctx_actions, sampling={"temperature": 0}) as s:
                frames = [s.first["codes"]]
                frames.append((await s.step(steer(frames[-1])))["codes"])
                return frames

    ref = in_process(server, ctx, ctx_actions, 2, GREEDY, policy=lambda step, frames: steer(frames[0, -1].numpy()))
    got, ref = torch.tensor(asyncio.run(drive())), ref.result(300)
    assert got.shape == ref.shape == (2, P)
    assert torch.equal(got, ref), differ(got, ref)


# ---------------------------------------------------------------------------- bad input
def test_bad_inputs_are_refused_by_rule_and_the_server_serves_on(server, client, toy):
    ctx, ctx_actions = toy
    good = {"context": ctx.tolist(), "actions": ctx_actions.tolist() * 2, "n_frames": 2, "sampling": {"temperature": 0}}
    nan_actions = ctx_actions.clone()
    nan_actions[1, 2, 0] = float("nan")
    posts = {  # rule -> request body (one request each; none reaches the engine)
        "malformed_json": b"{\"context\": [1, 2",
        "frames_shape": {**good, "context": [row[:P - 1] for row in good["context"]]},
        "code_out_of_range": {**good, "context": [[600] * P] + good["context"][1:]},
        "actions_not_finite": {**good, "actions": nan_actions.tolist() * 2},
        "too_many_frames": {**good, "n_frames": MAX_FRAMES + 1},
        "actions_missing": {**good, "actions": ctx_actions.tolist()[:3], "n_frames": 2},
        "bad_sampling": {**good, "sampling": {"temperature": -1}},
        "unknown_field": {**good, "nframes": 3},
    }
    for rule, body in posts.items():
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = httpx.post(server.url + "/v1/rollouts", content=content, timeout=30)
        error = response.json()["error"]
        assert response.status_code == 400 and error["rule"] == rule and error["ends_session"], (rule, response.text)
        if rule_of(error["message"]) is not None:  # the port's rules: the message is the rule's own
            assert rule_of(error["message"]) == rule, (rule, error["message"])

    with ws_connect(server) as ws:
        def ask(message) -> dict:
            ws.send(message if isinstance(message, str) else json.dumps(message))
            return json.loads(ws.recv(timeout=60))

        start = {"type": "start", "context": ctx.tolist(), "actions": ctx_actions.tolist(), "sampling": {"temperature": 0}}
        assert ask("not json")["rule"] == "malformed_json"
        assert ask({"type": "jump"})["rule"] == "bad_message"
        assert ask({"type": "step", "actions": steer(ctx[-1].numpy()).tolist()})["rule"] == "no_session"
        assert ask({**start, "context": ctx[:, :10].tolist()})["rule"] == "frames_shape"
        assert ask({**start, "context": (ctx + 512).tolist()})["rule"] == "code_out_of_range"
        typo = ask({**start, "samplng": {"temperature": 0}})  # a misspelled field is never ignored
        assert typo["rule"] == "unknown_field" and typo["param"] == "samplng" and not typo["ends_session"]
        assert '"samplng"' in typo["message"] and 'did you mean "sampling"' in typo["message"], typo
        assert ask({**start, "sampling": {"temprature": 0}})["param"] == "sampling.temprature"
        first = ask(start)  # the same connection serves a good start after its refusals
        assert first["type"] == "frame" and first["index"] == 0
        assert ask({"type": "step", "actions": [[0.1, 0.0, 0.1]] * 5})["rule"] == "wrong_action_shape"
        nan = ask({"type": "step", "actions": [[0, 0, 0]] * 5 + [[float("nan"), 0, 0]]})
        assert nan["rule"] == "actions_not_finite" and "frame 0 (this step's actions), slot 5" in nan["message"], nan
        assert ask({"type": "step", "actions": steer(first["codes"]).tolist(), "action": 1})["rule"] == "unknown_field"
        assert ask(start)["rule"] == "session_open"
        second = ask({"type": "step", "actions": steer(first["codes"]).tolist()})  # the session goes on
        assert second["type"] == "frame" and second["index"] == 1
        assert ask({"type": "end"}) == {"type": "end", "frames": 2, "reason": "client ended the session"}
    with pytest.raises(ServerError) as err:  # the client raises the server's refusal by rule
        list(client.rollout(ctx, ctx_actions, 2))
    assert err.value.rule == "actions_missing"
    assert client.health()["sessions"]["open"] == 0


def test_malformed_starts_and_rollouts_get_a_named_error_on_a_well_formed_connection(server, toy):
    """Values of the wrong JSON type where arrays belong, and JSON nested too deeply to read: each a
    named error (the connection stays open and serves a good start after them; POST answers 400
    with a JSON error), none reaching the engine."""
    ctx, ctx_actions = toy
    start = {"type": "start", "context": ctx.tolist(), "actions": ctx_actions.tolist(), "sampling": {"temperature": 0}}
    rollout = {"context": start["context"], "actions": start["actions"] * 2, "n_frames": 2}
    deep = "[" * 100_000 + "]" * 100_000
    wrong = [("actions", None, "wrong_action_shape"), ("actions", "straight on", "wrong_action_shape"),
             ("actions", {"x": 1}, "wrong_action_shape"), ("context", {"frames": 1}, "frames_shape")]

    def cases(message: dict) -> list[tuple[str, str]]:
        """(text, rule): `message` with a field of the wrong type, or nested too deeply, or all too deep."""
        too_deep = json.dumps(message)[:-1] + ', "image": ' + deep + "}"
        return [(json.dumps({**message, field: value}), rule) for field, value, rule in wrong] + \
            [(deep, "bad_message"), (too_deep, "bad_message")]

    with ws_connect(server) as ws:
        for text, rule in cases(start):
            ws.send(text)
            error = json.loads(ws.recv(timeout=60))
            assert error["type"] == "error" and error["rule"] == rule and not error["ends_session"], (text[:80], error)
        ws.send(json.dumps(start))
        assert json.loads(ws.recv(timeout=120))["type"] == "frame"
    for text, rule in cases(rollout):
        response = httpx.post(server.url + "/v1/rollouts", content=text, timeout=30)
        assert response.status_code == 400 and response.headers["content-type"] == "application/json", response.text
        assert response.json()["error"]["rule"] == rule, (text[:80], response.text)


def test_sampling_vllm_refuses_is_refused_before_the_engine(server, client, toy):
    """A temperature above vLLM's bound (where the installed vLLM has one), a negative seed, a top_k
    beyond what the front end can send to the engine core: `bad_sampling` naming the key, the
    session not ended and the engine not asked; the same connection then serves a good start."""
    ctx, ctx_actions = toy
    start = {"type": "start", "context": ctx.tolist(), "actions": ctx_actions.tolist()}
    refused = {"seed": -1, "top_k": 10**20, "top_p": 0}
    if vllm_refuses(temperature=2.5):
        refused["temperature"] = 2.5
    served = client.health()["sessions"]["served"]
    with ws_connect(server) as ws:
        for key, value in refused.items():
            ws.send(json.dumps({**start, "sampling": {key: value}}))
            error = json.loads(ws.recv(timeout=60))
            assert error["rule"] == "bad_sampling" and error["param"] == f"sampling.{key}", error
            assert not error["ends_session"] and f"{key}={value!r}" in error["message"], error
            body = {"context": start["context"], "actions": start["actions"], "n_frames": 1, "sampling": {key: value}}
            response = httpx.post(server.url + "/v1/rollouts", json=body, timeout=30)
            assert response.status_code == 400 and response.json()["error"]["param"] == f"sampling.{key}"
        assert client.health()["sessions"]["served"] == served  # refused before a place, before the engine
        ws.send(json.dumps({**start, "sampling": {"temperature": 2.0, "seed": 0, "top_k": 2**63}}))  # vLLM's edges
        frame = json.loads(ws.recv(timeout=120))
        assert frame["type"] == "frame", frame


def test_a_place_is_taken_at_start_and_idle_connections_are_closed(server, client, toy):
    """More connections than the server has places, each sending nothing, hold none: a real start
    is served beside them. Each is closed after the idle timeout with `idle_timeout`, and so is a
    started session left waiting between frames, whose place and KV blocks come back."""
    from websockets.exceptions import ConnectionClosed

    ctx, ctx_actions = toy
    start = json.dumps({"type": "start", "context": ctx.tolist(), "actions": ctx_actions.tolist(),
                        "sampling": {"temperature": 0}})
    places = client.health()["sessions"]["max"]
    opened = time.monotonic()
    idle = [ws_connect(server) for _ in range(places + 1)]
    assert client.health()["sessions"]["open"] == 0  # connected, not started: no place taken
    waiting = ws_connect(server)
    waiting.send(start)  # a start beside more idle connections than places: served
    assert json.loads(waiting.recv(timeout=120))["type"] == "frame", "a start refused beside idle connections"
    waited_from = time.monotonic()
    assert client.health()["sessions"]["open"] == 1
    for k, conn in enumerate([idle[0], waiting, *idle[1:]]):  # in the order they fall idle
        told = json.loads(conn.recv(timeout=IDLE_S + 60))
        if k < 2:  # timed: the first idle connection, then the session waiting for its step
            after = time.monotonic() - (waited_from if conn is waiting else opened)
            print(f"{'a session between frames' if conn is waiting else 'a connection without a start'} "
                  f"closed after {after:.2f} s (--idle-timeout {IDLE_S:g})")
            assert IDLE_S - 0.5 < after < IDLE_S + 10, after
        assert told["rule"] == "idle_timeout" and told["ends_session"] and f"{IDLE_S:g} s" in told["message"], told
        with pytest.raises(ConnectionClosed) as closed:
            conn.recv(timeout=10)
        assert closed.value.rcvd.code == 1000
    health = client.health()
    assert health["sessions"]["open"] == 0 and health["requests"] == 0, health


# ---------------------------------------------------------------------------- disconnects
def test_a_client_leaving_mid_frame_frees_its_kv_blocks(server, toy):
    """Clients that go away: a WS client while its first frame is being made, one between frames
    (its session waiting for the next step), a POST client that stops reading after a frame. Each
    request is aborted, and the engine core's free KV blocks return to their start."""
    ctx, ctx_actions = toy
    start_msg = json.dumps({"type": "start", "context": ctx.tolist(), "actions": ctx_actions.tolist(),
                            "sampling": {"temperature": 0}})
    blocks = server.kv_blocks()
    start = blocks["free"]
    # every block but vLLM's null block: the earlier tests' sessions (ended, refused, in-process) left none held
    assert start == blocks["total"] - 1, blocks

    def freed(how: str) -> None:
        assert wait_for(lambda: server.kv_blocks()["free"] == start), (
            f"KV blocks not freed after {how}: {server.kv_blocks()['free']} free, {start} at the start")

    ws = ws_connect(server)
    ws.send(start_msg)
    held = wait_for(lambda: server.kv_blocks()["free"] < start, timeout=60, every=0.02)  # the prefill is in
    assert held, "a session making its first frame holds no KV blocks"
    ws.close()
    freed("a WS disconnect mid-frame")

    ws = ws_connect(server)
    ws.send(start_msg)
    assert json.loads(ws.recv(timeout=60))["type"] == "frame"
    assert server.kv_blocks()["free"] < start, "a session between frames holds no KV blocks"
    ws.close()
    freed("a WS disconnect between frames")

    body = {"context": ctx.tolist(), "actions": ctx_actions.tolist() + [arc_actions(8.0, 0.0).tolist()] * 5,
            "n_frames": MAX_FRAMES, "sampling": {"temperature": 0}}
    with httpx.stream("POST", server.url + "/v1/rollouts", json=body, timeout=60) as response:
        assert json.loads(next(response.iter_lines()))["type"] == "frame"
    freed("a POST client left")
    health = httpx.get(server.url + "/health", timeout=30).json()
    assert health["sessions"]["open"] == 0 and health["requests"] == 0


# ---------------------------------------------------------------------------- the browser page
def test_the_page_drives_the_toy_world_in_chromium(server):
    """The page at / in a real (headless) Chromium, as tests/test_browser.py drives JupyterLab:
    Drive opens a session, frames arrive as PNGs, frames/s shows, an arrow key steers, Stop ends it."""
    from test_browser import CHROMIUM, NO_CHROMIUM

    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        args = ["--no-sandbox"] if __import__("os").geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.click("#start")
            page.wait_for_function("() => +document.getElementById('frames').textContent >= 2", timeout=60_000)
            assert page.get_attribute("#frame", "src").startswith("data:image/png;base64,")
            assert float(page.inner_text("#fps")) > 0
            before = page.input_value("#curvature")
            page.keyboard.press("ArrowLeft")
            assert float(page.input_value("#curvature")) > float(before)
            page.click("#stop")
            page.wait_for_function("() => document.getElementById('status').textContent.startsWith('ended')",
                                   timeout=60_000)
            assert "error" not in (page.get_attribute("#status", "class") or "")
        finally:
            browser.close()
    assert wait_for(lambda: httpx.get(server.url + "/health", timeout=30).json()["sessions"]["open"] == 0)


# ---------------------------------------------------------------------------- load (terra_nb.serve.load, small)
def test_a_small_load_test_passes_on_this_server(server):
    """`python -m terra_nb.serve.load` in small on this module's server: 8 sessions at once, one
    dropping mid-frame and two sending bad input (malformed JSON; NaN actions, then a good step):
    every good session equals in-process `session_rollout` greedy, none hangs, each bad input gets
    its rule, no KV block leaks."""
    from terra_nb.serve.load import LoadPlan, checks, run_load, server_target, summarize

    plan = LoadPlan(sessions=8, frames=2, drops=1, bad=2, n_contexts=2, trials=1, timeout=120)
    load = run_load(server_target(server), plan, log=lambda line: None)
    verdicts = checks(load)
    assert all(v["ok"] for v in verdicts.values()), verdicts
    assert verdicts["greedy_parity"]["compared_sessions"] == 5 + 8  # the mixed run's good ones, then all 8
    assert verdicts["bad_inputs_refused_by_rule"] == {"ok": True, "refused": 2, "bad_clients": 2,
                                                      "served_on_after_a_bad_step": 1, "bad_steps": 1}
    speed = summarize(load)
    assert speed["server"]["median"] > 0 and speed["in_process"]["median"] > 0  # the ratio is the CLI's to report


# ---------------------------------------------------------------------------- the reference's raw exchange
def test_the_raw_exchange_in_the_reference_is_what_the_server_answers(server):
    """docs/serving.md's exchange, sent again: the same frames (greedy) and the same end message."""
    block = section(DOCS, "## One exchange, raw").split("```json\n", 1)[1].split("```", 1)[0]
    lines = [(line[0], json.loads(line[2:])) for line in block.strip().splitlines()]
    assert [side for side, _ in lines] == [">", "<"] * (len(lines) // 2)
    with ws_connect(server) as ws:
        for (_, sent), (_, documented) in zip(lines[::2], lines[1::2]):
            ws.send(json.dumps(sent))
            got = json.loads(ws.recv(timeout=120))
            if got["type"] == "frame":
                got["ms"] = documented["ms"]  # a time: not the same twice
            assert got == documented


# ---------------------------------------------------------------------------- shutdown (last: stops the server)
def test_shutdown_ends_every_session_with_a_message(server, toy):
    """Stopping the server while a session's first frame is being made: the client is told, the
    connection closes with 1001 (going away), and the server, its engine included, stops."""
    from websockets.exceptions import ConnectionClosed

    ctx, ctx_actions = toy
    ws = ws_connect(server)
    ws.send(json.dumps({"type": "start", "context": ctx.tolist(), "actions": ctx_actions.tolist()}))
    assert wait_for(lambda: server.engine.output_processor.get_num_unfinished_requests() == 1, every=0.02)
    stopping = threading.Thread(target=server.stop)
    stopping.start()
    end = json.loads(ws.recv(timeout=60))
    assert end == {"type": "end", "frames": 0, "reason": "server shutting down"}
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=60)
    assert closed.value.rcvd.code == 1001
    stopping.join(60)
    assert not stopping.is_alive()


def test_the_command_line_and_make_serve():
    """`make serve` runs `python -m terra_nb.serve --model data/toy/model` (its engine start is the
    module's server above; here only the command and its options)."""
    import shutil
    import subprocess

    from terra_nb.serve.__main__ import parser
    from terra_nb.workbook.paths import REPO

    args = parser().parse_args(["--model", "m", "--port", "0", "--engine-arg", "max_num_seqs=64",
                                "--engine-arg", "kv_cache_dtype=fp8"])
    assert dict(args.engine_arg) == {"max_num_seqs": 64, "kv_cache_dtype": "fp8"} and args.max_sessions is None
    if shutil.which("make") is None:
        pytest.skip("no make here (the GPU machine): the command line is checked above, not the Makefile")
    dry = subprocess.run(["make", "-n", "-o", "setup", "serve"], cwd=REPO, capture_output=True, text=True, check=True)
    assert "-m terra_nb.serve --model data/toy/model" in dry.stdout


def test_the_vllm_names_below_its_api_the_server_uses_are_there():
    """`serve.engine.SERVING_HOOKS` on the installed vLLM (the same names on 0.26: its docstring)."""
    import importlib

    from terra_nb.serve.engine import SERVING_HOOKS

    for target in SERVING_HOOKS:
        module, qualname = target.split(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            assert hasattr(obj, part), f"{target}: vLLM {importlib.import_module('vllm').__version__} has no {part}"
            obj = getattr(obj, part)
