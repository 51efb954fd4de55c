"""The curve's targets: `bench_render.curve_target_lines` on hand-made rows, the notes `merge
--curve-notes` writes from them, and the committed curve lease's notes against its rows."""
import json

import pytest

from terra_nb.bench import cli as bench_cli, results as bench_results, timing as bench_timing
from terra_nb.bench.render import curve_target_lines, parts_workload_line


def _part(rows, command="run", **env):
    env = dict(dict(device="NVIDIA H200", vllm="0.26.0", torch="2.11.0", transformers="5.17.0", python="3.12",
                    date="2026-11-26 01:40 UTC", git_commit="9436d8d-dirty"), **env)
    workload = dict(preset="terra", n_ctx=3, long_frames=22, temperature=0.9, seed=0, long_repeats=2)
    return dict(env=env, workload=workload, dtype="torch.bfloat16", engine_kwargs={}, command=command,
                rows=rows, errors=[])


def _row(name, batch, trials, **extra):
    return dict(bench_timing.trial_row(name, batch, 22, trials), engine_core="this process", **extra)


def _curve():
    """Hand-made: at 1 rollout the port 22 s per video against stock's 20 and 30 (median 25: the port's
    speed-up 1.136x, from stock's trials 0.909x and 1.364x); at 8 a batch without a target; at 32 the port 0.94x stock's
    frames/s with agreeing trials; at 128 1.000x; stock's best batch 128, the port's 32."""
    port = [_row("vllm", 1, [22.0, 22.0], probe=dict(call_s=0.01, frame_s=1.5, decode_ms_per_token=2.5)),
            _row("vllm_b8", 8, [44.0]), _row("vllm_b32", 32, [94.0, 94.0]), _row("vllm_b128", 128, [500.0])]
    stock = [_row("stock_llama", 1, [20.0, 30.0], probe=dict(call_s=0.01, frame_s=1.0, decode_ms_per_token=2.0)),
             _row("stock_llama_b8", 8, [40.0]), _row("stock_llama_b32", 32, [88.36, 88.36]),
             _row("stock_llama_b128", 128, [250.0])]
    return _part(port, "run port"), _part(stock, "run stock")


def test_curve_target_lines_compute_each_batch_against_the_targets():
    res = bench_results.merge(list(_curve()))
    lines = curve_target_lines(res)
    assert lines[0] == ("The targets, the port's speed-up over stock vLLM Llama in this lease: 1 of 3 met "
                        "(1 rollout met, 32 rollouts missed, 128 rollouts missed).")
    one, eight, b32, b128, best, probe = lines[1:]
    # 1 rollout: frames/s, port 22/22 vs stock's median 22/25; stock's trials 1.5x apart: each against the port's median
    assert one.startswith("1 rollout: the port 1.000 frames/s, stock 0.880 frames/s: 1.136x (the port's speed-up, "
                          "frames/s of the port ÷ stock's; target at least 0.97x: met, 0.166 over).")
    assert "the port 22.00, 22.00; stock 20.00, 30.00" in one
    assert "stock's slowest 50.0% over its fastest: from each of stock's trials against the other's median the " \
           "ratio is 0.909x to 1.364x, met with some and missed with others" in one
    assert eight.startswith("8 rollouts: the port 4.000 frames/s, stock 4.400 frames/s: 0.909x") and "no target" in eight
    assert "One trial each, in seconds (a trial: 8 rollouts x 22 frames): the port 44.00; stock 40.00." in eight
    assert "0.940x (the port's speed-up, frames/s of the port ÷ stock's; target at least 0.95x: missed, 0.010 short)" in b32
    assert "trial by trial" not in b32 and "slowest" not in b32   # agreeing trials, one verdict
    assert "0.500x" in b128 and "missed, 0.450 short" in b128
    assert best == ("Most frames/s of each engine: the port 7.49 at 32 rollouts, stock 11.26 at 128 rollouts "
                    "(batches measured: 1, 8, 32, 128).")
    assert "the port 2.500 ms per code, stock 2.000 (the port's speed-up 0.80x); a frame 1.500 s vs 1.000 s (0.67x), " \
           "where the rollouts' frames/s gave 1.136x" in probe
    # every ratio is the lease's own ratio entry (the same quantity divided)
    entries = {e["name"]: e["value"] for e in bench_results.ratio_entries(res)}
    assert f"{entries['vllm_vs_stock']:.3f}x" in one and f"{entries['port_vs_stock_b32']:.3f}x" in b32


