"""Token layout: spatio-temporal indices, interleaving plan, prompts and every validator's error."""
from __future__ import annotations

import re

import pytest
import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.port.interleave import action_slot_mask, interleave_segments, segments_length, spatio_temporal_indices
from terra_nb.port.layout import (
    RULES,
    SEED_PLACEHOLDER,
    TerraInputError,
    build_prompt,
    from_seed_prompt,
    validate_actions,
    validate_codes,
    validate_prompt,
)

TERRA = FrameLayout()
TINY = FrameLayout(image_tokens=64, action_tokens=6, max_frames=25, action_dim=3, vocab_size=513)


def test_spatio_temporal_indices_terra():
    pos = torch.tensor([0, 1, 575, 576, 581, 582, 583, 1163, 1164, 14549])
    s, t = spatio_temporal_indices(pos, TERRA.frame_len)
    assert s.tolist() == [0, 1, 575, 576, 581, 0, 1, 581, 0, 581]
    assert t.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 2, 24]


def test_spatio_temporal_indices_keep_shape():
    pos = torch.arange(140).view(2, 70)
    s, t = spatio_temporal_indices(pos, TINY.frame_len)
    assert s.shape == t.shape == (2, 70)
    assert torch.equal(s[1], torch.arange(70)) and torch.equal(t[1], torch.ones(70, dtype=torch.long))


def test_action_slot_mask():
    m = action_slot_mask(2 * TINY.frame_len + 3, TINY)
    assert m.sum().item() == 12
    assert m[64:70].all() and not m[:64].any() and m[134:140].all() and not m[140:].any()


def test_segments_prefill_whole_frames():
    segs = interleave_segments(0, 3 * 64, TINY)
    assert segs == [("codes", 0, 64), ("actions", 0, 0), ("codes", 64, 128), ("actions", 1, 1),
                    ("codes", 128, 192), ("actions", 2, 2)]
    assert segments_length(segs, TINY) == 3 * 70


def test_segments_partial_last_frame_gets_no_actions():
    segs = interleave_segments(0, 64 + 10, TINY)
    assert segs == [("codes", 0, 64), ("actions", 0, 0), ("codes", 64, 74)]
    assert segments_length(segs, TINY) == 80


def test_segments_decode_steps():
    # a code in the middle of frame 2
    assert interleave_segments(2 * 70 + 5, 1, TINY) == [("codes", 0, 1)]
    # the last code of frame 2: its actions follow in the same step (7 positions)
    segs = interleave_segments(2 * 70 + 63, 1, TINY)
    assert segs == [("codes", 0, 1), ("actions", 2, 2)]
    assert segments_length(segs, TINY) == 7
    # the first code of frame 3 comes after the action slots
    assert interleave_segments(3 * 70, 1, TINY) == [("codes", 0, 1)]


def test_segments_reject_a_cache_ending_inside_action_slots():
    with pytest.raises(ValueError, match="inside the action slots of frame 1"):
        interleave_segments(70 + 66, 1, TINY)
    with pytest.raises(ValueError, match=">= 0"):
        interleave_segments(-1, 1, TINY)


def test_build_prompt_and_seed_conversion():
    frames = torch.arange(2 * 64).view(2, 64)
    ids = build_prompt(frames, TINY)
    assert len(ids) == 140 and ids[64:70] == [512] * 6 and ids[70] == 64 and ids[134:] == [512] * 6
    seed = build_prompt(frames, TINY, placeholder=SEED_PLACEHOLDER)
    assert seed[64:70] == [-3] * 6
    assert from_seed_prompt(seed, TINY) == ids
    with pytest.raises(ValueError, match=r"shape \[n_frames, 64\]"):
        build_prompt(torch.zeros(2, 63, dtype=torch.long), TINY)


def test_validate_prompt_accepts_both_placeholders():
    frames = torch.randint(0, 512, (3, 64))
    assert validate_prompt(build_prompt(frames, TINY), TINY) == 3
    assert validate_prompt(build_prompt(frames, TINY, placeholder=SEED_PLACEHOLDER), TINY) == 3


