"""Notebook 12's figures (`terra_nb.bench.guide`): measurements gathered per GPU from pairs files,
verdicts read off the interval, the tables, the quality costs, the step profile against the memory
floor, and frame copy's break-even, on hand-made files and the committed ones."""
from __future__ import annotations

import json

import pytest

from terra_nb.bench import guide, lever_plans, roofline
from terra_nb.workbook.checkpoints import preset_config

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def _file(folder, name, date, analysis, preset="terra", device=H100):
    (folder / name).write_text(json.dumps(dict(kind="interleaved", preset=preset, date=date, device=device,
                                               versions=dict(vllm="0.26.0"), commit="abc1234", analysis=analysis)))


def _c(first, batch, frames, speedup, interval, trials=5, second="port"):
    return dict(first=first, second=second, batch=batch, frames=frames, speedup=speedup, interval=interval, trials=trials)


def test_measurements_are_per_gpu_the_newest_file_per_cell_and_only_settings_against_the_port(tmp_path):
    _file(tmp_path, "h100_old_fp8kv.json", "2026-11-26 10:00:00 UTC", [_c("port_fp8kv", 128, 3, 0.94, [0.89, 1.26])])
    _file(tmp_path, "h100_guide_fp8.json", "2026-11-28 03:00:00 UTC",
          [_c("port_fp8kv", 128, 3, 1.10, [1.04, 1.15]), _c("port_fp8w", 1, 3, 0.97, [0.95, 0.99]),
           _c("port_fp8", 1, 3, 1.0, [0.9, 1.1], second="port_fp8kv"), _c("stock", 1, 3, 1.0, [0.9, 1.1])])
    _file(tmp_path, "h200_guide_sync.json", "2026-11-27 03:00:00 UTC", [_c("port_sync", 1, 3, 0.6, [0.5, 0.7])],
          device=H200)
    _file(tmp_path, "h100_toy_spec.json", "2026-11-28 03:00:00 UTC", [_c("port_sync", 1, 12, 1.0, [0.9, 1.1])], preset="toy")
    meas = guide.guide_measurements(tmp_path)
    assert set(meas) == {(H100, "port_fp8kv", 128, 3), (H100, "port_fp8w", 1, 3), (H200, "port_sync", 1, 3)}
    assert meas[H100, "port_fp8kv", 128, 3]["file"] == "h100_guide_fp8.json"
    assert guide.devices(meas) == [H100, H200]
    rows = guide.guide_rows(meas, H100)
    assert [(r["rollouts"], r["frames"]) for r in rows] == [(1, 3), (128, 3)]   # the H200's workload is its own table
    assert rows[1]["FP8 KV cache"] == "1.10x [1.04, 1.15]: pays" and rows[0]["FP8 weights"].endswith(": costs")
    assert rows[0]["async scheduling off"] == "not measured"
    assert [(c["device"], c["side"]) for c in guide.by_verdict(meas, guide.COSTS)] == [(H100, "port_fp8w"), (H200, "port_sync")]
    assert guide.by_verdict(meas, guide.COSTS, "port_sync", H100) == []


@pytest.mark.parametrize("interval, trials, verdict", [([1.01, 1.2], 5, "pays"), ([0.8, 0.99], 5, "costs"),
                                                        ([0.9, 1.1], 5, "no difference measured"),
                                                        ([1.2, 1.2], 1, "one trial, no interval")])
def test_a_setting_pays_only_when_its_whole_interval_clears_one(interval, trials, verdict):
    assert guide.guide_verdict(dict(interval=interval, trials=trials)) == verdict


def test_every_guide_setting_has_a_label_and_the_fp8_ones_a_quality_check_in_the_committed_files():
    assert set(guide.GUIDE_LABELS) == set(lever_plans.GUIDE_SETTINGS)
    costs = guide.quality_costs({kind: guide.load(kind) for kind, _ in guide.GUIDE_QUALITY.values()})
    assert set(costs) == set(lever_plans.GUIDE_SETTINGS)
    assert costs["port_fp8kv"]["verdict"] == "costs more" and costs["port_fp8w"]["verdict"] == "within"
    assert guide.quality_costs({})["port_fp8kv"] == dict(text="not measured")


