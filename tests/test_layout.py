"""Token layout: spatio-temporal indices, interleaving plan, prompts and every validator's error."""
from __future__ import annotations

import pytest
import torch

from terra_nb.port.config import FrameLayout
from terra_nb.port.layout import (
    SEED_PLACEHOLDER,
    action_slot_mask,
    build_prompt,
    from_seed_prompt,
    interleave_segments,
    segments_length,
    spatio_temporal_indices,
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
    with pytest.raises(ValueError, match="too many frames: the prompt has 26"):
        validate_prompt(build_prompt(torch.zeros(26, 64, dtype=torch.long), TINY), TINY)
    bad = list(ok)
    bad[70 + 66] = 5
    with pytest.raises(ValueError, match="wrong action slots: frame 1 slot 2 holds 5"):
        validate_prompt(bad, TINY)
    bad = list(ok)
    bad[70 + 3] = 512
    with pytest.raises(ValueError, match="image code out of range: frame 1 position 3 holds 512"):
        validate_prompt(bad, TINY)


def test_validate_codes_errors():
    good = torch.randint(0, 512, (2, 3, 64))
    assert validate_codes(good.int(), TINY).dtype == torch.int64
    with pytest.raises(ValueError, match="must hold integer codes"):
        validate_codes(good.float(), TINY)
    with pytest.raises(ValueError, match=r"shape \[\.\.\., n_frames, 64\]"):
        validate_codes(good[..., :60], TINY)
    with pytest.raises(ValueError, match="too many frames: context has 26"):
        validate_codes(torch.zeros(26, 64, dtype=torch.long), TINY)
    with pytest.raises(ValueError, match="image code out of range in context: 512"):
        validate_codes(torch.full((1, 64), 512), TINY)
    with pytest.raises(ValueError, match="out of range in context: -1"):
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
    with pytest.raises(ValueError, match=r"item 1 has shape \[5, 3\]"):
        validate_actions([torch.zeros(6, 3), torch.zeros(5, 3)], TINY)
    with pytest.raises(ValueError, match="must be numbers"):
        validate_actions(torch.zeros(2, 6, 3, dtype=torch.bool), TINY)
    with pytest.raises(ValueError, match=r"wrong action shape: got \[2, 5, 3\]"):
        validate_actions(torch.zeros(2, 5, 3), TINY)
    with pytest.raises(ValueError, match=r"wrong action shape: got \[13, 3\]"):
        validate_actions(torch.zeros(13, 3), TINY)
    with pytest.raises(ValueError, match="NaN or inf"):
        validate_actions(torch.tensor([[[float("nan")] * 3] * 6]), TINY)
    with pytest.raises(ValueError, match="cover 2 frames but 3 are needed"):
        validate_actions(torch.zeros(2, 6, 3), TINY, n_frames=3)


def test_grid_shape():
    assert TERRA.grid_shape == (18, 32)
    assert TINY.grid_shape == (8, 8)
    assert FrameLayout(image_tokens=12).grid_shape[0] * FrameLayout(image_tokens=12).grid_shape[1] == 12


def test_codes_before():
    from terra_nb.port.layout import codes_before

    assert [codes_before(p, TINY) for p in (0, 5, 64, 66, 70, 71, 140)] == [0, 5, 64, 64, 64, 65, 128]


def test_validate_prompt_refuses_ids_that_are_not_ints():
    ok = build_prompt(torch.randint(0, 512, (2, 64)), TINY)
    with pytest.raises(ValueError, match="must be a flat list of ints, got torch.float32"):
        validate_prompt([t + 0.5 for t in ok], TINY)  # would be truncated to the good prompt
    with pytest.raises(ValueError, match="must be a flat list of ints, got torch.int64 of shape \\[1, 140\\]"):
        validate_prompt([ok], TINY)
    with pytest.raises(ValueError, match="prompt token ids could not be read as numbers"):
        validate_prompt([2**70] + ok[1:], TINY)
    assert validate_prompt(torch.tensor(ok, dtype=torch.int32), TINY) == 2


def test_validate_actions_refuses_data_that_is_not_numbers():
    with pytest.raises(ValueError, match="actions could not be read as numbers"):
        validate_actions("abc", TINY)
    with pytest.raises(ValueError, match="actions item 1 could not be read as numbers"):
        validate_actions([torch.zeros(6, 3), None], TINY)
