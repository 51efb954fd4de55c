"""Notebook 12's logic (`terra_nb.bench.faster`): the frame-copy simulator, a step's cost and the
break-even codes per step, the bytes a step reads, on hand-made inputs and the committed files."""
from __future__ import annotations

import numpy as np
import pytest

from terra_nb.bench import faster, roofline
from terra_nb.workbook.checkpoints import preset_config

# ------------------------------------------------------------------ the simulator


def test_the_simulator_counts_the_steps_of_a_hand_built_rollout():
    """4 codes a frame, 1 action slot. Context frame [1, 2, 3, 4]; generated [1, 2, 9, 4]:
    prefill samples 1; the draft [2, 3] (one short of the frame's end) keeps 2 and the model adds
    9; the last code is a step of its own: 3 steps. Then [1, 2, 9, 4] again: prefill, then the
    draft [2, 9] is kept whole and the model adds 4: 2 steps."""
    frames = [[1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 9, 4]]
    assert faster.simulate_frame_copy(frames[:2], k=8, n_context=1, action_tokens=1) == (4, 3)
    assert faster.simulate_frame_copy(frames, k=8, n_context=1, action_tokens=1) == (8, 5)
    # k = 1: a still frame: prefill, one draft kept + one own code, then the last code alone
    assert faster.simulate_frame_copy([frames[1], frames[2]], k=1, n_context=1, action_tokens=1) == (4, 3)
    # nothing still: every code is a step of its own
    assert faster.simulate_frame_copy([[1, 2, 3, 4], [5, 6, 7, 8]], k=8, n_context=1, action_tokens=1) == (4, 4)


def test_a_still_video_takes_prefill_plus_one_step_per_k_drafts():
    P, A = 64, 6
    frames = np.tile(np.arange(P), (5, 1))  # 2 context frames, 3 generated, nothing moves
    for k, per_frame in ((1, 1 + 32), (8, 1 + 7), (16, 1 + 4), (63, 2), (100, 2)):
        # after the prefill, 63 codes: 62 drafted a step at most k of them (+1 own), the frame's end rule
        assert faster.simulate_frame_copy(frames, k, 2, A) == (3 * P, 3 * per_frame), k


def test_the_simulator_refuses_a_rollout_without_generated_frames():
    with pytest.raises(ValueError, match="n_context"):
        faster.simulate_frame_copy([[1, 2], [1, 2]], 4, 2, 1)


def test_codes_per_step_curve_pools_clips_and_rises_with_k():
    rng = np.random.default_rng(0)
    clips = rng.integers(0, 3, size=(3, 5, 16))  # three symbols: many codes repeat by chance
    curve = faster.codes_per_step_curve(clips, 2, 2, ks=(1, 4))
    codes = sum(faster.simulate_frame_copy(c, 4, 2, 2)[0] for c in clips)
    steps = sum(faster.simulate_frame_copy(c, 4, 2, 2)[1] for c in clips)
    assert curve[4] == codes / steps and 1 < curve[1] <= curve[4]


def test_still_share_is_per_position_against_the_frame_before():
    codes = np.array([[[1, 2], [1, 3], [1, 3], [0, 3]]])  # context 1 frame, 3 generated
    assert faster.still(codes, 1).tolist() == [[[True, False], [True, True], [False, True]]]
    assert faster.still_share(codes, 1).tolist() == pytest.approx([2 / 3, 2 / 3])
    with pytest.raises(ValueError, match="frames after"):
        faster.still(codes, 4)


# ------------------------------------------------------------------ a step's cost


def test_break_even_and_predicted_speedup():
    assert faster.break_even_codes_per_step(3.0, 1.5) == 2.0
    assert faster.predicted_speedup(3.0, 3.0, 1.5) == 1.5   # 3 codes a step at twice the cost
    assert faster.predicted_speedup(1.0, 1.2, 1.0) == pytest.approx(1 / 1.2)
    with pytest.raises(ValueError):
        faster.break_even_codes_per_step(0.0, 1.0)
    with pytest.raises(ValueError, match="at least its own code"):
        faster.predicted_speedup(0.5, 1.0, 1.0)


