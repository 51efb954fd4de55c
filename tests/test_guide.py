"""The settings guide of notebook 12: measurements gathered from pairs files, verdicts read off the
interval, the table with what is not yet measured, the advice, and the step-profile figure."""
from __future__ import annotations

import json

import pytest

from terra_nb.bench import guide, lever_plans
from terra_nb.workbook.checkpoints import preset_config


def _file(folder, name, date, analysis, preset="terra"):
    (folder / name).write_text(json.dumps(dict(kind="interleaved", preset=preset, date=date, device="NVIDIA H100 80GB HBM3",
                                               versions=dict(vllm="0.26.0"), commit="abc1234", analysis=analysis)))


def _c(first, batch, frames, speedup, interval, trials=5, second="port"):
    return dict(first=first, second=second, batch=batch, frames=frames, speedup=speedup, interval=interval, trials=trials)


def test_measurements_take_the_newest_file_per_cell_and_only_settings_against_the_port(tmp_path):
    _file(tmp_path, "h100_old_fp8kv.json", "2026-11-26 10:00:00 UTC", [_c("port_fp8kv", 128, 3, 0.94, [0.89, 1.26])])
    _file(tmp_path, "h100_guide_fp8.json", "2026-11-28 03:00:00 UTC",
          [_c("port_fp8kv", 128, 3, 1.10, [1.04, 1.15]), _c("port_fp8w", 1, 3, 0.97, [0.95, 0.99]),
           _c("port_fp8", 1, 3, 1.0, [0.9, 1.1], second="port_fp8kv"), _c("stock", 1, 3, 1.0, [0.9, 1.1])])
    _file(tmp_path, "h100_toy_spec.json", "2026-11-28 03:00:00 UTC", [_c("port_sync", 1, 12, 1.0, [0.9, 1.1])], preset="toy")
    meas = guide.guide_measurements(tmp_path)
    assert set(meas) == {("port_fp8kv", 128, 3), ("port_fp8w", 1, 3)}
    assert meas["port_fp8kv", 128, 3]["file"] == "h100_guide_fp8.json" and "H100" in meas["port_fp8kv", 128, 3]["provenance"]
    rows = guide.guide_rows(meas, [(1, 3), (128, 3), (1, 8)])
    assert [(r["rollouts"], r["frames"]) for r in rows] == [(1, 3), (128, 3), (1, 8)]
    assert rows[1]["FP8 KV cache"] == "1.10x [1.04, 1.15]: pays" and rows[0]["FP8 weights"].endswith(": costs")
    assert rows[2]["FP8 KV cache"] == rows[0]["async scheduling off"] == "not yet measured"
    quality = {"port_fp8kv": dict(text="1.14 points: costs more")}
    advice = {r["rollouts"]: r for r in guide.guide_advice(meas, quality)}
    assert advice[128]["use"] == "FP8 KV cache (quality: 1.14 points: costs more)"
    assert advice[1]["use"].startswith("the port as it ships") and advice[32]["use"] == "not yet measured"


@pytest.mark.parametrize("interval, trials, verdict", [([1.01, 1.2], 5, "pays"), ([0.8, 0.99], 5, "costs"),
                                                        ([0.9, 1.1], 5, "no difference measured"),
                                                        ([1.2, 1.2], 1, "one trial, no interval")])
def test_a_setting_pays_only_when_its_whole_interval_clears_one(interval, trials, verdict):
    assert guide.guide_verdict(dict(interval=interval, trials=trials)) == verdict


def test_every_guide_setting_has_a_label_and_the_fp8_ones_a_quality_check_in_the_committed_files():
    from terra_nb.bench import faster

    assert set(guide.GUIDE_LABELS) == set(lever_plans.GUIDE_SETTINGS)
    costs = guide.quality_costs(faster.load_all())
    assert set(costs) == set(lever_plans.GUIDE_SETTINGS)
    assert costs["port_fp8kv"]["verdict"] == "costs more" and costs["port_fp8w"]["verdict"] == "within"


def _profile(device="NVIDIA H100 80GB HBM3"):
    parts = dict(scheduler=0.2, input_preparation=0.1, sampling=0.1, forward=0.3, waiting_for_gpu=1.2,
                 output_processing=0.05, front_end_rest=0.05)
    return dict(env=dict(device=device), spec=dict(n_ctx=3, decode_steps=128, batch=128),
                steps=[dict(batch=b, steps=128, wall_ms_per_step=2.0 * b ** 0.25, parts_ms_per_step=parts) for b in (1, 128)],
                kernels=[dict(label=f"decode: {b} x 128 tokens", device_us_per_step=1500.0,
                              device_us_per_step_by_kind=dict(attention=200.0, matmul=1100.0, other=200.0)) for b in (1, 128)])


def test_step_rows_put_the_step_beside_its_kernels_and_its_floor():
    from terra_nb.bench import roofline

    cfg = preset_config("terra")
    rows = guide.step_rows(_profile(), cfg)
    assert [r["rollouts"] for r in rows] == [1, 128] and rows[0]["GPU kernels (ms)"] == 1.5
    floor_1 = roofline.decode_step_floor_s(cfg, 1, 3 * 582 + 64, 3.35e12)
    assert rows[0]["memory floor (ms)"] == pytest.approx(1e3 * floor_1, abs=1e-3) and rows[0]["GPU busy"] == "75%"
    fig = guide.step_breakdown_plot(_profile(), cfg)
    assert len(fig.axes) == 2 and len(fig.axes[0].patches) == 7 + 3   # the host's seven parts, three kinds of kernel
    failed = dict(_profile(), steps=[dict(batch=1, wall_s=0.1, error="no engine step was clocked")] + _profile()["steps"][1:])
    assert [r["rollouts"] for r in guide.step_rows(failed, cfg)] == [128] and len(guide.step_breakdown_plot(failed, cfg).axes) == 1
