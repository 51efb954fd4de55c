"""One results file from several leases (issue 25): `bench_results.combine` keeps every row with its
lease, computes each ratio only between two rows of one lease, and the renderers group by lease."""
import json

import pytest

from terra_nb.bench import cli as bench_cli, render as bench_render, results as bench_results, timing as bench_timing
from terra_nb.bench.render import seed_section, seed_setting_lines
from terra_nb.bench.results import by_lease, combine, ratio_entries


def _lease(rows, commit, lease, device="NVIDIA H200", date="2026-11-27 10:00 UTC"):
    """A lease's file as `merge` writes it, from hand-made rows."""
    env = dict(device=device, vllm="0.26.0", torch="2.11.0", transformers="5.17.0", python="3.12", date=date,
               git_commit=commit)
    part = dict(env=env, workload={"n_ctx": 3, "temperature": 0.9}, dtype="torch.bfloat16", command=f"run {lease}",
                rows=rows, errors=[])
    return dict(bench_results.merge([part]), lease=lease, notes=[f"note of {lease}"])


def _row(name, batch, frames, trials, **extra):
    return bench_timing.trial_row(name, batch, frames, trials, **extra)


def _two_leases():
    """Lease `curve`: port and stock at 1 and 8 rollouts, and an HF seed row (fast, agreeing trials).
    Lease `seed`: HF's and the port's seed rows, HF's trials 3x apart; its own stock row at 8."""
    curve = _lease([_row("vllm", 1, 22, [22.0, 22.0]), _row("stock_llama", 1, 22, [20.0, 20.0]),
                    _row("vllm_b8", 8, 22, [44.0]), _row("stock_llama_b8", 8, 22, [40.0]),
                    _row("hf_seed", 1, 22, [88.0, 88.0], temperature=1.0, frame_s=[3.0, 4.0, 5.0])],
                   "aaa1111", "curve lease")
    seed = _lease([_row("hf_seed", 1, 22, [22.0 * 9, 22.0 * 3], temperature=1.0),
                   _row("vllm_seed", 1, 22, [44.0, 44.0], temperature=1.0),
                   _row("vllm_seed_defaults", 1, 22, [22.0, 22.0], temperature=1.0),
                   _row("stock_llama_b8", 8, 22, [80.0])],
                  "bbb2222", "seed lease", date="2026-11-28 10:00 UTC")
    return {"h200_curve": curve, "h200_seed": seed}


def test_combine_keeps_each_row_with_its_lease_and_computes_ratios_within_a_lease():
    res = combine(_two_leases())
    assert res["device"] == "NVIDIA H200" and list(res["leases"]) == ["h200_curve", "h200_seed"]
    assert res["leases"]["h200_seed"]["commit"] == "bbb2222" and res["leases"]["h200_seed"]["lease"] == "seed lease"
    assert res["leases"]["h200_curve"]["notes"] == ["note of curve lease"]
    # a row name in two leases: both rows kept, each with its lease and commit
    hf = [r for r in res["rows"] if r["name"] == "hf_seed"]
    assert [(r["lease"], r["commit"], r["s_per_frame"]) for r in hf] == [
        ("h200_curve", "aaa1111", 4.0), ("h200_seed", "bbb2222", 6.0)]
    ratios = {(e["lease"], e["name"]): e for e in res["ratios"]}
    # computed in each lease that has both of its rows ...
    assert ratios["h200_curve", "vllm_vs_stock"]["value"] == pytest.approx(20.0 / 22.0)   # the port's speed-up
    assert ratios["h200_curve", "port_vs_stock_b8"]["value"] == pytest.approx(40.0 / 44.0)
    assert ratios["h200_seed", "seed_setting_vs_hf"]["value"] == pytest.approx(6.0 / 2.0)
    assert ratios["h200_seed", "seed_defaults_vs_hf"]["value"] == pytest.approx(6.0 / 1.0)
    # ... and never across leases: the curve lease's hf_seed has no vllm_seed of its lease, the seed
    # lease's stock_llama_b8 no vllm_b8 of its lease
    assert ("h200_curve", "seed_setting_vs_hf") not in ratios and ("h200_seed", "port_vs_stock_b8") not in ratios
    assert len(ratios) == len(res["ratios"]) == 4
    # every entry names its two rows, what it divides, and its lease's commit
    e = ratios["h200_curve", "port_vs_stock_b8"]
    assert (e["numerator"], e["denominator"], e["quantity"], e["commit"]) == ("vllm_b8", "stock_llama_b8", "frames_per_s", "aaa1111")
    assert e["divides"] == "frames/s (all rollouts) of the port ÷ frames/s of stock vLLM Llama, 8 rollouts at once each"
    assert ratios["h200_seed", "seed_setting_vs_hf"]["divides"] == (
        "s/frame of HF ÷ s/frame of the port as the seed ran it (eager, no prefix caching)")
    for e in res["ratios"]:
        rows = {r["name"]: r for r in res["rows"] if r["lease"] == e["lease"]}
        assert e["value"] == pytest.approx(rows[e["numerator"]][e["quantity"]] / rows[e["denominator"]][e["quantity"]])
    # the curve is each lease's own
    assert [c["batch"] for c in res["leases"]["h200_curve"]["curve"]] == [1, 8]
    assert res["leases"]["h200_seed"]["curve"] == [dict(batch=8, port_frames_per_s=None, stock_frames_per_s=2.2,
                                                        port_vs_stock=None)]
    json.dumps(res, allow_nan=False)


