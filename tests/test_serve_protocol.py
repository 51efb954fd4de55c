"""The server's protocol without an engine: strict fields, one context limit, frames counted as the
session counts them, the capacity rule, wrong types and sampling refused by rule (vLLM's own
sampling rules), the stop signals' handlers, the command line, and docs/serving.md against the
code's own tables."""
from __future__ import annotations

import re

import pytest

from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout, TerraInputError
from terra_nb.port.rounds import first_round, next_round, plan_rounds
from terra_nb.serve.app import CapacityError, session_capacity
from terra_nb.serve.protocol import (ENDS_SESSION, FIELDS, PROTOCOL_RULES, SAMPLING_DEFAULTS, ProtocolError,
                                     error_message, loads, message_type, parse_rollout, parse_start, parse_step)
from terra_nb.toyworld.tokenizer import toy_data_dir
from terra_nb.workbook.paths import REPO

DOCS = (REPO / "docs" / "serving.md").read_text()
LAYOUT = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(toy_data_dir() / "model")))
MAX_MODEL_LEN = LAYOUT.max_frames * LAYOUT.frame_len
CTX = [[1] * LAYOUT.image_tokens] * 3
ACTIONS = [[[0.2, 0.0, 0.5]] * 6] * 3
START = {"type": "start", "context": CTX, "actions": ACTIONS}


def refusal(parse, *args) -> dict:
    with pytest.raises((ProtocolError, TerraInputError)) as err:
        parse(*args)
    return error_message(err.value)


@pytest.mark.parametrize("msg, field, nearest", [
    ({**START, "samplng": {"temperature": 0}}, "samplng", "sampling"),
    ({**START, "contxt": CTX}, "contxt", "context"),
    ({**START, "sampling": {"temprature": 0}}, "sampling.temprature", "temperature"),
    ({**START, "sampling": {"topk": 5}}, "sampling.topk", "top_k"),
])
def test_a_start_with_an_unknown_field_is_refused_naming_it_and_the_nearest(msg, field, nearest):
    error = refusal(parse_start, msg, LAYOUT, MAX_MODEL_LEN, True)
    assert error["rule"] == "unknown_field" and error["param"] == field and not error["ends_session"]
    assert f'"{field.split(".")[-1]}"' in error["message"] and f'did you mean "{nearest}"' in error["message"]


def test_every_message_type_refuses_unknown_fields():
    assert refusal(message_type, {"type": "end", "reason": "bye"}, ("start", "step", "end"))["param"] == "reason"
    assert refusal(parse_step, {"type": "step", "actions": ACTIONS[0], "action": 1}, LAYOUT)["param"] == "action"
    body = {"context": CTX, "actions": ACTIONS, "n_frames": 1, "nframes": 2}
    error = refusal(parse_rollout, body, LAYOUT, MAX_MODEL_LEN, True, 10)
    assert error["param"] == "nframes" and 'did you mean "n_frames"' in error["message"]


@pytest.mark.parametrize("n_ctx", [LAYOUT.max_frames, 18_859])
def test_every_too_long_context_gets_the_same_limit(n_ctx):
    error = refusal(parse_start, {**START, "context": [CTX[0]] * n_ctx}, LAYOUT, MAX_MODEL_LEN, True)
    assert error["rule"] == "too_many_frames"
    assert f"holds {n_ctx}, at most {LAYOUT.max_frames - 1} fit" in error["message"], error


def test_nan_actions_are_placed_at_the_sessions_frame():
    actions = [row for row in ACTIONS] + [[[0.2, 0.0, 0.5]] * 5 + [[0.2, float("nan"), 0.5]]]
    body = {"context": CTX, "actions": actions + ACTIONS, "n_frames": 4}  # row 3: after new frame 0
    assert "first at frame 0, slot 5" in refusal(parse_rollout, body, LAYOUT, MAX_MODEL_LEN, True, 10)["message"]
    start = {**START, "actions": [ACTIONS[0], [[float("inf"), 0, 0]] * 6, ACTIONS[0]]}
    assert "frame 1 of the context, slot 0" in refusal(parse_start, start, LAYOUT, MAX_MODEL_LEN, True)["message"]
    step = {"type": "step", "actions": [[0, 0, 0]] * 2 + [[0, 0, float("nan")]] * 4}
    assert "first at frame 7 (this step's actions), slot 2" in refusal(parse_step, step, LAYOUT, 7)["message"]


