"""Tensor parallelism in the benchmark (`bench tp`): TP=1's rows measured on the CPU through the real
vLLM (the tiny preset; the CPU cannot run TP=2), the greedy-token comparison against a reference part,
and the report's TP=2 ÷ TP=1 ratios, table and combined file from hand-made rows."""
import json

import pytest

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.bench import (analysis as bench_analysis, cli as bench_cli, engines as bench_engines, render as bench_render,
                            results as bench_results, timing as bench_timing, workload as bench_workload)
from terra_nb.bench.measure import greedy_vs_ref
from terra_nb.bench.runner import tensor_parallel

EAGER = {"enforce_eager": True}
"""The CPU engine runs eager here: torch.compile would add ~15 s per engine, and the rows' bookkeeping
is the same either way."""


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    """TP=1 on the tiny preset, in this process: 1 and 2 rollouts, a prefill of 2 prompts; the part
    file it wrote as it went, and its checkpoint root."""
    tmp = tmp_path_factory.mktemp("tp")
    wl = bench_workload.Workload(preset="tiny", long_frames=2, long_repeats=1, batch_repeats=1)
    res = tensor_parallel(wl, tmp / "ckpt", 1, None, batches=(1, 2), prefill_prompts=2, partial=tmp / "part_tp1.json",
                          engine_kwargs=EAGER)
    return res, json.loads((tmp / "part_tp1.json").read_text()), tmp


def test_tp1_writes_a_row_per_batch_and_a_prefill_row(tp1):
    res, part, _ = tp1
    assert part == json.loads(json.dumps(res))   # the part on disk is the result
    assert [r["name"] for r in res["rows"]] == ["vllm_tp1", "vllm_tp1_b2", "vllm_tp1_prefill"] and res["errors"] == []
    # both sizes run one engine setting but for tensor_parallel_size
    assert res["engine_kwargs"] == dict(bench_engines.NO_MULTICAST_TP_KWARGS, **EAGER, tensor_parallel_size=1)
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


def test_the_cli_compares_its_greedy_tokens_with_a_reference(tp1, bench_main):
    """`bench tp --ref`: a second engine of the same settings draws TP=1's greedy codes again (the CLI
    in this process, conftest's `bench_main`; test_bench_measure.py runs the CLI as a subprocess)."""
    _, part, tmp = tp1
    out = tmp / "part_again.json"
    bench_main(["tp", "--tp", "1", "--preset", "tiny", "--ckpt-root", tmp / "ckpt", "--ref", tmp / "part_tp1.json",
                "--long-frames", "2", "--long-repeats", "1", "--engine-kwargs", json.dumps(EAGER), "--out", out])
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
    return dict(name=bench_workload.tp_row(tp, bench_workload.PREFILL), tp=tp, prompts=prompts, prompt_tokens=tokens, prompt_frames=24,
                repeats=len(trials), trials_s=trials, s=s, prefill_tokens_per_s=prompts * tokens / s)


def _tp_rows():
    """TP=1 and TP=2 at 1 and 32 rollouts and prefill; TP=1 alone at 128 rollouts."""
    row = lambda tp, b, trials: bench_timing.trial_row(bench_workload.tp_row(tp, b), b, 22, trials, tp=tp)  # noqa: E731
    return [row(1, 1, [22.0, 22.0]), row(2, 1, [20.0, 20.0]), row(1, 32, [44.0, 44.0]), row(2, 32, [33.0, 55.0]),
            row(1, 128, [88.0]), _prefill(1, [2.0, 2.2]), _prefill(2, [1.0, 1.2])]


def test_tp_row_names_parse_and_stay_off_the_curve():
    assert [bench_workload.tp_row(2, b) for b in (1, 32, bench_workload.PREFILL)] == ["vllm_tp2", "vllm_tp2_b32", "vllm_tp2_prefill"]
    assert [bench_workload.tp_row_parts(n) for n in ("vllm_tp1", "vllm_tp2_b128", "vllm_tp2_prefill")] == [
        (1, 1), (2, 128), (2, bench_workload.PREFILL)]
    assert [bench_workload.tp_row_parts(n) for n in ("vllm", "vllm_b8", "vllm_tp0", "vllm_tp2_b0", "vllm_tp2_decode")] == [None] * 5
    with pytest.raises(ValueError, match="unknown row"):
        bench_workload.row_batch("vllm_tp2_b32")
    assert bench_render.row_label("vllm_tp2_b32") == "our port at TP=2, 32 rollouts at once"
    assert bench_render.row_label("vllm_tp1_prefill") == "our port at TP=1, prefill of long prompts"


