"""Notebook 15's helpers (`terra_nb.lessons.past_one_gpu`) and the rollouts command's result file
(`terra_nb.rollouts.timed_trials` / `result_record`), on hand-made results and the committed files;
no engine starts."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import matplotlib
import pytest

from terra_nb.lessons.past_one_gpu import (ALL_RANKS, ONE_ENGINE, ONE_RANK, load_rollout_results, on_paper, plot_scaling,
                                           ray_commands, scaling_rows, tp_figures)
from terra_nb.port.layout import FrameLayout
from terra_nb.rollouts import CPU_ENGINE, result_record

matplotlib.use("Agg")


def result(ranks, all_ranks, alone=None, device="cuda", image_tokens=576, front_end_ms=10.0, name="H200"):
    sides = {ALL_RANKS: all_ranks, **({ONE_RANK: alone} if alone is not None else {})}
    return {"ranks": ranks, "device": name, "device_type": device, "gpu_count": ranks, "cpu_count": 32,
            "commit": "abc1234", "versions": {"vllm": "0.26.0"}, "sampling": {"temperature": 0.9},
            "shapes": {"image_tokens": image_tokens, "rollouts": 256, "frames": 6},
            "rollouts_per_s": sides, "front_end_cpu_ms_per_rollout": {s: front_end_ms for s in sides},
            "trials": {s: [{}] * 3 for s in sides}}


def test_the_tp_figures_are_read_from_the_committed_file():
    tp = tp_figures()
    assert [r["rollouts"] for r in tp["rows"]] == [1, 32, 128] and tp["device"] == "NVIDIA H200"
    ratios = [r["TP=2 / TP=1"] for r in tp["rows"]]
    assert ratios[0] < 1 < ratios[1] < ratios[2] and 0 < tp["greedy_agreement"] < 1


def test_on_paper_caps_the_ranks_at_what_one_front_end_drives():
    results = {"rollouts_h200.json": result(1, 2.0, front_end_ms=25.0),
               "rollouts_cpu_dp1.json": result(1, 4.0, device="cpu", image_tokens=64, name="EPYC"),
               "rollouts_cpu_dp2.json": result(2, 6.0, 3.0, device="cpu", image_tokens=64, name="EPYC")}
    est = on_paper(results, gpus=64, gpus_per_host=8)
    assert est["file"] == "rollouts_h200.json" and est["on_gpu"] and est["model"] == "Terra"  # the GPU's file first
    assert est["dp_ratio"] is None and est["efficiency"] == 1.0  # no N-rank file of that machine: assumed free
    assert est["ceiling"] == pytest.approx(40.0) and est["ideal"] == pytest.approx(128.0)
    assert est["one_front_end"] == pytest.approx(40.0) and est["ranks_one_front_end_drives"] == pytest.approx(20.0)
    assert est["front_end_a_host"] == pytest.approx(128.0)  # 8 ranks a host (16/s) stay under 40/s
    cpu = on_paper({k: v for k, v in results.items() if "cpu" in k}, gpus=4, gpus_per_host=2)
    assert cpu["dp_ratio"] == pytest.approx(0.75) and cpu["dp_pair"] == "rollouts_cpu_dp2.json"
    assert cpu["ideal"] == pytest.approx(4 * 4.0 * 0.75) and cpu["one_front_end"] == pytest.approx(12.0)
    same_run = dict(results, **{"rollouts_cpu_dp2.json": result(2, 6.0, 3.0, device="cpu", image_tokens=64, name="EPYC")})
    same_run["rollouts_cpu_dp2.json"]["rollouts_per_s"][ONE_ENGINE] = 2.5  # timed in the same run: preferred
    assert on_paper({k: v for k, v in same_run.items() if "cpu" in k})["dp_ratio"] == pytest.approx(1.2)
    with pytest.raises(ValueError, match="no one-rank result file"):
        on_paper({"rollouts_x.json": result(2, 6.0, 3.0)})


def test_the_committed_files_read_plot_and_tabulate():
    results = load_rollout_results()
    assert results and all(name.startswith("rollouts_") for name in results)
    rows = scaling_rows(results)
    assert {r["side"] for r in rows} <= {ALL_RANKS, ONE_RANK, ONE_ENGINE} and all(r["rollouts/s"] > 0 for r in rows)
    fig = plot_scaling(results)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any("commit" in label and "cores" in label for label in labels)


def test_ray_commands_give_vllm_cpu_nodes_an_engine_slot():
    head, worker, run = ray_commands("10.0.0.1", 6380, 4)
    assert head == f"ray start --head --port 6380 --resources '{{\"{CPU_ENGINE}\": 1}}'"
    assert worker.startswith("ray start --address 10.0.0.1:6380") and CPU_ENGINE in worker
    assert run == "python -m terra_nb.rollouts --data-parallel-size 4 --ray-address 10.0.0.1:6380"
    assert all(CPU_ENGINE not in c for c in ray_commands(on_cpu=False))


def test_the_result_record_holds_medians_settings_and_provenance():
    engine = SimpleNamespace(
        model_config=SimpleNamespace(dtype="torch.bfloat16", max_model_len=14550, enforce_eager=False),
        vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=2, tensor_parallel_size=1),
                                    scheduler_config=SimpleNamespace(max_num_seqs=256),
                                    cache_config=SimpleNamespace(enable_prefix_caching=True)))
    trial = lambda s, cpu: {"seconds": s, "rollouts_per_s": 8 / s, "front_end_cpu_s": cpu}  # noqa: E731
    trials = {ALL_RANKS: [trial(1.0, 0.08), trial(2.0, 0.16), trial(4.0, 0.8)], ONE_RANK: [trial(2.0, 0.04)]}
    args = argparse.Namespace(ray_address=None, rollouts=8, frames=6, context_frames=3, temperature=0.9, top_k=None,
                              top_p=1.0, seed=0, max_in_flight=None, commit="feed123")
    r = result_record(engine, trials, FrameLayout(image_tokens=576), args, "python -m terra_nb.rollouts -n 2")
    assert r["rollouts_per_s"] == {ALL_RANKS: 4.0, ONE_RANK: 4.0} and r["ranks"] == 2 and r["dtype"] == "bfloat16"
    assert r["front_end_cpu_ms_per_rollout"][ALL_RANKS] == pytest.approx(20.0)  # the median trial: 0.16 s / 8
    assert r["commit"] == "feed123" and r["engine"]["max_num_seqs"] == 256 and r["shapes"]["image_tokens"] == 576
    assert {"device", "versions", "command", "date", "load_average_after"} <= set(r)