def test_max_sessions_follows_the_engine_and_never_passes_it():
    assert session_capacity(None, 32) == 32 and session_capacity(8, 32) == 8 and session_capacity(32, 32) == 32
    for too_many in (33, 128, 0):
        with pytest.raises(CapacityError, match=f"--max-sessions {too_many} must lie in 1..32"):
            session_capacity(too_many, 32)


def test_round_rollover_is_one_rule_for_plans_and_sessions():
    """A session a frame at a time (first_round, then next_round when full) opens its rounds where
    plan_rounds plans a rollout's."""
    for n_ctx, n_frames in [(3, 70), (24, 30), (1, 49)]:
        planned = plan_rounds(n_ctx, n_frames)
        stepped = [first_round(n_ctx)]
        while sum(r.n_new for r in stepped) < n_frames:
            stepped.append(next_round(stepped[-1]))
        assert [(r.index, r.start, r.n_window) for r in stepped] == [(r.index, r.start, r.n_window) for r in planned]
        assert [r.n_new for r in stepped[:-1]] == [r.n_new for r in planned[:-1]]


def test_the_reference_lists_every_rule_field_and_default():
    rules = set(re.findall(r"^\| `([a-z_]+)` \|", DOCS.split("## Errors")[1], re.M))
    assert set(PROTOCOL_RULES) <= rules, set(PROTOCOL_RULES) - rules
    for rule in ENDS_SESSION:
        assert re.search(rf"^\| `{rule}` \|.*\| yes", DOCS, re.M), rule
    for kind, fields in FIELDS.items():
        for field in fields:
            assert f"`{field}`" in DOCS or f'`"{field}"`' in DOCS, (kind, field)
    for key, value in SAMPLING_DEFAULTS.items():
        shown = "null" if value is None else str(value)
        assert re.search(rf'^\| `"{key}"` \|[^|]*\| `{shown}` \|', DOCS, re.M), (key, shown)


def section(heading: str) -> str:
    return DOCS.split(heading + "\n", 1)[1].split("\n#", 1)[0]


