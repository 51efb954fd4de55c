"""Tensor parallelism in the benchmark (`bench tp`): TP=1's rows measured on the CPU through the real
vLLM (the tiny preset; the CPU cannot run TP=2), the greedy-token comparison against a reference part,
and the report's TP=2 ÷ TP=1 ratios, table and combined file from hand-made rows."""
import json
import os
import subprocess
import sys

import pytest

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.workbook import bench, bench_report
from terra_nb.workbook.bench_measure import greedy_vs_ref, tensor_parallel

EAGER = {"enforce_eager": True}
"""The CPU engine runs eager here: torch.compile would add ~15 s per engine, and the rows' bookkeeping
is the same either way."""


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    """TP=1 on the tiny preset, in this process: 1 and 2 rollouts, a prefill of 2 prompts; the part
    file it wrote as it went, and its checkpoint root."""
    tmp = tmp_path_factory.mktemp("tp")
    wl = bench.Workload(preset="tiny", long_frames=2, long_repeats=1, batch_repeats=1)
    res = tensor_parallel(wl, tmp / "ckpt", 1, None, batches=(1, 2), prefill_prompts=2, partial=tmp / "part_tp1.json",
                          engine_kwargs=EAGER)
    return res, json.loads((tmp / "part_tp1.json").read_text()), tmp


def test_tp1_writes_a_row_per_batch_and_a_prefill_row(tp1):
    res, part, _ = tp1
    assert part == json.loads(json.dumps(res))   # the part on disk is the result
    assert [r["name"] for r in res["rows"]] == ["vllm_tp1", "vllm_tp1_b2", "vllm_tp1_prefill"] and res["errors"] == []
    # both sizes run one engine setting but for tensor_parallel_size
    assert res["engine_kwargs"] == dict(bench.NO_MULTICAST_TP_KWARGS, **EAGER, tensor_parallel_size=1)
    one, two, prefill = res["rows"]
    for r, batch in ((one, 1), (two, 2)):
        assert (r["tp"], r["batch"], r["frames"], r["repeats"]) == (1, batch, 2, 1)
        assert r["frames_per_s"] == pytest.approx(batch * 2 / r["trials_s"][0], rel=1e-2) and r["engine_start_s"] > 0
        assert 0.5 < r["prefix_cache_hit_rate"] <= 1.0   # frame 2's prompt is frame 1's plus a frame
    # the greedy codes once, on the first row: 3 frames of the tiny preset's 64 codes
    assert "greedy_tokens" not in two and "greedy_vs_tp1" not in one
    assert [len(f) for f in one["greedy_tokens"]] == [64] * 3
    assert all(0 <= c < 512 for f in one["greedy_tokens"] for c in f)
    # prefill: 2 prompts of 3 context + 2 frames of 70 tokens, none served from the prefix cache
    assert (prefill["tp"], prefill["prompts"], prefill["prompt_frames"], prefill["prompt_tokens"]) == (1, 2, 5, 350)
    assert len(prefill["trials_s"]) == 2 and prefill["cached_prompt_tokens"] == [0, 0]
    assert prefill["prefill_tokens_per_s"] == pytest.approx(2 * 350 / prefill["s"])
    assert min(prefill["trials_s"]) - 1e-4 <= prefill["s"] <= max(prefill["trials_s"]) + 1e-4


def test_the_cli_compares_its_greedy_tokens_with_a_reference(tp1):
    """`bench tp --ref`: the same engine in a fresh process draws TP=1's greedy codes again."""
    _, part, tmp = tp1
    out = tmp / "part_again.json"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, "-m", "terra_nb.workbook.bench", "tp", "--tp", "1", "--preset", "tiny",
                           "--ckpt-root", str(tmp / "ckpt"), "--ref", str(tmp / "part_tp1.json"), "--long-frames", "2",
                           "--long-repeats", "1", "--engine-kwargs", json.dumps(EAGER), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    again = json.loads(out.read_text())
    (row,) = again["rows"]   # --batches defaults to 1, no prefill
    assert row["name"] == "vllm_tp1" and again["workload"]["long_frames"] == 2
    assert row["greedy_vs_tp1"] == dict(equal=True, agreement=1.0, first_mismatch=None)
    assert row["greedy_tokens"] == part["rows"][0]["greedy_tokens"]


def test_greedy_vs_ref_finds_the_first_code_that_differs(tp1):
    _, part, _ = tp1
    tokens = part["rows"][0]["greedy_tokens"]
    assert greedy_vs_ref(tokens, part)["greedy_vs_tp1"]["equal"] is True
    changed = json.loads(json.dumps(part))
    changed["rows"][0]["greedy_tokens"][1][5] += 1   # frame 1, code 5: flat index 64 + 5
    got = greedy_vs_ref(tokens, changed)
    assert got["greedy_tokens"] == tokens
    assert got["greedy_vs_tp1"] == dict(equal=False, agreement=pytest.approx(1 - 1 / (3 * 64)), first_mismatch=69)
    assert "greedy_vs_tp1" not in greedy_vs_ref(tokens, None)


def _prefill(tp, trials, prompts=8, tokens=13968):
    """A hand-made prefill row as `bench_prefill` writes it."""
    import statistics

    s = statistics.median(trials)
    return dict(name=bench.tp_row(tp, bench.PREFILL), tp=tp, prompts=prompts, prompt_tokens=tokens, prompt_frames=24,
                repeats=len(trials), trials_s=trials, s=s, prefill_tokens_per_s=prompts * tokens / s)


