"""`terra_nb.serve.load` without an engine: who does what in a load, the command line, and the
committed result files (`results/serve/*.json`) against their own trials. The load itself runs on a
real server in tests/test_serve.py (`test_a_small_load_test_passes_on_this_server`)."""
from __future__ import annotations

import statistics

import pytest

from terra_nb.serve.load import BAD_INPUTS, BAD_STEPS, LoadPlan, load_results, parser, result_row, roles


def test_roles_spread_the_drops_and_bad_clients():
    plan = LoadPlan(sessions=64, drops=4, bad=4)
    r = roles(plan)
    assert len(r) == 64 and r.count("drop") == 4 and r.count("bad") == 4
    specials = [i for i, role in enumerate(r) if role != "good"]
    assert min(b - a for a, b in zip(specials, specials[1:])) >= 7  # spread over the list, not bunched
    small = roles(LoadPlan(sessions=8, frames=2, drops=1, bad=2, n_contexts=2))
    assert small.count("good") == 5 and small.count("drop") == 1 and small.count("bad") == 2
    assert set(BAD_STEPS) <= set(BAD_INPUTS) and BAD_INPUTS[1] in BAD_STEPS  # two bad clients: one bad step


@pytest.mark.parametrize("kwargs, message", [
    ({"sessions": 4, "drops": 2, "bad": 2}, "no good session"),
    ({"frames": 1}, "frames >= 2"),
    ({"trials": 0}, "trials >= 1"),
    ({"sessions": 2, "n_contexts": 4, "drops": 0, "bad": 0}, "cannot use 4 contexts"),
])
def test_a_plan_that_cannot_run_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoadPlan(**kwargs)


def test_the_command_line():
    args = parser().parse_args(["--sessions", "256", "--frames", "6", "--out", "results/serve/gpu.json",
                                "--engine-arg", "max_num_seqs=256"])
    assert (args.sessions, args.frames, args.trials, dict(args.engine_arg)) == (256, 6, 3, {"max_num_seqs": 256})
    defaults = parser().parse_args([])
    assert (defaults.sessions, defaults.frames, defaults.drops, defaults.bad) == (64, 3, 4, 4)


RESULTS = load_results(earlier=True)   # every committed file, the superseded rounds' too


def test_a_cpu_result_is_committed():
    assert any(r["device_type"] == "cpu" for r in RESULTS.values()), "results/serve/ holds no CPU load test"


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_a_committed_result_agrees_with_its_own_trials(name):
    r = RESULTS[name]
    fps = r["frames_per_s"]
    assert r["trials"] >= 3 and len(fps["server"]["trials"]) == len(fps["in_process"]["trials"]) == r["trials"]
    assert fps["server"]["median"] == pytest.approx(statistics.median(fps["server"]["trials"]))
    assert fps["in_process"]["median"] == pytest.approx(statistics.median(fps["in_process"]["trials"]))
    assert fps["ratio"] == pytest.approx(fps["server"]["median"] / fps["in_process"]["median"])
    assert fps["within_10pct"] == (fps["ratio"] >= 0.9)
    assert r["ok"] == all(v["ok"] for v in r["checks"].values())
    assert r["good"] == r["sessions"] - r["drops"] - r["bad_inputs"]
    for key in ("device", "commit", "command", "date", "dtype"):
        assert r[key], key
    assert {"vllm", "torch", "transformers"} <= set(r["versions"])
    # every good session of the mixed run and of each timed server run was compared with in-process
    assert r["checks"]["greedy_parity"]["compared_sessions"] == r["good"] + r["sessions"] * r["trials"]
    assert len(r["checks"]["no_kv_leak"]["leaked_blocks_per_run"]) == 1 + 2 * r["trials"]
    assert result_row(name, r)["ratio"] == round(fps["ratio"], 3)


def test_a_result_is_shown_without_dirty_commits_or_scratch_paths():
    from terra_nb.serve.load import shown_command, shown_commit

    assert shown_commit("99dc1e3-dirty") == "99dc1e3 + local changes" and shown_commit("e04ffa0") == "e04ffa0"
    assert shown_command("python -m terra_nb.serve.load --url http://127.0.0.1:8011 --out /tmp/out/x_256.json") == \
        "python -m terra_nb.serve.load --url http://127.0.0.1:8011 --out x_256.json"
    assert shown_command("python -m terra_nb.serve.load --out results/serve/cpu.json").endswith("results/serve/cpu.json")