def test_a_wrong_type_gets_the_rule_the_reference_names():
    """docs/serving.md's table of wrong types, row by row: null, a string, an object, a boolean (or
    what else a field does not take) get the row's first rule; the second rule's case where the row
    names one."""
    table = section("## Errors").split("| Field | Of the wrong type", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (.*) \|$", table, re.M))
    assert set(rows) == set(FIELDS["start"]) | set(FIELDS["rollout"]), rows
    body = {"context": CTX, "actions": ACTIONS, "n_frames": 1}
    seconds = {"context": [[1.5] * LAYOUT.image_tokens], "actions": [[["x", 0, 0]] * 6]}
    for field, cell in rows.items():
        rules = re.findall(r"`([a-z_]+)`", cell)
        wrong = {"sampling": ["x", [1], True], "image": [None, "x", {"a": 1}, 1]}  # sampling null: the defaults
        for value in wrong.get(field, [None, "x", {"a": 1}, True]):
            got = refusal(parse_rollout, {**body, field: value}, LAYOUT, MAX_MODEL_LEN, True, 10) if field != "type" \
                else refusal(message_type, {**START, field: value}, ("start",))
            assert got["rule"] == rules[0], (field, value, got)
        if field in seconds:
            assert refusal(parse_rollout, {**body, field: seconds[field]}, LAYOUT, MAX_MODEL_LEN, True, 10)["rule"] == \
                rules[1], field


def test_json_nested_too_deeply_is_a_bad_message():
    error = refusal(loads, "[" * 100_000 + "]" * 100_000)
    assert error["rule"] == "bad_message" and "too deeply" in error["message"]


def vllm_refuses(**settings) -> bool:
    from vllm import SamplingParams

    try:
        SamplingParams(**settings)
    except Exception:  # noqa: BLE001 - whatever vLLM raises for a bad value
        return True
    return False


@pytest.mark.parametrize("key, accepted, refused", [
    ("temperature", 2.0, 2.5), ("temperature", 0, -0.1), ("seed", 0, -1), ("top_k", 2**64 - 1, 2**64),
    ("top_k", 0, -1), ("top_p", 1.0, 0.0),
])
def test_sampling_follows_vllms_own_rules_naming_the_key(key, accepted, refused):
    """What the installed vLLM refuses (its `SamplingParams`, or its front end's encoding) is
    `bad_sampling` at `sampling.<key>`; the edge values docs/serving.md states pass."""
    start = {**START, "sampling": {key: accepted}}
    assert parse_start(start, LAYOUT, MAX_MODEL_LEN, True).sampling.__dict__[key] == accepted
    if key == "temperature" and refused > 2 and not vllm_refuses(temperature=refused):
        pytest.skip(f"this vLLM takes temperature {refused}")
    error = refusal(parse_start, {**START, "sampling": {key: refused}}, LAYOUT, MAX_MODEL_LEN, True)
    assert error["rule"] == "bad_sampling" and error["param"] == f"sampling.{key}", error
    assert f"{key}={refused!r}" in error["message"] and "parameter=" not in error["message"], error


def test_every_stop_signal_asks_uvicorn_to_exit_and_none_is_raised_again():
    """SIGTERM, SIGINT, SIGHUP to this process inside `TerraServer.capture_signals`: each sets
    uvicorn's `should_exit` (the graceful shutdown), and the handlers before are back after."""
    import os
    import signal

    import uvicorn

    from terra_nb.serve.server import STOP_SIGNALS, TerraServer

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        server = TerraServer(uvicorn.Config(app=None))
        with server.capture_signals():
            os.kill(os.getpid(), sig)
            for _ in range(100):  # the handler runs between bytecodes of this thread
                if server.should_exit:
                    break
        assert server.should_exit, signal.Signals(sig).name
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def test_a_stop_signal_while_starting_kills_the_processes_being_started():
    """`StopWhileStarting`: SIGTERM while a child process runs (as the engine core does while vLLM
    waits for it) kills that child and raises `KeyboardInterrupt`, naming the signal."""
    import multiprocessing
    import os
    import signal
    import time

    from terra_nb.serve.server import STOP_SIGNALS, StopWhileStarting

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    child.start()
    stops = StopWhileStarting(force_exit_s=60)
    try:
        stops.install()
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL and stops.signal == "SIGTERM"
    finally:
        stops.stopped()  # or its timer would end this test run
        for sig, handler in before.items():
            signal.signal(sig, handler)
        child.kill()


def test_the_command_line_states_its_defaults():
    """Host, port and the idle timeout: defaults in --help and in docs/serving.md."""
    from terra_nb.serve.__main__ import parser

    args = parser().parse_args(["--model", "m"])
    assert (args.host, args.port) == ("127.0.0.1", 8000) and args.idle_timeout == 60
    assert parser().parse_args(["--model", "m", "--idle-timeout", "0.5"]).idle_timeout == 0.5
    with pytest.raises(SystemExit):
        parser().parse_args(["--model", "m", "--idle-timeout", "0"])
    text = parser().format_help()
    assert "default: 127.0.0.1" in text and "default: 8000" in text and "default: 60 s" in text, text
    assert "`127.0.0.1:8000`" in DOCS and "`--idle-timeout` seconds (default 60)" in DOCS
    assert "GET /health" in section("# The world-model server: a protocol reference")
