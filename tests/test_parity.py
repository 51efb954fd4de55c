"""Token-by-token rollout comparison and the per-step prefix-cache table (no engine needed)."""
from __future__ import annotations

import pytest
import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.lessons.parity import predicted_reuse, prefix_cache_steps, token_parity
from terra_nb.port.vllm_rollout import RolloutStats

TINY = FrameLayout(image_tokens=64, action_tokens=6, max_frames=25, vocab_size=513)


def test_identical_rollouts():
    a = torch.randint(0, 512, (3, 64), generator=torch.Generator().manual_seed(0))
    p = token_parity(a, a.clone())
    assert p == {"frames": 3, "tokens": 192, "equal": 192, "mismatches": 0, "identical": True,
                 "equal_per_frame": [64, 64, 64], "first_mismatch": None}


def test_first_mismatch_is_the_earliest_frame_over_all_rollouts():
    a = torch.zeros(2, 3, 64, dtype=torch.long)
    b = a.clone()
    b[0, 2, 5] = 1  # rollout 0, frame 2
    b[1, 1, 40] = 1  # rollout 1, frame 1: earlier in the video
    b[1, 1, 41] = 1
    p = token_parity(a, b)
    assert p["first_mismatch"] == {"rollout": 1, "frame": 1, "index": 40}
    assert p["mismatches"] == 3 and p["equal"] == 2 * 3 * 64 - 3 and not p["identical"]
    assert p["equal_per_frame"] == [128, 126, 127]


def test_shapes_must_match():
    with pytest.raises(ValueError, match="differ in shape"):
        token_parity(torch.zeros(2, 64), torch.zeros(3, 64))
    with pytest.raises(ValueError, match=r"\[n_frames, P\]"):
        token_parity(torch.zeros(64), torch.zeros(64))


def test_prefix_cache_steps_one_round_batch_of_two():
    st = RolloutStats(per_call_cached=[[0, 0], [208, 208], [272, 272]])
    rows = prefix_cache_steps(st, n_ctx=3, n_frames=3, layout=TINY)
    assert [r["prompt_frames"] for r in rows] == [3, 4, 5]
    assert [r["prompt_tokens"] for r in rows] == [420, 560, 700]
    assert [r["cached"] for r in rows] == [0, 416, 544]
    assert [r["computed"] for r in rows] == [420, 144, 156]
    assert rows[1]["hit_rate"] == round(416 / 560, 3) and {r["round"] for r in rows} == {0}


def test_prefix_cache_steps_follow_the_rounds():
    # 3 context + 23 new frames: round 0 makes 22 (prompts of 3..24 frames), round 1 restarts from 3
    st = RolloutStats(per_call_cached=[[0]] * 23)
    rows = prefix_cache_steps(st, n_ctx=3, n_frames=23, layout=TINY)
    assert rows[21]["prompt_frames"] == 24 and rows[21]["round"] == 0
    assert rows[22]["prompt_frames"] == 3 and rows[22]["round"] == 1
    with pytest.raises(ValueError, match="fresh RolloutStats"):
        prefix_cache_steps(st, n_ctx=3, n_frames=4, layout=TINY)


def test_predicted_reuse_is_the_computed_tokens_in_full_blocks():
    # tiny: F = 70, P = 64. After a 3-frame prompt the engine computed 210 + 63 tokens.
    assert predicted_reuse(3, TINY, 128) == 256 and predicted_reuse(3, TINY, 16) == 272
    assert [predicted_reuse(n, TINY, 128) for n in range(3, 8)] == [256, 256, 384, 384, 512]
    st = RolloutStats(per_call_cached=[[0, 0], [272, 272], [336, 336]])
    rows = prefix_cache_steps(st, n_ctx=3, n_frames=3, layout=TINY, block_size=16)
    assert [r["predicted"] for r in rows] == [None, 544, 672]   # a batch of two: twice one rollout's


def test_a_rounds_first_step_has_no_prediction():
    st = RolloutStats(per_call_cached=[[0]] * 23)
    rows = prefix_cache_steps(st, n_ctx=3, n_frames=23, layout=TINY, block_size=16)
    assert rows[0]["predicted"] is None and rows[22]["predicted"] is None
    assert rows[21]["predicted"] == predicted_reuse(23, TINY, 16)