def test_lease_ratios_divide_tp2_by_tp1_where_both_ran():
    rows = _tp_rows()
    ratios = {r.name: r for r in bench_analysis.lease_ratios(rows)}
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
    assert bench_analysis.lease_ratios([r for r in rows if r["name"] != "vllm_tp1_prefill"])[-1].name == "tp2_vs_tp1_b32"
    assert bench_analysis.lease_ratios([r for r in rows if r["tp"] == 1]) == []


def test_a_lease_of_tp_rows_and_curve_rows_combines_and_renders():
    env = dict(device="NVIDIA H200", vllm="0.26.0", torch="2.11.0", transformers="5.17.0", python="3.12",
               date="2026-11-29 10:00 UTC", git_commit="ccc3333")
    curve = [bench_timing.trial_row("vllm", 1, 22, [22.0]), bench_timing.trial_row("stock_llama", 1, 22, [20.0]),
             bench_timing.trial_row("vllm_b32", 32, 22, [40.0]), bench_timing.trial_row("stock_llama_b32", 32, 22, [38.0])]
    lease = bench_results.merge([dict(env=env, workload={"n_ctx": 3, "temperature": 0.9}, dtype="torch.bfloat16",
                              command="bench tp", rows=curve + _tp_rows(), errors=[])])
    res = bench_results.combine({"h200_tp": dict(lease, lease="TP lease")})
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
    table = bench_render.results_table(res)
    assert "| our port at TP=2, 32 rollouts at once | 32 | 22 |" in table
    assert "| our port at TP=2, prefill of long prompts: 8 prompts of 13968 tokens, 101585 prompt tokens/s |" in table
    assert "`tp2_vs_tp1_prefill` = **1.909x**: prompt tokens prefilled/s" in table
    assert "results/benchmark_h200.json" in bench_render.readme_section({"benchmark_h200": res})
    assert "vllm_tp2_prefill" not in [r["row"] for r in bench_render.report_rows(res)]
    assert "vllm_tp2_b32" in [r["row"] for r in bench_render.report_rows(res)]
    json.dumps(res, allow_nan=False)


def _tp_part(tp: int, rows: list[dict], preset: str = "terra") -> dict:
    env = dict(device="NVIDIA H200", vllm="0.26.0", torch="2.11.0", transformers="5.17.0", python="3.12",
               date="2026-11-29 10:00 UTC", git_commit="ccc3333")
    return dict(env=env, workload=dict(preset=preset, n_ctx=3, long_frames=22, temperature=0.9, seed=0),
                dtype="torch.bfloat16", command=f"bench tp --tp {tp}",
                engine_kwargs=dict(bench_engines.NO_MULTICAST_TP_KWARGS, tensor_parallel_size=tp), rows=rows, errors=[])


def _with_greedy(rows: list[dict]) -> list[dict]:
    """The hand-made rows with greedy codes on each size's 1-rollout row: TP=2's differ at code 5."""
    one, two = [[7] * 8, [3] * 8], [[7] * 5 + [1] * 3, [3] * 8]
    out = [dict(r) for r in rows]
    for r in out:
        if r["name"] == "vllm_tp1":
            r["greedy_tokens"] = one
        if r["name"] == "vllm_tp2":
            r.update(greedy_tokens=two, **{k: v for k, v in greedy_vs_ref(two, {"rows": [{"greedy_tokens": one}]}).items()
                                           if k == "greedy_vs_tp1"})
    return out