def test_validate_prompt_errors():
    ok = build_prompt(torch.randint(0, 512, (2, 64)), TINY)
    with pytest.raises(ValueError, match="not frame-aligned: 139 tokens"):
        validate_prompt(ok[:-1], TINY)
    with pytest.raises(ValueError, match="not frame-aligned: 0 tokens"):
        validate_prompt([], TINY)
    with pytest.raises(TerraInputError, match="too many frames: the prompt holds 26, at most 25 fit"):
        validate_prompt(build_prompt(torch.zeros(26, 64, dtype=torch.long), TINY), TINY)
    bad = list(ok)
    bad[70 + 66] = 5
    with pytest.raises(TerraInputError, match=r"wrong action slots: position 136 \(frame 1, action slot 2\) holds 5"):
        validate_prompt(bad, TINY)
    bad = list(ok)
    bad[70 + 3] = 512
    with pytest.raises(TerraInputError, match=r"image code out of range: position 73 \(frame 1, image code 3\) holds 512"):
        validate_prompt(bad, TINY)


def test_validate_codes_errors():
    good = torch.randint(0, 512, (2, 3, 64))
    assert validate_codes(good.int(), TINY).dtype == torch.int64
    with pytest.raises(ValueError, match="must hold integer codes"):
        validate_codes(good.float(), TINY)
    with pytest.raises(ValueError, match=r"shape \[\.\.\., n_frames, 64\]"):
        validate_codes(good[..., :60], TINY)
    with pytest.raises(TerraInputError, match="too many frames: context holds 26"):
        validate_codes(torch.zeros(26, 64, dtype=torch.long), TINY)
    with pytest.raises(TerraInputError, match=r"image code out of range: context\[0, 0\] holds 512"):
        validate_codes(torch.full((1, 64), 512), TINY)
    with pytest.raises(TerraInputError, match=r"out of range: context\[0, 0\] holds -1"):
        validate_codes(torch.full((1, 64), -1), TINY)


def test_validate_actions_forms():
    a = torch.randn(4, 6, 3)
    assert torch.equal(validate_actions(a, TINY), a)
    assert torch.equal(validate_actions(a.reshape(24, 3), TINY), a)
    assert torch.equal(validate_actions(list(a), TINY), a)
    assert validate_actions(a.long(), TINY).dtype == torch.float32


def test_validate_actions_errors():
    with pytest.raises(ValueError, match="empty list"):
        validate_actions([], TINY)
    with pytest.raises(TerraInputError, match=r"got item 1 of shape \[5, 3\]"):
        validate_actions([torch.zeros(6, 3), torch.zeros(5, 3)], TINY)
    with pytest.raises(ValueError, match="must be numbers"):
        validate_actions(torch.zeros(2, 6, 3, dtype=torch.bool), TINY)
    with pytest.raises(ValueError, match=r"wrong action shape: got \[2, 5, 3\]"):
        validate_actions(torch.zeros(2, 5, 3), TINY)
    with pytest.raises(ValueError, match=r"wrong action shape: got \[13, 3\]"):
        validate_actions(torch.zeros(13, 3), TINY)
    with pytest.raises(TerraInputError, match=r"NaN or inf \(first at frame 1, slot 4\)"):
        validate_actions(torch.zeros(2, 6, 3).index_put_((torch.tensor(1), torch.tensor(4)), torch.tensor(float("nan"))), TINY)
    with pytest.raises(ValueError, match="cover 2 frames but 3 are needed"):
        validate_actions(torch.zeros(2, 6, 3), TINY, n_frames=3)


def test_grid_shape():
    assert TERRA.grid_shape == (18, 32)
    assert TINY.grid_shape == (8, 8)
    assert FrameLayout(image_tokens=12).grid_shape[0] * FrameLayout(image_tokens=12).grid_shape[1] == 12