def _pairs_file():
    """Two sides, 2 rollouts, 2 trials: plain 100 codes a rollout per trial in 100 steps; spec 100
    codes in 40 steps (60 drafts accepted), each trial 1.5x as long as plain's."""
    return {"blocks": [{"name": "b2", "batch": 2, "frames": 4,
                        "trials_s": {"plain": [1.0, 3.0], "spec": [3.0, 3.0]},
                        "counters": {"plain": {"generation_tokens": 400.0, "spec_decode_num_accepted_tokens": 0.0,
                                               "codes_per_step": 1.0},
                                     "spec": {"generation_tokens": 400.0, "spec_decode_num_accepted_tokens": 240.0,
                                              "codes_per_step": 2.5}}}]}


def test_a_steps_cost_comes_from_the_median_trial_and_the_counted_steps():
    res = _pairs_file()
    assert faster.steps_per_rollout(res, "b2", "plain") == 100 and faster.steps_per_rollout(res, "b2", "spec") == 40
    assert faster.step_s(res, "b2", "plain") == pytest.approx(2.0 / 100)
    assert faster.step_cost_ratio(res, "b2", "spec", "plain") == pytest.approx((3.0 / 40) / (2.0 / 100))
    # the prediction from the step cost and the codes per step gives back the measured ratio
    ratio = faster.predicted_speedup(2.5, faster.step_s(res, "b2", "spec"), faster.step_s(res, "b2", "plain"))
    assert ratio == pytest.approx(2.0 / 3.0)


def test_the_committed_terra_file_prices_a_verification_step():
    """Random weights accept nothing (1.00 codes a step), so the step cost of frame copy against
    the sync port is the inverse of their measured speed-up, and its break-even against the async
    port the product of that cost and async scheduling's gain."""
    _, res = faster.load("spec_terra")
    fc_vs_sync = faster.pair(res, "port_fc8", "port_sync", "b1")["speedup"]
    sync_vs_port = faster.pair(res, "port_sync", "port", "b1")["speedup"]
    assert faster.codes_per_step(res, "b1", "port_fc8") == pytest.approx(1.0, abs=1e-3)
    assert faster.step_cost_ratio(res, "b1", "port_fc8", "port_sync") == pytest.approx(1 / fc_vs_sync, rel=1e-3)
    be = faster.break_even_codes_per_step(faster.step_s(res, "b1", "port_fc8"), faster.step_s(res, "b1", "port"))
    assert be == pytest.approx(1 / fc_vs_sync / sync_vs_port, rel=2e-3)
    assert 1.9 < be < 2.2


def test_provenance_is_device_versions_and_the_commit_that_ran():
    from terra_nb.bench.records import provenance

    res = dict(device="NVIDIA H100 80GB HBM3", versions=dict(vllm="0.26.0", torch="2.11.0"), commit="807ef4d",
               env=dict(git_commit="1e1d2a3-dirty"))
    assert provenance(res) == "NVIDIA H100 80GB HBM3, vLLM 0.26.0, torch 2.11.0, commit 807ef4d"
    assert provenance(dict(device="cpu", env=dict(git_commit="1e1d2a3-dirty"))) == "cpu, commit not recorded"
    assert faster.why_not_run("ValueError: Free memory on device cuda:0 (7.33/79.18 GiB) on startup is less") == \
        "did not run: too little free GPU memory when its engine started"


def test_ratio_text_says_when_there_is_no_interval():
    c = dict(speedup=0.5, interval=[0.5, 0.5], trials=1)
    assert faster.ratio_text(c) == "0.50x (1 trial a side: no interval)"
    inv = faster.inverted(dict(speedup=0.5, interval=[0.25, 1.0], trials=5, first="a", second="b"))
    assert (inv["first"], inv["speedup"], inv["interval"]) == ("b", 2.0, [1.0, 4.0])


# ------------------------------------------------------------------ bytes a step reads


def test_the_weight_split_covers_the_streamed_weights_and_fp8_halves_only_the_linears():
    cfg = preset_config("terra")
    bf16, fp8 = faster.weight_bytes_split(cfg), faster.weight_bytes_split(cfg, linear_bytes=1)
    assert sum(bf16.values()) == roofline.streamed_weight_bytes(cfg)
    assert bf16["head"] == fp8["head"] == 2 * cfg.vocab_size * cfg.hidden_size
    assert fp8["linears"] * 2 == bf16["linears"] and fp8["other"] == bf16["other"]


