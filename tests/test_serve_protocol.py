"""The server's protocol without an engine: strict fields, one context limit, frames counted as the
session counts them, the capacity rule, and docs/serving.md against the code's own tables."""
from __future__ import annotations

import re

import pytest

from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout, TerraInputError
from terra_nb.port.rounds import first_round, next_round, plan_rounds
from terra_nb.serve.app import CapacityError, session_capacity
from terra_nb.serve.protocol import (ENDS_SESSION, FIELDS, PROTOCOL_RULES, SAMPLING_DEFAULTS, ProtocolError,
                                     error_message, message_type, parse_rollout, parse_start, parse_step)
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
