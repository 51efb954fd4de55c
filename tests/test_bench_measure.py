"""Measuring from a notebook: rows grouped one engine per process, run and merged (the HF row), and the
seed-setting rows of issue 25 measured in-process on the tiny preset."""
from __future__ import annotations

import dataclasses

import pytest

from terra_nb.bench import (measure as bench_measure, render as bench_render, results as bench_results, runner as bench_runner,
                            timing as bench_timing, workload as bench_workload)


def test_engine_groups_one_process_per_engine():
    assert bench_workload.engine_groups(["hf", "vllm"]) == [["hf", "vllm"]]
    assert bench_workload.engine_groups(["vllm_b8", "hf", "stock_llama", "vllm_eager", "vllm"]) == [
        ["hf", "vllm_eager"], ["vllm", "vllm_b8"], ["stock_llama"]]
    assert bench_workload.engine_groups(["hf"]) == [["hf"]]
    assert bench_workload.engine_groups(["stock_llama_b128", "vllm_b64", "stock_llama"]) == [
        ["vllm_b64"], ["stock_llama", "stock_llama_b128"]]  # curve rows: any batch, smallest first
    with pytest.raises(ValueError, match="unknown row"):
        bench_workload.engine_groups(["hf", "vllm_b0"])


def test_measure_runs_the_cli_in_a_subprocess_and_merges(tmp_path):
    wl = bench_workload.Workload(preset="tiny", short_frames=1, short_repeats=1)
    res = bench_runner.measure(["hf"], wl, tmp_path / "ckpt", tmp_path / "parts", timeout=600)
    (row,) = res["rows"]
    assert row["name"] == "hf" and row["frames"] == 1 and row["repeats"] == 1 and row["s_per_frame"] > 0
    assert res["workload"]["preset"] == "tiny" and res["errors"] == [] and "--short-frames 1" in row["command"]
    assert (tmp_path / "ckpt" / "tiny_v1" / "config.json").exists()
    assert "| HF `generate` + KV cache" in bench_render.results_table(res)


def test_workload_for_presets():
    assert bench_workload.workload_for("terra") == bench_workload.Workload()
    tiny = bench_workload.workload_for("tiny")
    assert (tiny.short_frames, tiny.short_repeats, tiny.long_frames, tiny.long_repeats) == (3, 2, 6, 3)
    assert bench_workload.workload_for("tiny", long_frames=4).long_frames == 4
    assert bench_workload.default_rows("cpu") == ["hf", "vllm"] and "stock_llama" in bench_workload.default_rows("cuda")


def test_report_rows_put_the_seed_first():
    res = {"rows": [bench_timing.trial_row("hf", 1, 4, [36.0]), bench_timing.trial_row("vllm_b8", 8, 22, [22.0])]}
    rows = bench_render.report_rows(res)
    assert [r["row"] for r in rows[:2]] == list(bench_workload.SEED_FIGURES)
    assert rows[1]["x_hf"] == round(11.03 / 4.25, 2)
    assert rows[2]["x_hf"] == 1.0 and rows[3]["x_hf"] == round(8.0 / (4 / 36.0), 2)
    assert bench_render.report_rows({"rows": []})[0]["s_per_frame"] == 11.03


def test_seed_rows_are_their_own_engines():
    assert [bench_workload.row_batch(r) for r in bench_workload.SEED_ROWS] == [1] * 5
    assert bench_workload.engine_groups(["vllm_seed", "hf_seed", "vllm"]) == [["vllm"], ["hf_seed"], ["vllm_seed"]]
    with pytest.raises(ValueError, match="unknown row"):
        bench_workload.row_batch("hf_seed_b8")


def test_seed_setting_rows_measure_the_seeds_video_with_the_seeds_engine(tmp_path):
    """HF and the port on the seed's workload (one call per frame, temperature 1.0), the port with
    the seed's engine settings as the engine reports them; HF's static cache + torch.compile path
    measures (a cache of one round, passed explicitly)."""
    from terra_nb.bench.measure import HF_STATIC_NEEDS
    from terra_nb.bench.runner import run

    wl = bench_workload.Workload(preset="tiny", long_frames=2, long_repeats=1)
    res = run(["hf_seed", "vllm_seed"], wl, tmp_path / "ckpt", steps=bench_measure.StepSpec((1,), 2))
    # hf_static on a one-frame video: torch.compile traces the model again for every prompt length
    # (a second frame cost ~7 s of tracing on the 2-core machine and tests nothing more)
    static = run(["hf_static"], dataclasses.replace(wl, long_frames=1), tmp_path / "ckpt")
    by = {r["name"]: r for r in res["rows"] + static["rows"]}
    # what each frame of HF's video cost, and the port's frame steps over its own video
    assert len(by["hf_seed"]["frame_s"]) == 2 and sum(by["hf_seed"]["frame_s"]) <= by["hf_seed"]["trials_s"][0] + 1e-3
    # each trial's frames too, summing to at most that trial's seconds
    assert [len(t) for t in by["hf_seed"]["frame_s_trials"]] == [2] * len(by["hf_seed"]["trials_s"])
    assert all(sum(t) <= s + 1e-3 for t, s in zip(by["hf_seed"]["frame_s_trials"], by["hf_seed"]["trials_s"]))
    # the allocator's driver calls per trial: counted on a GPU, None here
    import torch

    allocs = by["hf_seed"]["device_allocs"]
    assert len(allocs) == len(by["hf_seed"]["trials_s"])
    assert all(isinstance(a, int) and a >= 0 for a in allocs) if torch.cuda.is_available() else allocs == [None] * len(allocs)
    prof = by["vllm_seed"]["step_profile"]
    assert prof["mode"] == "frame loop" and prof["batch"] == 1 and [f["index"] for f in prof["by_frame"]] == [1]
    assert by["hf_seed"]["temperature"] == 1.0 and by["hf_seed"]["calls_per_trial"] == 2
    assert by["hf_seed"]["tokens_per_call"] == by["vllm_seed"]["tokens_per_call"] == 64
    assert by["vllm_seed"]["engine"] == {"enforce_eager": True, "enable_prefix_caching": False, "max_num_seqs": 5}
    assert all(by[r]["frames"] == 2 and by[r]["s_per_frame"] > 0 for r in ("hf_seed", "vllm_seed"))
    assert not [e for e in static["errors"] if e["group"] == "hf_static"], (static["errors"], HF_STATIC_NEEDS)
    assert by["hf_static"]["engine"] == {"cache": "static", "compile": True, "compile_mode": "reduce-overhead", "cache_len": 25 * 70}
    assert len(by["hf_static"]["frame_s"]) == 1 and by["hf_static"]["warmup_s"] > 0
    merged = bench_results.merge([res])
    assert merged["ratios"]["seed_setting_vs_hf"] == by["hf_seed"]["s_per_frame"] / by["vllm_seed"]["s_per_frame"]