def test_load_wants_exactly_one_file_of_a_kind(tmp_path):
    (tmp_path / "a_spec_terra.json").write_text("{}")
    assert guide.load("spec_terra", tmp_path)["path"].name == "a_spec_terra.json"
    (tmp_path / "b_spec_terra.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="a_spec_terra.json"):
        guide.load("spec_terra", tmp_path)


def _profile(device=H100):
    parts = dict(scheduler=0.2, input_preparation=0.1, sampling=0.1, forward=0.3, waiting_for_gpu=1.2,
                 output_processing=0.05, front_end_rest=0.05)
    return dict(env=dict(device=device), spec=dict(n_ctx=3, decode_steps=128, batch=128),
                steps=[dict(batch=b, steps=128, wall_ms_per_step=2.0 * b ** 0.25, parts_ms_per_step=parts) for b in (1, 128)],
                kernels=[dict(label=f"decode: {b} x 128 tokens", device_us_per_step=1500.0,
                              device_us_per_step_by_kind=dict(attention=200.0, matmul=1100.0, other=200.0)) for b in (1, 128)])


def test_step_rows_give_the_step_and_its_kernels_as_multiples_of_the_memory_floor():
    cfg = preset_config("terra")
    rows = guide.step_rows(_profile(), cfg)
    assert [r["rollouts"] for r in rows] == [1, 128] and rows[0]["GPU kernels (ms)"] == 1.5
    floor_ms = 1e3 * roofline.decode_step_floor_s(cfg, 1, 3 * 582 + 64, 3.35e12)
    assert rows[0]["memory floor (ms)"] == pytest.approx(floor_ms, abs=1e-3)
    assert rows[0]["step, x the memory floor"] == pytest.approx(2.0 / floor_ms, abs=0.01)
    assert rows[0]["kernels, x the memory floor"] == pytest.approx(1.5 / floor_ms, abs=0.01)
    fig = guide.step_breakdown_plot(_profile(), cfg)
    assert len(fig.axes) == 2 and len(fig.axes[0].patches) == 7 + 3   # the host's seven parts, three kinds of kernel
    failed = dict(_profile(), steps=[dict(batch=1, wall_s=0.1, error="no engine step was clocked")] + _profile()["steps"][1:])
    assert [r["rollouts"] for r in guide.step_rows(failed, cfg)] == [128] and len(guide.step_breakdown_plot(failed, cfg).axes) == 1


def test_the_committed_step_profile_is_slower_than_its_floor():
    (prof,) = guide.step_profile_files().values()
    for row in guide.step_rows(prof, preset_config("terra")):
        assert row["step, x the memory floor"] > row["kernels, x the memory floor"] > 1


def test_break_even_on_the_committed_terra_file_is_the_verification_cost_times_async_off():
    """Random weights accept nothing (1.00 codes a step), so the break-even of frame copy against
    the port as it ships is what its step costs: the verification's cost against the sync port
    times what async scheduling off costs."""
    res = guide.load("spec_terra")
    fc_vs_sync = guide.pair(res, "port_fc8", "port_sync", "b1")["speedup"]
    sync_vs_port = guide.pair(res, "port_sync", "port", "b1")["speedup"]
    assert guide.block(res, "b1")["counters"]["port_fc8"]["codes_per_step"] == pytest.approx(1.0, abs=1e-3)
    be = guide.break_even(res, "port_fc8", "port", "b1")
    assert be == pytest.approx(1 / fc_vs_sync / sync_vs_port, rel=5e-3) and 1.9 < be < 2.2
    # the toy model accepted drafts: its speed-up is its codes per step over its break-even
    toy = guide.load("spec_toy_greedy")
    cps = guide.block(toy, "b1")["counters"]["port_fc8"]["codes_per_step"]
    assert cps / guide.break_even(toy, "port_fc8", "port", "b1") == pytest.approx(guide.pair(toy, "port_fc8", "port", "b1")["speedup"])
