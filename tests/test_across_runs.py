"""Runs of the same port code pooled: the two-level bootstrap over runs and rounds, the git check
that two commits ran the same port, and the one verdict every page gives on the port against stock."""
from __future__ import annotations

import json
import subprocess

import pytest

from terra_nb.bench import headline, records, stats


def test_the_pooled_speedup_is_the_median_rounds_ratio_and_its_interval_spans_the_runs():
    fast, slow = ([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]), ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])   # ratios 2, 2, 2 and 1, 1, 1
    assert stats.rounds_speedup([fast, slow]) == 1.5
    # every round of a run agrees, so all the spread is between runs: only drawing runs finds it
    assert stats.runs_interval([fast, slow], resamples=500) == (1.0, 2.0)
    assert stats.runs_interval([fast], resamples=500) == (2.0, 2.0)
    with pytest.raises(ValueError):
        stats.rounds_speedup([([1.0, 2.0], [1.0])])   # a round with one side missing
    with pytest.raises(ValueError, match="positive trials"):
        stats.rounds_speedup([([1.0, 0.0], [1.0, 1.0])])


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


def _run(commit, date, rounds, batch=1, run="1xGPU (alone): headline_stock", target=0.95):
    """A port-vs-stock file of one block: `rounds` as (port s, stock s); its analysis is not read here."""
    return dict(commit=commit, date=date, device="NVIDIA GPU", run=run, n_ctx=3,
                blocks=[dict(batch=batch, frames=2, trials_s=dict(port=[a for a, _ in rounds], stock=[b for _, b in rounds]))],
                analysis=[dict(batch=batch, target=target)])


def test_runs_pool_round_by_round_and_keep_each_runs_own_speedup():
    runs = [_run("a" * 40, "1", [(1.0, 1.2), (1.0, 1.21), (1.0, 1.19)]),
            _run("b" * 40, "2", [(1.0, 0.8), (1.0, 0.8), (1.0, 0.79), (1.0, 0.8)])]
    (row,) = headline.across_runs(runs)
    assert row["per_run"] == [1.2, 0.8] and row["speedup"] == pytest.approx(0.8) and row["trials"] == 7
    assert row["interval"][0] <= 0.8 and row["interval"][1] >= 1.19 and row["verdict"] == stats.UNRESOLVED


def test_same_code_runs_pool_only_one_setting(tmp_path):
    a = _run("a" * 40, "1", [(1.0, 1.0)])
    files = {"1_headline_stock.json": a, "2_headline_stock.json": dict(_run("a" * 40, "2", [(1.0, 1.1)])),
             "3_headline_stock.json": _run("a" * 40, "3", [(1.0, 1.0)], run="4xGPU (beside others): headline_stock"),
             "4_headline_stock.json": _run("a" * 40, "4", [(1.0, 1.0)], batch=32)}
    for name, res in files.items():
        (tmp_path / name).write_text(json.dumps(res))
    got = records.same_code_runs(a, "*_headline_stock.json", tmp_path)
    assert [f.name for f, _ in got] == ["1_headline_stock.json", "2_headline_stock.json"]


def _row(batch, speedup, lo, hi, target=0.95):
    return dict(batch=batch, speedup=speedup, interval=[lo, hi], target=target)


@pytest.mark.parametrize("rows,says", [
    ([_row(1, 0.92, 0.86, 1.004, 0.97), _row(32, 0.98, 0.92, 1.07), _row(128, 0.95, 0.9, 1.02)],
     "about as fast. The port runs at 0.92x, 0.98x and 0.95x stock's speed at 1, 32 and 128 rollouts (2 GPU runs "
     "pooled); only 1 rollout is possibly slower (~8%)."),
    ([_row(1, 0.86, 0.8, 0.92), _row(32, 1.0, 0.9, 1.1)], "slower. The port runs at 0.86x and 1.00x stock's speed at "
     "1 and 32 rollouts (2 GPU runs pooled); only 1 rollout is measurably slower (~14%)."),
    ([_row(1, 1.1, 1.05, 1.2), _row(32, 0.9, 0.85, 0.95)], "faster at some batches and slower at others. The port runs "
     "at 1.10x and 0.90x stock's speed at 1 and 32 rollouts (2 GPU runs pooled); only 32 rollouts is measurably slower "
     "(~10%); only 1 rollout is measurably faster (~10%)."),
])
def test_the_verdict_says_what_the_pooled_intervals_and_targets_allow(rows, says):
    assert headline.stock_verdict(rows, [dict(device="NVIDIA GPU")] * 2) == says


def test_the_committed_runs_of_one_port_pool_from_their_files_into_one_verdict_everywhere():
    """The newest committed headline with every committed run of its setting and port code (git
    says which): the pooled rows recompute from their files' trials, and the README, its headline
    table and docs/benchmarks.md give the same verdict (notebook 07 renders the same functions)."""
    from terra_nb.workbook.paths import REPO

    runs, rows = headline.pooled()
    f, newest = headline.latest("stock")
    assert runs[-1][0] == f and len(runs) > 1
    for row, b in zip(rows, newest["blocks"]):
        assert row["batch"] == b["batch"] and len(row["per_run"]) == len(runs)
        n = min(len(b["trials_s"]["port"]), len(b["trials_s"]["stock"]))
        assert row["per_run"][-1] == pytest.approx(stats.rounds_speedup([(b["trials_s"]["port"][:n],
                                                                          b["trials_s"]["stock"][:n])]), abs=1e-4)
        assert row["interval"][0] <= row["speedup"] <= row["interval"][1]
    said = headline.stock_verdict(rows, [r for _, r in runs])
    for page in ("README.md", "docs/benchmarks.md", "notebooks/07_benchmark.ipynb"):
        assert said in (REPO / page).read_text(), page
    table = headline.headline_rows()
    assert [(r["speedup"], r["interval"]) for r in table[:len(rows)]] == [(r["speedup"], r["interval"]) for r in rows]
