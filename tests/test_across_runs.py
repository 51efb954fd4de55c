"""Runs of the same port code pooled: the two-level bootstrap over runs and rounds, the git check
that two commits ran the same port, and the sentences the README builds from them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from terra_nb.bench import headline, records, stats
from terra_nb.workbook.paths import RESULTS


def test_the_pooled_speedup_is_the_median_rounds_ratio_and_its_interval_spans_the_runs():
    fast, slow = ([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]), ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])   # ratios 2, 2, 2 and 1, 1, 1
    assert stats.rounds_speedup([fast, slow]) == 1.5
    # every round of a run agrees, so all the spread is between runs: only drawing runs finds it
    assert stats.runs_interval([fast, slow]) == (1.0, 2.0)
    assert stats.runs_interval([fast]) == (2.0, 2.0)
    with pytest.raises(ValueError):
        stats.rounds_speedup([([1.0, 2.0], [1.0])])   # a round with one side missing


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_same_source_asks_git_whether_two_commits_hold_the_same_port(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "port").mkdir()
    commits = []
    for path, text in (("port/a.py", "x = 1\n"), ("bench.py", "y = 2\n"), ("port/a.py", "x = 3\n")):
        (tmp_path / path).write_text(text)
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", path)
        commits.append(_git(tmp_path, "rev-parse", "HEAD"))
    assert records.same_source(commits[0], commits[1], ("port",), tmp_path) is True    # only bench.py changed
    assert records.same_source(commits[1], commits[2], ("port",), tmp_path) is False
    assert records.same_source(commits[0], "f" * 40, ("port",), tmp_path) is None      # a commit git does not know


def _run(commit, date, rounds, batch=1, run="1xGPU (alone): headline_stock"):
    """A port-vs-stock file of one block: `rounds` as (port s, stock s), analysed as the runner does."""
    port, stock = [a for a, _ in rounds], [b for _, b in rounds]
    c = stats.compare("port", port, "stock", stock, target=0.95)
    return dict(commit=commit, date=date, device="GPU", run=run, n_ctx=3,
                blocks=[dict(batch=batch, frames=2, trials_s=dict(port=port, stock=stock))],
                analysis=[dict(batch=batch, speedup=c.value, interval=list(c.interval), target=0.95,
                               verdict=c.verdict, trials=c.trials)])


def test_runs_that_disagree_are_pooled_and_said_to_disagree():
    runs = [_run("a" * 40, "1", [(1.0, 1.2), (1.0, 1.21), (1.0, 1.19)]),
            _run("b" * 40, "2", [(1.0, 0.8), (1.0, 0.81), (1.0, 0.79)])]
    (row,) = headline.across_runs(runs)
    assert row["per_run"] == [1.2, 0.8] and row["speedup"] == pytest.approx(1.0) and row["rounds"] == 6
    assert row["interval"][0] < 0.81 and row["interval"][1] > 1.19 and row["verdict"] == stats.UNRESOLVED
    assert row["disagree"]
    text = headline.across_runs_sentence(runs)
    assert "(2 runs of this setting on GPU, commits aaaaaaa and bbbbbbb;" in text
    assert "Run by run: 1.20x and 0.80x at 1 rollout." in text
    assert "At 1 rollout a run's speed-up lies outside another run's interval" in text
    agreeing = [runs[0], _run("b" * 40, "2", [(1.0, 1.2), (1.0, 1.19), (1.0, 1.21)])]
    assert not headline.across_runs(agreeing)[0]["disagree"]
    assert "outside another run's interval" not in headline.across_runs_sentence(agreeing)
    assert "1 of 1 targets met" in headline.across_runs_sentence(agreeing)
    assert headline.across_runs_sentence(runs[:1]) is None


def test_same_code_runs_pool_only_one_setting(tmp_path):
    a = _run("a" * 40, "1", [(1.0, 1.0)])
    files = {"1_headline_stock.json": a, "2_headline_stock.json": dict(_run("a" * 40, "2", [(1.0, 1.1)])),
             "3_headline_stock.json": _run("a" * 40, "3", [(1.0, 1.0)], run="4xGPU (beside others): headline_stock"),
             "4_headline_stock.json": _run("a" * 40, "4", [(1.0, 1.0)], batch=32)}
    for name, res in files.items():
        (tmp_path / name).write_text(json.dumps(res))
    got = records.same_code_runs(a, "*_headline_stock.json", tmp_path)
    assert [f.name for f, _ in got] == ["1_headline_stock.json", "2_headline_stock.json"]


def test_the_committed_runs_of_one_port_pool_from_their_files():
    """The newest committed headline with every committed run of its setting and port code (git
    says which): the pooled rows recompute from their files' trials."""
    f, newest = headline.latest("stock")
    same = records.same_code_runs(newest, "*_headline_stock.json", f.parent)
    assert same[-1][0] == f
    rows = headline.across_runs([r for _, r in same])
    for row, b in zip(rows, newest["blocks"]):
        assert row["batch"] == b["batch"] and len(row["per_run"]) == len(same)
        assert row["per_run"][-1] == pytest.approx(stats.speedup(b["trials_s"]["port"], b["trials_s"]["stock"]), abs=1e-4)
        assert row["interval"][0] <= row["speedup"] <= row["interval"][1]