def test_codes_before():
    from terra_nb.port.interleave import codes_before

    assert [codes_before(p, TINY) for p in (0, 5, 64, 66, 70, 71, 140)] == [0, 5, 64, 64, 64, 65, 128]


def test_validate_prompt_refuses_ids_that_are_not_ints():
    ok = build_prompt(torch.randint(0, 512, (2, 64)), TINY)
    with pytest.raises(TerraInputError, match=r"must be a flat list of ints, got float \d+\.5 at position 0"):
        validate_prompt([t + 0.5 for t in ok], TINY)  # would be truncated to the good prompt
    with pytest.raises(TerraInputError, match="must be a flat list of ints, got list"):
        validate_prompt([ok], TINY)
    with pytest.raises(TerraInputError, match="token id 1180591620717411303424 at position 0 is out of vocabulary"):
        validate_prompt([2**70] + ok[1:], TINY)
    assert validate_prompt(torch.tensor(ok, dtype=torch.int32), TINY) == 2


def test_validate_actions_refuses_data_that_is_not_numbers():
    with pytest.raises(ValueError, match="actions must be numbers, got str"):
        validate_actions("abc", TINY)
    with pytest.raises(ValueError, match="actions item 1 must be numbers, got NoneType"):
        validate_actions([torch.zeros(6, 3), None], TINY)


# ---------------------------------------------------------------------------- the rule table
def _one_of_each_refusal():
    """rule id -> a call that breaks exactly that rule (every rule of RULES appears once)."""
    from terra_nb.port import engine_limits, interleave, rounds
    from terra_nb.port import layout as L

    ok = build_prompt(torch.zeros(2, 64, dtype=torch.long), TINY)
    return {
        "prompt_not_token_ids": lambda: L.token_array("a road"),
        "ids_not_ints": lambda: L.token_array([1.5, 2]),
        "id_negative": lambda: L.check_plain_prompt([3, -1], TINY),
        "id_out_of_vocab": lambda: L.check_plain_prompt([3, 513], TINY),
        "not_frame_aligned": lambda: validate_prompt(ok[:-1], TINY),
        "wrong_action_slots": lambda: validate_prompt(ok[:64] + [7] * 6 + ok[70:], TINY),
        "code_out_of_range": lambda: validate_prompt([600] + ok[1:], TINY),
        "too_many_frames": lambda: L.normalize_prompt(ok, TINY, max_frames=1, why="a test"),
        "session_chunk": lambda: L.normalize_session_chunk([5] + [512] * 5, 1, 3, TINY),
        "slots_without_actions": lambda: L.check_plain_prompt(ok, TINY),
        "plain_prompt_too_long": lambda: L.check_plain_prompt([1] * 65, TINY),
        "generation_window": lambda: L.check_generation_window(60, 5, TINY),
        "sequence_too_long": lambda: interleave.interleave_step(24 * 70, 65, TINY, torch.zeros(1, 25, 6, 3)),
        "ends_in_action_slots": lambda: interleave_segments(70 + 66, 1, TINY),
        "actions_not_numbers": lambda: validate_actions("abc", TINY),
        "wrong_action_shape": lambda: validate_actions(torch.zeros(2, 5, 3), TINY),
        "actions_not_finite": lambda: validate_actions(torch.full((1, 6, 3), float("inf")), TINY),
        "actions_missing": lambda: interleave.interleave_step(0, 64, TINY, None),
        "actions_mismatch": lambda: L.check_actions_match(2, 3, TINY),
        "unknown_modality": lambda: L.check_modality("image"),
        "batch_mismatch": lambda: L.batched_actions(torch.zeros(2, 1, 6, 3), 3, TINY),
        "codes_not_ints": lambda: validate_codes(torch.zeros(1, 64), TINY),
        "frames_shape": lambda: build_prompt(torch.zeros(2, 63, dtype=torch.long), TINY),
        "out_of_bounds": lambda: rounds.plan_rounds(3, 0),
        "max_model_len": lambda: engine_limits.check_max_model_len(26 * 70, TINY),
    }