def test_step_bytes_kv_share_and_fp8_predictions():
    cfg = preset_config("terra")
    one, many = faster.step_bytes(cfg, 1, 3, 6), faster.step_bytes(cfg, 128, 3, 6)
    kv_one = roofline.mean_context_tokens(cfg, 3, 6) * roofline.kv_bytes_per_token(cfg)
    assert one["kv"] == pytest.approx(kv_one) and many["kv"] == pytest.approx(128 * kv_one)
    assert one["kv_share"] < 0.05 < 0.5 < many["kv_share"]
    floor = one["total"] / 3.35e12
    p = faster.fp8_predictions(cfg, 1, 3, 6, measured_step_s=2 * floor, device="NVIDIA H100 80GB HBM3")
    assert p["of_floor"] == pytest.approx(0.5)
    assert p["weights_floor"] == pytest.approx(one["total"] / (one["total"] - one["linears"] / 2))
    assert 1 < p["weights_bytes_only"] < p["weights_floor"] and 1 < p["kv_bytes_only"] < p["kv_floor"] < 1.05


def test_mean_context_tokens_matches_the_sum_over_every_code():
    cfg = preset_config("tiny")
    P, L = 64, 70
    codes = [f * L + j for f in (2, 3) for j in range(P)]
    assert roofline.mean_context_tokens(cfg, 2, 2) == pytest.approx(sum(codes) / len(codes))


def test_the_figures_draw_from_small_inputs():
    maps = {"a": np.zeros(64), "b": np.linspace(0, 1, 64)}
    assert len(faster.still_maps_plot(maps).axes) == 2 + 1   # two maps and the colour bar
    curves = {"w": {1: 1.2, 8: 2.0}}
    fig = faster.speculation_plot(curves, {"e": 1.5}, [dict(k=8, codes_per_step=1.3, speedup=0.9)])
    assert [len(ax.lines) for ax in fig.axes][1] == 1 + 1 + 1 + 1   # the curve, the point, its legend entry, y = 1
    rows = [{"clips": "a", "counted by": "vLLM", "codes/step": 1.5, "pos 1": "50%", "pos 2": "25%"},
            {"clips": "a", "counted by": "simulation", "codes/step": 1.5, "pos 1": "50%", "pos 2": "25%"}]
    ax = faster.acceptance_plot(rows).axes[0]
    assert [round(p.get_height(), 2) for p in ax.patches] == [0.5, 0.25] and len(ax.lines) == 1


def test_acceptance_counts_drafts_and_positions_as_vllm_does():
    """Per draft: the draft reaches positions 1..len, is accepted through the agreeing prefix; a step
    with no draft (a frame's first code, the frame's last) counts no draft."""
    frames = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 9, 3, 4]]   # frame 2 copies frame 1; frame 3 differs at 2
    r = faster.frame_copy_acceptance(frames, k=8, n_context=1, action_tokens=1)
    # frame 2: the prefill samples 1; draft [2, 3] (one short of the frame's end) accepted, own 4
    # frame 3: the prefill samples 1; draft [2, 3] rejected at once, own 9; draft [3] accepted, own 4
    assert (r["codes"], r["steps"], r["drafts"], r["draft_codes"], r["accepted"]) == (8, 5, 3, 5, 3)
    assert r["accepted_per_pos"][:3] == [2, 1, 0] and r["drafted_per_pos"][:3] == [3, 2, 0]
    assert (r["codes"], r["steps"]) == faster.simulate_frame_copy(frames, 8, 1, 1)
    assert r["codes"] == r["steps"] + r["accepted"]   # every step one own code, plus what it accepted


def test_the_committed_acceptance_run_counts_what_the_simulation_counts():
    """vLLM's spec-decode counters on the CPU equal the simulation's on every clip, per position, and
    its greedy codes equal HF's: the run that explains the simulated-vs-measured gap by the clips."""
    _, res = faster.load("spec_acceptance_toy")
    for c in res["clips"]:
        v, s = c["vllm"], c["simulated"]
        assert c["codes_equal"] == c["codes"], c["clip"]
        assert v["generation_tokens"] == s["codes"] and v["spec_decode_num_accepted_tokens"] == s["accepted"]
        assert v["spec_decode_num_drafts"] == s["drafts"] and v["accepted_per_pos"] == s["accepted_per_pos"]
    rows = faster.acceptance_rows(res, {"w": ["GPU toy workload"]})
    assert rows[0]["codes/step"] == rows[1]["codes/step"] > 1