def _tp_rows():
    """TP=1 and TP=2 at 1 and 32 rollouts and prefill; TP=1 alone at 128 rollouts."""
    row = lambda tp, b, trials: bench._row(bench.tp_row(tp, b), b, 22, trials, tp=tp)  # noqa: E731
    return [row(1, 1, [22.0, 22.0]), row(2, 1, [20.0, 20.0]), row(1, 32, [44.0, 44.0]), row(2, 32, [33.0, 55.0]),
            row(1, 128, [88.0]), _prefill(1, [2.0, 2.2]), _prefill(2, [1.0, 1.2])]


def test_tp_row_names_parse_and_stay_off_the_curve():
    assert [bench.tp_row(2, b) for b in (1, 32, bench.PREFILL)] == ["vllm_tp2", "vllm_tp2_b32", "vllm_tp2_prefill"]
    assert [bench.tp_row_parts(n) for n in ("vllm_tp1", "vllm_tp2_b128", "vllm_tp2_prefill")] == [
        (1, 1), (2, 128), (2, bench.PREFILL)]
    assert [bench.tp_row_parts(n) for n in ("vllm", "vllm_b8", "vllm_tp0", "vllm_tp2_b0", "vllm_tp2_decode")] == [None] * 5
    with pytest.raises(ValueError, match="unknown row"):
        bench.row_batch("vllm_tp2_b32")
    assert bench.row_label("vllm_tp2_b32") == "our port at TP=2, 32 rollouts at once"
    assert bench.row_label("vllm_tp1_prefill") == "our port at TP=1, prefill of long prompts"


def test_lease_ratios_divide_tp2_by_tp1_where_both_ran():
    rows = _tp_rows()
    ratios = {r.name: r for r in bench_report.lease_ratios(rows)}
    assert list(ratios) == ["tp2_vs_tp1_b1", "tp2_vs_tp1_b32", "tp2_vs_tp1_prefill"]   # no TP=2 row at 128
    by = {r["name"]: r for r in rows}
    assert ratios["tp2_vs_tp1_b1"].value(by) == pytest.approx(22.0 / 20.0)
    assert ratios["tp2_vs_tp1_b32"].value(by) == pytest.approx(44.0 / 44.0)   # TP=2's median of 33 and 55
    assert ratios["tp2_vs_tp1_prefill"].value(by) == pytest.approx(2.1 / 1.1)
    assert ratios["tp2_vs_tp1_b32"].divides() == ("frames/s (all rollouts) of the port at TP=2, 32 rollouts at once "
                                                  "÷ frames/s of the port at TP=1, 32 rollouts at once")
    assert ratios["tp2_vs_tp1_b1"].divides().endswith("÷ frames/s of the port at TP=1, 1 rollout at once")
    assert ratios["tp2_vs_tp1_prefill"].divides() == (
        "prompt tokens prefilled/s (all prompts) of the port at TP=2, prefill of long prompts "
        "÷ prompt tokens/s of the port at TP=1, prefill of long prompts")
    # one side missing: no ratio
    assert bench_report.lease_ratios([r for r in rows if r["name"] != "vllm_tp1_prefill"])[-1].name == "tp2_vs_tp1_b32"
    assert bench_report.lease_ratios([r for r in rows if r["tp"] == 1]) == []


def test_a_lease_of_tp_rows_and_curve_rows_combines_and_renders():
    env = dict(device="NVIDIA H200", vllm="0.26.0", torch="2.11.0", transformers="5.17.0", python="3.12",
               date="2026-11-29 10:00 UTC", git_commit="ccc3333")
    curve = [bench._row("vllm", 1, 22, [22.0]), bench._row("stock_llama", 1, 22, [20.0]),
             bench._row("vllm_b32", 32, 22, [40.0]), bench._row("stock_llama_b32", 32, 22, [38.0])]
    lease = bench.merge([dict(env=env, workload={"n_ctx": 3, "temperature": 0.9}, dtype="torch.bfloat16",
                              command="bench tp", rows=curve + _tp_rows(), errors=[])])
    res = bench_report.combine({"h200_tp": dict(lease, lease="TP lease")})
    ratios = {e["name"]: e for e in res["ratios"]}
    assert {"vllm_vs_stock", "port_vs_stock_b32", "tp2_vs_tp1_b1", "tp2_vs_tp1_b32", "tp2_vs_tp1_prefill"} == set(ratios)
    # the curve is the port's and stock's alone
    assert [(c["batch"], c["port_frames_per_s"]) for c in res["leases"]["h200_tp"]["curve"]] == [(1, 1.0), (32, 17.6)]
    # trial by trial: TP=2's trials at 32 rollouts disagree most, each against TP=1's median
    b32 = ratios["tp2_vs_tp1_b32"]
    assert b32["trials_of"] == "vllm_tp2_b32" and b32["trials_range"] == pytest.approx([44.0 / 55.0, 44.0 / 33.0])
    pre = ratios["tp2_vs_tp1_prefill"]
    assert pre["quantity"] == "prefill_tokens_per_s" and pre["frames"] == [None, None]
    assert pre["trials_of"] == "vllm_tp2_prefill" and pre["trials_range"] == pytest.approx([2.1 / 1.2, 2.1 / 1.0])
    table = bench_report.results_table(res)
    assert "| our port at TP=2, 32 rollouts at once | 32 | 22 |" in table
    assert "| our port at TP=2, prefill of long prompts: 8 prompts of 13968 tokens, 101585 prompt tokens/s |" in table
    assert "`tp2_vs_tp1_prefill` = **1.909x**: prompt tokens prefilled/s" in table
    assert "results/benchmark_h200.json" in bench_report.readme_section({"benchmark_h200": res})
    assert "vllm_tp2_prefill" not in [r["row"] for r in bench.report_rows(res)]
    assert "vllm_tp2_b32" in [r["row"] for r in bench.report_rows(res)]
    json.dumps(res, allow_nan=False)