def test_curve_target_lines_say_when_the_verdict_turns_on_a_trial_and_skip_leases_without_a_curve():
    port, stock = _curve()
    # at 32: the port's trials 4% apart (within TRIALS_NOTE), yet one of them meets 0.95x and the other not
    port["rows"][2] = _row("vllm_b32", 32, [92.0, 95.8])
    line = curve_target_lines(bench_results.merge([port, stock]))[3]
    assert "(trial by trial, every trial of the port's against every one of stock's, the ratio is 0.922x to " \
           "0.960x, met with some and missed with others)" in line
    assert curve_target_lines(bench_results.merge([_part([_row("hf_seed", 1, [88.0])])])) == []
    with pytest.raises(ValueError, match="one lease"):
        curve_target_lines(bench_results.combine({"a": bench_results.merge([port, stock])}))


def test_parts_workload_line_states_the_shared_workload_and_refuses_parts_that_differ():
    port, stock = _curve()
    assert parts_workload_line([port, stock]) == (
        "Every part ran one workload: terra shape, torch.bfloat16, 3 context + 22 frames, temperature 0.9, seed 0, "
        "vLLM 0.26.0 with engine_kwargs {} (the benchmark's engine settings, vLLM's defaults otherwise); "
        "engine core: this process (every row).")
    stock["workload"] = dict(stock["workload"], long_repeats=1)   # repeats may differ
    parts_workload_line([port, stock])
    for change in (dict(workload=dict(stock["workload"], temperature=1.0)), dict(engine_kwargs={"max_num_seqs": 5}),
                   dict(dtype="torch.float32")):
        with pytest.raises(ValueError, match="different settings"):
            parts_workload_line([port, dict(stock, **change)])


def test_merge_curve_notes_and_commit(tmp_path):
    paths = []
    for i, part in enumerate(_curve()):
        paths.append(tmp_path / f"part_{i}.json")
        paths[-1].write_text(json.dumps(part))
    out = tmp_path / "leases" / "h200_x_curve.json"
    bench_cli.main(["merge", *map(str, paths), "--lease", "a lease", "--note", "typed", "--curve-notes",
                "--commit", "cc1a759", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["commit"] == res["env"]["git_commit"] == "cc1a759" and res["env"]["device_git_commit"] == "9436d8d-dirty"
    assert res["notes"] == ["typed", parts_workload_line(list(_curve()))] + curve_target_lines(res)
    assert not list(tmp_path.glob("leases/*.png"))


def test_the_committed_curve_leases_notes_are_their_rows_target_lines():
    """Every lease of results/benchmark_h200.json with a port and a stock row of one batch carries
    `curve_target_lines` of its rows, in order, among its notes (so they cannot drift from its rows)."""
    (res,) = bench_results.load_results().values()
    seen = 0
    for lid, lease in bench_results.by_lease(res):
        lines = curve_target_lines(lease)
        if not lines:
            continue
        seen += 1
        notes = lease.get("notes", [])
        assert lines[0] in notes, (lid, "rerun `bench merge --curve-notes` for this lease")
        at = notes.index(lines[0])
        assert notes[at:at + len(lines)] == lines, lid
        assert lease["env"]["git_commit"] == lease["commit"], lid
    assert seen == 2, "two curve leases in the results file: the 2026-11-26 curve and its 32-rollout re-measure"