def test_a_ratio_whose_rows_sit_in_two_leases_is_not_computed():
    eager = _lease([_row("vllm_seed", 1, 22, [44.0])], "c1", "lease one")
    hf = _lease([_row("hf_seed", 1, 22, [88.0])], "c2", "lease two")
    res = combine({"one": eager, "two": hf})
    assert res["ratios"] == [] and {r["lease"] for r in res["rows"]} == {"one", "two"}
    assert "seed_setting_vs_hf" not in bench_render.results_table(res)
    # the same two rows in one lease: computed
    both = combine({"one": _lease(eager["rows"] + hf["rows"], "c1", "lease one")})
    assert [e["name"] for e in both["ratios"]] == ["seed_setting_vs_hf"] and both["ratios"][0]["value"] == 2.0


def test_combine_refuses_leases_of_other_devices_and_twice_named_rows(tmp_path):
    leases = _two_leases()
    leases["h100"] = _lease([_row("vllm", 1, 22, [30.0])], "c3", "an H100 lease", device="NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="different devices.*leases/h100.json: NVIDIA H100"):
        combine(leases, {lid: f"results/leases/{lid}.json" for lid in leases})
    # from files: the error names the files
    paths = []
    for lid, res in leases.items():
        paths.append(tmp_path / f"{lid}.json")
        paths[-1].write_text(json.dumps(res))
    with pytest.raises(ValueError, match=r"h100\.json: NVIDIA H100"):
        bench_results.combine_files(paths)
    other = tmp_path / "again"
    other.mkdir()
    (other / "h200_seed.json").write_text(json.dumps(leases["h200_seed"]))
    with pytest.raises(ValueError, match="share a stem"):
        bench_results.combine_files(paths[:2] + [other / "h200_seed.json"])
    twice = _lease([_row("vllm", 1, 22, [22.0])], "c4", "twice")
    twice["rows"].append(dict(twice["rows"][0]))
    with pytest.raises(ValueError, match="row name twice"):
        combine({"twice": twice})
    with pytest.raises(ValueError, match="no leases"):
        combine({})


def test_the_combine_command_names_leases_by_their_files_stems(tmp_path):
    paths = []
    for lid, res in _two_leases().items():
        paths.append(tmp_path / "leases" / f"{lid}_2026-11-27.json")
        paths[-1].parent.mkdir(exist_ok=True)
        paths[-1].write_text(json.dumps(res))
    out = tmp_path / "benchmark_h200.json"
    bench_cli.main(["combine", *map(str, paths), "--out", str(out)])
    res = json.loads(out.read_text())
    assert list(res["leases"]) == ["h200_curve_2026-11-27", "h200_seed_2026-11-27"]
    assert [res["leases"][lid]["file"] for lid in res["leases"]] == [str(p) for p in paths]
    assert res == json.loads(json.dumps(bench_results.combine_files(paths)))
    assert res["combined_by"].startswith("python -m terra_nb.bench combine ")


def test_renderers_group_the_combined_file_by_lease():
    res = combine(_two_leases())
    table = bench_render.results_table(res)
    curve_at, seed_at = table.index("**Lease `h200_curve`**: Commit aaa1111; curve lease."), table.index(
        "**Lease `h200_seed`**: Commit bbb2222; seed lease.")
    assert table.index("seed: HF (GPU not stated)") < curve_at < seed_at
    curve_block, seed_block = table[curve_at:seed_at], table[seed_at:]
    # the repeated row: each lease's own figure under its own heading
    label = bench_render.row_label("hf_seed")
    assert f"| {label} | 1 | 22 | 4.000 |" in curve_block and f"| {label} | 1 | 22 | 6.000 |" in seed_block
    assert "`vllm_vs_stock` = **0.909x**: s/frame of stock vLLM Llama ÷ s/frame of the port (defaults)" in curve_block
    assert "`vllm_vs_stock`" not in seed_block and "`seed_setting_vs_hf` = **3.000x**" in seed_block
    # HF's trials 3x apart: the ratio's trial range, HF's trials against the port's median
    assert "`hf_seed`'s trials disagree (3.00x slowest ÷ fastest): 1.500x to 4.500x" in seed_block
    assert "note of seed lease" in seed_block and "note of seed lease" not in curve_block
    assert "temperatures 0.9, 1.0 (per row)" in curve_block and "temperatures 0.9, 1.0 (per row)" in seed_block
    readme = bench_render.readme_section({"benchmark_h200": res})
    assert readme.startswith("`results/benchmark_h200.json` (NVIDIA H200; 2 leases") and table in readme
    # report rows: each with its lease, x_hf against its own lease's HF row (none here)
    rows = bench_render.report_rows(res)
    assert [(r["row"], r.get("lease")) for r in rows if r["row"] == "hf_seed"] == [("hf_seed", "h200_curve"), ("hf_seed", "h200_seed")]


def test_seed_sentences_are_per_lease_and_keep_the_trials_spread_rule():
    res = combine(_two_leases())
    with pytest.raises(ValueError, match="one lease"):
        seed_setting_lines(res)
    views = dict(by_lease(res))
    assert set(views) == {"h200_curve", "h200_seed"} and views["h200_seed"]["ratios"]["seed_setting_vs_hf"] == 3.0
    # the seed lease: HF's trials disagree, so the range, not the per-frame medians
    seed_lines = seed_setting_lines(views["h200_seed"])
    assert "ratio is 1.50x to 4.50x (the default port: 3.00x to 9.00x)" in " ".join(seed_lines)
    # the curve lease: HF alone, agreeing trials: its frames' growth, read from its own row
    assert seed_setting_lines(views["h200_curve"]) == [
        "HF: its trials agree within 1.00x (88.0 and 88.0 s).",
        "HF: its first frame took 3.00 s and its last 5.00 s (1.67x): every call prefills the whole prompt again "
        "and decodes against a cache that grows with it."]
    text = seed_section("benchmark_h200", res)
    a, b = text.index("**results/benchmark_h200.json, lease `h200_curve`**"), text.index(
        "**results/benchmark_h200.json, lease `h200_seed`**")
    assert "Commit aaa1111; curve lease." in text[a:b] and "Commit bbb2222; seed lease." in text[b:]
    assert "first frame took 3.00 s" in text[a:b] and "1.50x to 4.50x" in text[b:]
    # one lease's file (merge's layout): as before, no lease heading
    assert seed_section("seed", _two_leases()["h200_seed"]).startswith("**results/seed.json**: NVIDIA H200")


def test_ratio_entries_of_one_leases_file_equal_the_combined_files():
    """A lease's ratios are the same whether read from its own file (`merge`'s) or from the combined
    file, and agree with `merge`'s own `ratios` and `speedup_vs_hf`."""
    leases = _two_leases()
    res = combine(leases)
    for lid, lease in leases.items():
        own = [{k: v for k, v in e.items() if k not in ("lease", "commit")} for e in ratio_entries(res, lid)]
        assert own and own == ratio_entries(lease)
        merged = dict(lease["ratios"], speedup_vs_hf=lease["speedup_vs_hf"])
        for e in own:
            assert merged.get(e["name"], e["value"]) == e["value"]


def test_the_committed_results_file_combines_its_lease_files():
    """results/benchmark_h200.json: every row's lease is one of its leases, every ratio divides two
    rows of its own lease, and the file is what `combine` makes of the lease files it names."""
    (res,) = bench_results.load_results().values()
    assert bench_results.is_combined(res) and res["leases"]
    for lid, meta in res["leases"].items():
        assert meta["commit"] and meta["lease"] and meta["file"].startswith("results/"), lid
        assert bench_results.lease_id(meta["file"]) == lid
    assert {r["lease"] for r in res["rows"]} <= set(res["leases"])
    assert all(r["commit"] == res["leases"][r["lease"]]["commit"] for r in res["rows"])
    for e in res["ratios"]:
        rows = {r["name"]: r for r in res["rows"] if r["lease"] == e["lease"]}
        assert {e["numerator"], e["denominator"]} <= rows.keys(), e
        assert e["value"] == pytest.approx(rows[e["numerator"]][e["quantity"]] / rows[e["denominator"]][e["quantity"]])
        assert e["commit"] == res["leases"][e["lease"]]["commit"]
    assert res == json.loads(json.dumps(bench_results.recombine(res))), \
        "results/benchmark_h200.json is stale: rerun its `combined_by` command"
    # results/leases/ lists the leases (a replaced lease moves to results/raw/): the file combines
    # exactly those, in the order `combine results/leases/*.json` gives
    from terra_nb.workbook.paths import RESULTS

    in_folder = [str(p.relative_to(RESULTS.parent)) for p in sorted((RESULTS / "leases").glob("*.json"))]
    assert [meta["file"] for meta in res["leases"].values()] == in_folder, \
        "results/leases/ and results/benchmark_h200.json disagree: bench combine results/leases/*.json --out results/benchmark_h200.json"
    assert res["combined_by"] == "python -m terra_nb.bench combine " + " ".join(in_folder)
    names = {r["name"] for r in res["rows"]}
    assert {"hf_seed", "vllm_seed", "vllm_seed_defaults", "vllm", "stock_llama"} <= names


def test_seed_lease_notes_are_computed_from_rows_earlier_lease_and_probe():
    """`seed_lease_notes` (bench merge --seed-notes) on hand-made rows, and the committed 2026-11-26
    seed lease's notes are exactly what it computes from that lease, the earlier one and the probe."""
    import json
    from pathlib import Path

    from terra_nb.bench.render import seed_lease_notes

    now = dict(rows=[dict(name="hf_seed_flash", temperature=1.0, trials_s=[100.0, 110.0], device_allocs=[7, 0]),
                     dict(name="vllm_seed", temperature=1.0, s_per_frame=3.0)])
    then = dict(lease_id="h200_old", rows=[dict(name="hf_seed", temperature=1.0, trials_s=[300.0, 100.0]),
                                           dict(name="vllm_seed", temperature=1.0, s_per_frame=2.0)])
    lines = seed_lease_notes(now, then)
    assert lines[0].startswith("The seed rows sample at temperature 1.0")
    assert "HF (lease h200_old): trials 300.0 and 100.0 s, slowest ÷ fastest 3.00x." in lines
    assert ("HF with cuDNN attention off (this lease): trials 100.0 and 110.0 s, slowest ÷ fastest 1.10x; the CUDA "
            "allocator asked the driver for memory 7, 0 times per trial.") in lines
    assert any("3.00 s per frame here, 2.00 in lease h200_old (1.50x)" in ln for ln in lines)
    assert len(seed_lease_notes(now)) == 2  # no earlier lease: its own rows only

    root = Path(__file__).resolve().parents[1]
    lease = json.loads((root / "results/leases/h200_2026-11-26_seed.json").read_text())
    earlier = dict(json.loads((root / "results/leases/h200_2026-11-25_seed.json").read_text()),
                   lease_id="h200_2026-11-25_seed")
    probe = json.loads((root / "results/hf_probe_h200.json").read_text())
    assert lease["notes"][1:] == seed_lease_notes(lease, earlier, probe)
    assert {e["group"] for e in lease["errors"]} == {"hf_static"} and not any(r["name"] == "hf_static" for r in lease["rows"])


def test_probe_findings_read_the_probe_result():
    """`hf_probe.finding_lines` on a hand-made probe result: the kernel named from the profiled CPU
    ops, cold over warm with the pass's CPU seconds, and each backend alone (errors left out)."""
    from terra_nb.bench.hf_probe import finding_lines

    setting = lambda cold, warm, err=None: dict(cold_ms_median=cold, warm_ms_median=warm,  # noqa: E731
                                                cold_over_warm=cold / warm, cpu_s_cold=2.0, cold_s=2.1, error=err)
    res = dict(device="GPU X", torch="t", cudnn=9, steps=10, settings=dict(
        default=setting(50.0, 10.0), FLASH_ATTENTION=setting(10.0, 10.0), EFFICIENT_ATTENTION=setting(1, 1, "no kernel"),
        CUDNN_ATTENTION=setting(40.0, 10.0)),
        profile=dict(cold=dict(cpu_ops=[["cudaLaunchKernel", 9.0], ["aten::_cudnn_attention_forward", 30.0]])))
    lines = finding_lines(res)
    assert "chose cuDNN's attention kernel" in lines[0] and "30.0 ms of CPU in `aten::_cudnn_attention_forward`" in lines[0]
    assert "took 50.0 ms, the same length again 10.0 ms (5.00x, medians of 10 steps)" in lines[1]
    assert "2.00 s of CPU in that pass's 2.10 s" in lines[1]
    assert lines[2] == "New length over seen length, one backend at a time: flash 1.00x, cudnn 4.00x."
    res["profile"]["cold"]["cpu_ops"] = [["aten::_flash_attention_forward", 1.0]]
    assert not any("cuDNN's attention kernel" in ln for ln in finding_lines(res))