def test_tp_lease_notes_quote_the_rows(tmp_path):
    """`tp_lease_notes` (`bench merge --tp-notes`) on hand-made rows: each ratio with both sides'
    figures and trials, the prefill row's cache check, the greedy comparison and the 1-rollout cost
    per code over Terra's 44 all-reduces a step."""
    rows = _with_greedy(_tp_rows())
    parts = [_tp_part(1, [r for r in rows if r["tp"] == 1]), _tp_part(2, [r for r in rows if r["tp"] == 2])]
    lines = bench_render.tp_lease_notes(bench_results.merge(parts))
    assert lines[0] == ("1 rollout: TP=2 1.10 frames/s, TP=1 1.00: 1.100x (frames/s at TP=2 ÷ TP=1's; TP=2 pays). "
                        "Trials in seconds (a trial: 1 rollout x 22 frames): TP=2 20.00, 20.00; TP=1 22.00, 22.00.")
    assert lines[1].startswith("32 rollouts: TP=2 16.00 frames/s, TP=1 16.00: 1.000x") and "TP=2 costs" in lines[1]
    assert "TP=2 33.00, 55.00" in lines[1]
    assert lines[2].startswith("Prefill alone, 8 random prompts of 13,968 tokens (24 frames) at once")
    assert "1.909x (TP=2 ÷ TP=1)" in lines[2] and lines[2].endswith("prompt tokens served by the prefix cache: 0.")
    assert lines[3].startswith("Greedy codes at TP=2 against TP=1 (2 frames of one rollout, bfloat16): 81.2% of 16 equal, "
                               "the first difference at code 5")
    assert len(lines) == 4   # TP=2 faster at 1 rollout here: no "why not" line
    # TP=2 slower at 1 rollout: its extra time per code, and the all-reduces of Terra's 22 layers
    per_frame = {"vllm_tp2": 2.0 * 576 / 1000, "vllm_tp1": 1.5 * 576 / 1000}   # 2.0 and 1.5 ms per code
    slow = [dict(r, s_per_frame=per_frame[r["name"]]) if r["name"] in per_frame else r for r in rows]
    why = bench_render.tp_lease_notes(bench_results.merge([_tp_part(1, [r for r in slow if r["tp"] == 1]),
                                                   _tp_part(2, [r for r in slow if r["tp"] == 2])]))[-1]
    assert why.startswith("Why not at 1 rollout: TP=2 takes 0.50 ms more per code (2.00 vs 1.50 ms)")
    assert "at least 44 all-reduces (22 layers" in why
    # merge --tp-notes writes the workload line (tensor_parallel_size may differ, nothing else) and these lines
    paths = []
    for i, p in enumerate(parts):
        paths.append(tmp_path / f"part_{i}.json")
        paths[-1].write_text(json.dumps(p))
    bench_cli.main(["merge", *map(str, paths), "--tp-notes", "--out", str(tmp_path / "lease.json")])
    notes = json.loads((tmp_path / "lease.json").read_text())["notes"]
    assert notes[1:] == lines and "tensor_parallel_size by part: 1, 2" in notes[0]
    other = dict(parts[1], dtype="torch.float32")
    with pytest.raises(ValueError, match="different settings"):
        bench_render.parts_workload_line([parts[0], other], may_differ=("tensor_parallel_size",))
    with pytest.raises(ValueError, match="different settings"):   # without may_differ, TP sizes differ too
        bench_render.parts_workload_line(parts)


def test_tp_ratio_plot_draws_a_bar_per_ratio():
    from terra_nb.workbook.viz import tp_ratio_plot

    fig = tp_ratio_plot(_tp_rows())
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 rollout", "32 rollouts", "prefill alone"]
    assert [round(b.get_height(), 3) for b in ax.patches] == [1.1, 1.0, 1.909]
    with pytest.raises(ValueError, match="nothing to plot"):
        tp_ratio_plot([r for r in _tp_rows() if r["tp"] == 1])


def test_the_committed_tp_leases_notes_are_their_rows_lines():
    """Every lease of results/benchmark_h200.json with TP=1 and TP=2 rows carries `tp_lease_notes` of
    its rows, in order, and its TP=2 greedy codes were compared with TP=1's of the same lease."""
    (res,) = bench_results.load_results().values()
    seen = []
    for lid, lease in bench_results.by_lease(res):
        lines = bench_render.tp_lease_notes(lease)
        if not lines:
            continue
        seen.append(lid)
        notes = lease["notes"]
        at = notes.index(lines[0])
        assert notes[at:at + len(lines)] == lines, (lid, "rerun `bench merge --tp-notes` for this lease")
        by = {r["name"]: r for r in lease["rows"]}
        cmp = greedy_vs_ref(by["vllm_tp2"]["greedy_tokens"], {"rows": [by["vllm_tp1"]]})["greedy_vs_tp1"]
        assert cmp == by["vllm_tp2"]["greedy_vs_tp1"], lid
    assert seen == ["h200_2026-11-26_tp", "h200_2026-11-26_tp_tiny"]