def test_a_session_chunk_is_the_dropped_code_and_its_slots_with_one_item():
    from terra_nb.port.layout import normalize_session_chunk as chunk

    assert chunk([5] + [512] * 6, 1, 3, TINY) == [5] + [512] * 6
    assert chunk([0, -3, 512, -3, -3, 512, 512], 1, 23, TINY) == [0] + [512] * 6  # -3 rewritten; 24 frames fit
    refusals = [
        ([5] + [512] * 6 + [5], 1, 3, "session_chunk"),
        ([512] * 7, 1, 3, "code_out_of_range"),
        ([5, 7] + [512] * 5, 1, 3, "wrong_action_slots"),
        ([5] + [512] * 6, 0, 3, "actions_mismatch"),
        ([5] + [512] * 6, 2, 3, "actions_mismatch"),
        ([5] + [512] * 6, 1, 25, "too_many_frames"),
        ([-1] + [512] * 6, 1, 3, "code_out_of_range"),  # where a bad id sits names the rule, as in prompts
        ([5, 513] + [512] * 5, 1, 3, "wrong_action_slots"),
        ([5, 2**64] + [512] * 5, 1, 3, "id_out_of_vocab"),
        ([5.0] + [512] * 6, 1, 3, "ids_not_ints"),
    ]
    for ids, n_items, before, rule in refusals:
        with pytest.raises(TerraInputError) as err:
            chunk(ids, n_items, before, TINY)
        assert err.value.rule == rule, (ids, n_items, before, str(err.value))
    with pytest.raises(TerraInputError, match=r"position 203 \(frame 2, image code 63\) holds 512"):
        chunk([512] * 7, 1, 2, TINY)  # named where it sits in the session
    with pytest.raises(TerraInputError, match="too many frames: the session's prompt holds 5, at most 4"):
        chunk([5] + [512] * 6, 1, 4, TINY, max_frames=4, why="a test")


def test_every_rule_refuses_with_its_own_id_param_and_message():
    from terra_nb.port.layout import rule_of

    cases = _one_of_each_refusal()
    assert set(cases) == set(RULES)
    for rule, call in cases.items():
        with pytest.raises(TerraInputError) as err:
            call()
        assert err.value.rule == rule
        assert err.value.param == RULES[rule].param or rule == "too_many_frames"  # it names prompt or context
        assert rule_of(str(err.value)) == rule, (rule, str(err.value))  # the text alone names the rule
        assert rule_of(f"prefix: {err.value} (parameter=x)") == rule  # as vLLM's error prints it
    assert rule_of("some other error") is None


def test_each_rule_message_is_written_once_in_the_package():
    """`grep` finds every rule's message text once: the RULES table, nowhere else in the port or
    its lessons (the toy world and the workbook check inputs of their own, in their own words)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "terra_nb"
    # adjacent string literals joined, so that a message split over source lines reads as one
    sources = {p: re.sub(r'"\s*\n\s*f?"', "", p.read_text())
               for sub in ("port", "lessons") for p in (root / sub).rglob("*.py")}
    import terra_nb.port.layout as L

    layout_py = root / "port" / "layout.py"
    sources[layout_py] = sources[layout_py].replace(L.__doc__, "")  # its table quotes the messages
    for rule in RULES.values():
        # the first words of the rule's first literal phrase of 3 words or more
        words = next(p.split() for p in re.split(r"\{[a-z_]*\}", rule.template) if len(p.split()) >= 3)
        head = " ".join(words[:4])
        hits = [str(p.relative_to(root)) for p, text in sources.items() for _ in re.finditer(re.escape(head), text)]
        assert hits == ["port/layout.py"], (rule.id, head, hits)


def test_the_docstring_table_lists_every_rule_with_its_param():
    import terra_nb.port.layout as L

    rows = re.findall(r"^\| `([a-z_]+)` \| ([a-z_]+) \|", L.__doc__, re.M)
    assert dict(rows) == {r.id: r.param for r in RULES.values()}