def test_the_answer_pools_runs_of_the_same_port_and_names_their_commits(tmp_path):
    from terra_nb.workbook import docs

    seed = dict(commit="c" * 40, date="1", device="GPU", versions={"vllm": "9.9"}, analysis=[
        dict(name=n, block="seed", speedup=s, interval=[s - 0.1, s + 0.1], verdict="met", batch=1, trials=5,
             target=2.6) for n, s in (("port_seed_vs_hf", 3.0), ("port_defaults_vs_hf", 8.0))],
        blocks=[dict(name="seed", frames=4, trials_s=dict(hf=[8.0], port_seed=[4.0], port_defaults=[1.0]))])
    (tmp_path / "x_headline_seed.json").write_text(json.dumps(seed))
    for i, rounds in enumerate(([(1.0, 1.2)] * 3, [(1.0, 0.8)] * 3)):
        (tmp_path / f"{i}_headline_stock.json").write_text(json.dumps(dict(
            _run("a" * 40, str(i), rounds), versions={"vllm": "9.9"})))
    lines = docs.answer_markdown(tmp_path).splitlines()
    assert "the port runs at 1.00x [0.80, 1.20] of stock's speed at 1 rollout over 2 runs of the same port code" in lines[0]
    assert "run by run 1.20x and 0.80x at 1 rollout." in lines[0]
    assert "(3 a side against stock on GPU, commits aaaaaaa and aaaaaaa;" in lines[3]


def _twice(order, pairs):
    """A `headline_twice` result: sides started in `order`, `pairs` as (first, second, speed-up, lo, hi)."""
    return dict(device="CPU", preset="tiny", plan=dict(sides=[dict(name=n) for n in order]), analysis=[
        dict(first=a, second=b, speedup=v, interval=[lo, hi], batch=1, trials=7) for a, b, v, lo, hi in pairs])


def test_the_twins_say_which_aa_pairs_exclude_one_and_who_started_first():
    port_first = _twice(("port", "stock", "stock_b", "port_b"), [
        ("port", "stock", 0.85, 0.8, 0.9), ("port_b", "stock_b", 0.95, 0.9, 1.0),
        ("port", "port_b", 0.9, 0.85, 0.95), ("stock", "stock_b", 1.0, 0.97, 1.04)])
    stock_first = _twice(("stock", "port", "port_b", "stock_b"), [
        ("port", "stock", 0.97, 0.9, 1.05), ("port_b", "stock_b", 0.93, 0.9, 0.96),
        ("port", "port_b", 1.0, 0.95, 1.05), ("stock", "stock_b", 0.9, 0.85, 0.95)])
    runs = [(Path("a_twice.json"), port_first), (Path("b_twice.json"), stock_first)]
    rows = headline.twins_rows(runs)
    assert [(r["twins (started)"], r["excludes 1"]) for r in rows] == [
        ("port (1) over port_b (4)", "yes"), ("stock (2) over stock_b (3)", ""),
        ("port (2) over port_b (3)", ""), ("stock (1) over stock_b (4)", "yes")]
    text = headline.twins_sentence(runs)
    assert "2 runs on CPU, the tiny model): 2 of 4 intervals exclude 1; in 2 of those 2 the engine started earlier" in text
    assert "2 of them hold the engine started first" in text
    # port first: 0.85 (port 1 vs stock 2) and 0.93 (port_b 3 vs stock_b 4); stock first: 0.95 and 0.97
    assert "0.89x where the port's engine started first (2 pairs) and 0.96x where stock's engine started first (2 pairs)" in text
    calm = _twice(("port", "stock", "stock_b", "port_b"), [("port", "port_b", 1.0, 0.95, 1.05)])
    assert headline.twins_sentence([(Path("c_twice.json"), calm)]).endswith("0 of 1 intervals exclude 1.")