def test_a_static_cache_of_one_round_gives_the_seeds_video_token_for_token():
    """HF `generate` on a `StaticCache` sized by `static_cache` (emptied before every call) draws the
    same greedy video as its default dynamic cache: 3 frames of 64 codes, the last on a prompt of 5."""
    import torch

    from terra_nb.port.checkpoints import preset_config
    from terra_nb.port.hf_model import LlamaActionForCausalLM
    from terra_nb.port.layout import FrameLayout
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.bench.measure import seed_video, static_cache
    from terra_nb.workbook.data import load_sample

    torch.manual_seed(0)
    model = LlamaActionForCausalLM(preset_config("tiny")).eval()
    layout, sample = FrameLayout.from_config(model.config), load_sample("tiny")
    wl = bench_workload.Workload(preset="tiny", long_frames=3)
    greedy = SamplingConfig(temperature=0.0)
    cache = static_cache(model, layout)
    assert cache.max_cache_len == 25 * 70
    dynamic = seed_video(model, wl, sample, layout, greedy)
    static = seed_video(model, wl, sample, layout, greedy, cache=cache)
    assert dynamic.shape == (1, 6 * 64) and torch.equal(static, dynamic)


def test_hf_seed_flash_keeps_cudnn_out_and_draws_hf_seeds_tokens(tmp_path):
    """`hf_seed_flash` is HF's seed row with SDPA limited to `HF_FLASH_BACKENDS` (cuDNN's plans per
    key length out): the limit changes which kernel runs, not the video (greedy, token for token),
    and the row says which kernels it allowed."""
    import torch

    from terra_nb.port.layout import FrameLayout
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.bench.engines import load_hf
    from terra_nb.bench.measure import HF_FLASH_BACKENDS, seed_video
    from terra_nb.bench.runner import run
    from terra_nb.bench.timing import sdpa_backends
    from terra_nb.bench.workload import checkpoint
    from terra_nb.workbook.data import load_sample

    wl = bench_workload.Workload(preset="tiny", long_frames=1, long_repeats=1)
    model, _ = load_hf(checkpoint(tmp_path / "ckpt", wl))
    layout, sample = FrameLayout.from_config(model.config), load_sample(wl.preset)
    greedy = SamplingConfig(temperature=0.0)
    plain = seed_video(model, wl, sample, layout, greedy)
    with sdpa_backends(HF_FLASH_BACKENDS):
        limited = seed_video(model, wl, sample, layout, greedy)
    assert torch.equal(plain, limited) and plain.shape[1] == 4 * layout.image_tokens
    # the limit is real: cuDNN alone has no kernel on the CPU; after it, torch chooses again
    assert "CUDNN_ATTENTION" not in HF_FLASH_BACKENDS
    if not torch.cuda.is_available():
        with sdpa_backends(("CUDNN_ATTENTION",)), pytest.raises(RuntimeError):
            seed_video(model, wl, sample, layout, greedy)
    assert torch.equal(seed_video(model, wl, sample, layout, greedy), plain)

    # the row's trials run under its limit: limited to cuDNN alone, the CPU has no kernel to run
    if not torch.cuda.is_available():
        from terra_nb.bench.measure import bench_hf_seed

        with pytest.raises(RuntimeError):
            bench_hf_seed(checkpoint(tmp_path / "ckpt", wl), wl, sdpa=("CUDNN_ATTENTION",))
    res = run(["hf_seed_flash"], wl, tmp_path / "ckpt")
    (row,) = res["rows"]
    assert row["name"] == "hf_seed_flash" and row["engine"]["sdpa"] == list(HF_FLASH_BACKENDS)
    assert row["engine"]["cache"] == "dynamic" and row["frames"] == 1 and row["s_per_frame"] > 0