def test_the_twins_get_one_sentence_a_device(tmp_path):
    cpu = _twice(("port", "stock", "stock_b", "port_b"), [("port", "port_b", 0.9, 0.85, 0.95)])
    gpu = dict(_twice(("port", "stock", "stock_b", "port_b"), [("stock", "stock_b", 1.0, 0.9, 1.1)]), device="GPU")
    for name, res in (("a_twice.json", cpu), ("b_twice.json", gpu)):
        (tmp_path / name).write_text(json.dumps(res))
    sentences = [line for line in headline.twins_markdown(tmp_path).split("\n\n") if "against its twin" in line]
    assert [s.split("process, ")[1].split(")")[0] for s in sentences] == ["1 run on CPU, the tiny model",
                                                                        "1 run on GPU, the tiny model"]
    assert "1 of 1 intervals exclude 1" in sentences[0] and "0 of 1 intervals exclude 1" in sentences[1]


@pytest.mark.parametrize("path", sorted((RESULTS / "pairs").glob("*_twice.json")), ids=lambda p: p.name)
def test_a_committed_twins_file_holds_each_sides_twin_and_the_port_vs_stock_per_pair(path):
    res = json.loads(path.read_text())
    for c in res["analysis"]:   # every pair recomputes from its trials
        b = next(b for b in res["blocks"] if b["batch"] == c["batch"])
        assert c["speedup"] == pytest.approx(stats.speedup(b["trials_s"][c["first"]], b["trials_s"][c["second"]]), abs=1e-4)
    assert {(c["first"], c["second"]) for c in res["analysis"]} == {
        ("port", "stock"), ("port_b", "stock_b"), ("port", "port_b"), ("stock", "stock_b")}
    assert sorted(s["name"] for s in res["plan"]["sides"]) == ["port", "port_b", "stock", "stock_b"]


def test_the_twice_plan_starts_one_pair_port_first_and_the_other_stock_first():
    from terra_nb.bench import plans

    plan = plans.named_plan("headline_twice")
    order = [s.name for s in plan.sides]
    firsts = {p.name: order.index(p.first) < order.index(p.second) for p in plan.pairs if p.name.startswith("port_")
              and "stock" in p.second and p.block == "b1"}
    assert firsts == {"port_vs_stock_b1": True, "port_b_vs_stock_b_b1": False}
    assert all(s.engine_kwargs == plan.sides[0].engine_kwargs for s in plan.sides)   # twins differ in nothing
    with pytest.raises(ValueError, match="order must name each of"):
        plans.stock_twice_plan("tiny", plans.CPU_SHARED, {1: 2}, 2, 0.2, order=("port", "stock", "port", "stock"))


def test_a_pooled_speedup_refuses_a_trial_of_no_time():
    with pytest.raises(ValueError, match="positive trials"):
        stats.rounds_speedup([([1.0, 0.0], [1.0, 1.0])])


@pytest.mark.parametrize("path", sorted((RESULTS / "pairs").glob("*_twice.json")), ids=lambda p: p.name)
def test_a_twice_result_pools_as_two_runs_one_per_pair_of_processes(path):
    res = json.loads(path.read_text())
    by = {(c["first"], c["second"], c["batch"]): c for c in res["analysis"]}
    for row in headline.across_runs(headline.pair_runs(res)):
        assert row["per_run"] == [by[("port", "stock", row["batch"])]["speedup"],
                                  by[("port_b", "stock_b", row["batch"])]["speedup"]]
        assert row["rounds"] == 2 * by[("port", "stock", row["batch"])]["trials"]
        assert row["interval"][0] <= row["speedup"] <= row["interval"][1]
