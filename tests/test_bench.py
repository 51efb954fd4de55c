"""The benchmark's bookkeeping: merging parts, ratios, hit rates and the README table."""
import json

import pytest

from terra_nb.bench import (analysis as bench_analysis, measure as bench_measure, render as bench_render,
                            results as bench_results, timing as bench_timing, workload as bench_workload)
from terra_nb.port.vllm_rollout import RolloutStats


def _part(rows, command="python -m terra_nb.bench run"):
    env = dict(device="NVIDIA H200", vllm="0.26.0", torch="2.11.0", transformers="5.17.0", python="3.12",
               date="2026-11-22 00:00 UTC")
    return dict(env=env, workload={"n_ctx": 3, "temperature": 0.9}, dtype="torch.bfloat16", command=command,
                rows=rows, errors=[])


def _row(name, batch, frames, trials):
    return bench_timing.trial_row(name, batch, frames, trials)


def test_row_is_median_per_frame():
    r = _row("vllm", 1, 22, [30.0, 22.0, 24.2])
    assert r["s_per_frame"] == pytest.approx(24.2 / 22)
    assert r["frames_per_s"] == pytest.approx(22 / 24.2)
    assert _row("vllm_b8", 8, 22, [44.0])["frames_per_s"] == pytest.approx(4.0)


def test_merge_ratios_and_sources():
    a = _part([_row("hf", 1, 4, [36.0, 34.0])], "cmd a")
    b = _part([_row("vllm", 1, 22, [22.0, 24.2, 26.0]), _row("stock_llama", 1, 22, [22.0, 22.0, 22.0])], "cmd b")
    b["rows"][0]["prefix_cache_hit_rate"] = 0.99
    res = bench_results.merge([a, b])
    assert res["speedup_vs_hf"] == pytest.approx((35.0 / 4) / (24.2 / 22))
    assert res["ratios"]["vllm_vs_stock"] == pytest.approx(22.0 / 24.2)   # the port's speed-up over stock
    assert [r["part"] for r in res["rows"]] == [0, 1, 1] and res["rows"][0]["command"] == "cmd a"
    assert res["device"] == "NVIDIA H200" and res["versions"]["vllm"] == "0.26.0"
    assert res["prefix_cache_hit_rate"] == 0.99


def test_hit_rate_skips_first_step_and_weights_by_tokens():
    st = RolloutStats()
    st.per_call_cached = [[0], [3 * 10], [4 * 10 - 5]]  # steps 1 and 2: prompts of 4 and 5 frames of 10
    assert bench_measure.hit_rate_after_first([st], n_ctx=3, frame_len=10) == pytest.approx((30 + 35) / (40 + 50))


def test_readme_section_is_generated_from_results(tmp_path):
    res = bench_results.merge([_part([_row("hf", 1, 4, [36.0]), _row("vllm", 1, 22, [22.0])])])
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{bench_render.README_START}\nstale\n{bench_render.README_END}\nend\n")
    assert bench_render.update_readme(readme, {"benchmark_h200": res})
    text = readme.read_text()
    assert "stale" not in text and "| our port, CUDA graphs + prefix caching (default) | 1 | 22 | 1.000 |" in text
    assert "9.0x" in text and "11.03" in text
    assert not bench_render.update_readme(readme, {"benchmark_h200": res})  # idempotent


def test_committed_readme_matches_committed_results():
    from terra_nb.workbook.paths import REPO

    text = (REPO / "README.md").read_text()
    a = text.index(bench_render.README_START) + len(bench_render.README_START)
    assert text[a:text.index(bench_render.README_END)].strip() == bench_render.readme_section(bench_results.load_results()).strip(), \
        "README's benchmark table is stale: run `python -m terra_nb.bench readme`"


def test_readme_profile_findings_are_read_from_the_committed_profiles():
    from terra_nb.workbook.paths import REPO

    text = (REPO / "README.md").read_text()
    a = text.index(bench_render.PROFILE_START) + len(bench_render.PROFILE_START)
    assert text[a:text.index(bench_render.PROFILE_END)].strip() == bench_render.profile_findings().strip(), \
        "README's profile findings are stale: run `python -m terra_nb.bench readme`"
    # on hand-made profiles: the figures are the sections' seconds (or the phase's) in ms
    def prof(front_proc, decode1):
        return {"env": {"git_commit": "abc"}, "sections": [
            {"label": "front end: 32 requests, 1 token", "wall_s": 1.0, "phases": {"our_processor": front_proc}},
            {"label": "decode: 1 x 64 tokens", "wall_s": decode1, "phases": {}}]}
    made = dict(zip(bench_render.PROFILE_FILES, (prof(0.00123, 0.2), prof(0.0, 0.1), prof(0.0, 0.0305), prof(0.0, 0.03))))
    body = bench_render.profile_findings(made)
    assert "1.2 ms for 32 requests" in body and "200.0 ms vs stock's 100.0 ms" in body
    assert "30.5 ms vs 30.0 ms" in body and "`env.git_commit`, abc," in body


def test_committed_results_have_the_required_fields():
    results = bench_results.load_results()
    assert set(results) == {"benchmark_h200"}, "a results file was added or lost: say so here"
    for stem, res in results.items():
        assert {"device", "leases", "rows", "ratios"} <= res.keys(), stem
        for lid, meta in res["leases"].items():   # what each lease's file said about itself
            for key in ("versions", "dtype", "workload", "command", "date", "commit", "lease", "curve", "file"):
                assert key in meta, f"{stem}, lease {lid}: missing {key}"
            assert {"vllm", "torch", "transformers"} <= meta["versions"].keys()
        for r in res["rows"]:
            if r["name"].endswith("_prefill"):   # `bench tp`'s prefill rows: prompt tokens, not frames
                assert {"name", "prompts", "prompt_tokens", "trials_s", "prefill_tokens_per_s", "tp", "lease", "commit"} <= r.keys()
            else:
                assert {"name", "batch", "s_per_frame", "frames_per_s", "lease", "commit"} <= r.keys()
        for e in res["ratios"]:
            assert {"name", "value", "numerator", "denominator", "quantity", "divides", "lease"} <= e.keys()
        json.dumps(res, allow_nan=False)


def test_row_names_include_the_batch_curve():
    assert [bench_workload.row_batch(r) for r in ("vllm", "vllm_b8", "stock_llama_b128", "hf", "vllm_eager")] == [1, 8, 128, 1, 1]
    assert bench_workload.row_engine("stock_llama_b64") == "stock_llama" and bench_workload.row_engine("vllm_b256") == "vllm"
    for bad in ("vllm_b0", "hf_b8", "vllm_eager_b8", "vllm_b", "stock", "vllm_b08"):
        with pytest.raises(ValueError, match="unknown row"):
            bench_workload.row_batch(bad)
    assert bench_workload.curve_rows("vllm", (1, 8, 64)) == ["vllm", "vllm_b8", "vllm_b64"]
    assert bench_workload.engine_groups(["vllm_b64", "hf", "stock_llama_b128", "vllm"]) == [
        ["hf", "vllm", "vllm_b64"], ["stock_llama_b128"]]
    assert bench_render.row_label("vllm_b64") == "our port, 64 rollouts at once"
    assert bench_render.row_label("stock_llama_b128") == "stock vLLM Llama, 128 rollouts at once"


def test_merge_builds_the_throughput_curve():
    rows = [_row("vllm", 1, 22, [22.0]), _row("vllm_b64", 64, 22, [44.0]), _row("stock_llama", 1, 22, [20.0]),
            _row("stock_llama_b64", 64, 22, [40.0]), _row("stock_llama_b128", 128, 22, [60.0])]
    curve = {c["batch"]: c for c in bench_results.merge([_part(rows)])["curve"]}
    assert curve[64]["port_frames_per_s"] == pytest.approx(32.0) and curve[64]["stock_frames_per_s"] == pytest.approx(35.2)
    assert curve[64]["port_vs_stock"] == pytest.approx(32.0 / 35.2, abs=1e-3)
    assert curve[1]["port_vs_stock"] == pytest.approx(20 / 22, abs=1e-3)
    assert curve[128]["port_frames_per_s"] is None and curve[128]["port_vs_stock"] is None


def test_session_rows_join_the_curve_against_stocks_frame_loop():
    assert bench_workload.row_engine("session_b128") == "session" and bench_workload.row_batch("session") == 1
    assert bench_workload.engine_groups(["session_b8", "stock_llama", "session"]) == [["stock_llama"], ["session", "session_b8"]]
    rows = [dict(name="stock_llama_b128", batch=128, frames_per_s=23.4), dict(name="session_b128", batch=128, frames_per_s=31.0),
            dict(name="session", batch=1, frames_per_s=0.7), dict(name="vllm_tp2", batch=1, frames_per_s=0.6, tp=2)]
    curve = {c["batch"]: c for c in bench_analysis.throughput_curve(rows)}
    assert curve[128]["session_vs_stock"] == pytest.approx(31.0 / 23.4, abs=1e-3)
    assert curve[1]["session_frames_per_s"] == 0.7 and curve[1]["session_vs_stock"] is None
    assert bench_render.row_label("session_b64") == "our port, one session per rollout, 64 rollouts at once"


def test_merge_puts_the_memory_floor_beside_each_batch_of_the_curve():
    from terra_nb.port.checkpoints import preset_config
    from terra_nb.bench.roofline import floor_frames_per_s

    rows = [_row("stock_llama", 1, 22, [33.0]), _row("stock_llama_b128", 128, 22, [146.0]), _row("session_b128", 128, 22, [140.0])]
    part = _part(rows)
    part["workload"].update(preset="terra", long_frames=22)
    curve = {c["batch"]: c for c in bench_results.merge([part])["curve"]}
    floor = floor_frames_per_s(preset_config("terra"), 128, 3, 22, "NVIDIA H200")
    assert curve[128]["floor_frames_per_s"] == pytest.approx(floor, abs=1e-3)
    assert curve[128]["stock_of_floor"] == pytest.approx(128 * 22 / 146.0 / floor, abs=1e-3)
    assert curve[128]["session_of_floor"] == pytest.approx(128 * 22 / 140.0 / floor, abs=1e-3)
    assert "port_of_floor" not in curve[128] and curve[1]["stock_of_floor"] < curve[128]["stock_of_floor"]
    # no preset, or a device without a bandwidth on record: the curve as it was
    assert "floor_frames_per_s" not in bench_results.merge([_part(rows)])["curve"][0]


def test_committed_session_results_compare_like_with_like_and_render_their_curve():
    """results/sessions_*.json: every ratio's two rows from one commit, with the engine core in the same
    place; notebook 11's table shows the curve's own figures."""
    from terra_nb.bench.render import sessions_table
    from terra_nb.bench.results import load_sessions

    committed = load_sessions()
    assert committed
    for stem, res in committed.items():
        assert res["commit"] and res["lease"] and len({r.get("engine_core") for r in res["rows"]}) == 1, stem
        assert res["env"]["git_commit"] == res["commit"], (stem, "the device's git named another commit: say which ran")
        table = sessions_table(res)
        for c in res["curve"]:
            if c["stock_frames_per_s"] is None or c.get("session_frames_per_s") is None:  # one side not measured
                assert c.get("session_vs_stock") is None and f"| {c['batch']} | " in table
                continue
            assert f"| {c['batch']} | {c['stock_frames_per_s']:.2f} | {c['session_frames_per_s']:.2f} | {c['session_vs_stock']:.3f} |" in table
            assert c["session_vs_stock"] == pytest.approx(c["session_frames_per_s"] / c["stock_frames_per_s"], abs=1e-3)
        assert res["commit"] in table and res["device"] in table
        from terra_nb.bench.analysis import overhead_ceiling
        from terra_nb.bench.render import steps_table

        steps = steps_table(res)
        for batch, profiles in (res.get("step_profiles") or {}).items():
            for p in (v for k, v in profiles.items() if k != "session_vs_stock"):
                assert p["batch"] == int(batch) and p["overhead_ms"] < p["wall_ms"], (stem, batch)
                assert f"| {batch} | " in steps and f"| {p['wall_ms']:.1f} | " in steps and f"| {overhead_ceiling(p):.3f} |" in steps


def test_seed_setting_lines_and_plot_read_the_seed_rows():
    """Issue 25's explanation, computed from the seed rows (figures made up here, ratios by hand)."""
    from terra_nb.bench.render import seed_setting_lines
    from terra_nb.workbook.viz import seed_frames_plot

    prof = lambda decode, overhead: dict(decode_step_ms=decode, overhead_ms=overhead,  # noqa: E731
                                         by_frame=[dict(index=1, wall_ms=2000.0), dict(index=2, wall_ms=2100.0)])
    rows = [dict(name="hf_seed", frames=22, temperature=1.0, s_per_frame=8.0, frame_s=[6.0, 7.0, 9.0]),
            dict(name="vllm_seed", frames=22, temperature=1.0, s_per_frame=2.0, step_profile=prof(3.0, 300.0)),
            dict(name="vllm_seed_defaults", frames=22, temperature=1.0, s_per_frame=1.0, step_profile=prof(1.5, 40.0))]
    static = dict(name="hf_static", frames=22, temperature=1.0, s_per_frame=3.0)
    assert "the port with today's defaults is 3.00x it" in seed_setting_lines(dict(rows=rows + [static]))[3]
    lines = seed_setting_lines(dict(rows=rows))
    assert "4.00x, against the seed's 2.60x" in lines[0] and "8.00x HF" in lines[1]
    assert "first frame took 6.00 s and its last 9.00 s (1.50x): every call prefills" in lines[2]
    flat = [dict(rows[0], frame_s=[6.0, 6.3])] + rows[1:]
    assert "(1.05x): the context's growth barely shows" in seed_setting_lines(dict(rows=flat))[2]
    # per code: HF 8 s / 576 codes against the port with CUDA graphs' 1 s: at least 1 - 1/8 is the CPU's
    coded = [dict(r, tokens_per_call=576) for r in rows]
    per_code = [ln for ln in seed_setting_lines(dict(rows=coded)) if ln.startswith("Per code")]
    assert per_code and "HF 13.9 ms, the eager port 3.5 ms, the port with CUDA graphs 1.74 ms" in per_code[0]
    assert "at least 88% of HF's time per code and 50% of the eager port's" in per_code[0]
    split3 = [dict(coded[0], trials_s=[22.0 * 9.0, 22.0 * 3.0])] + coded[1:]
    assert not any(ln.startswith("Per code") for ln in seed_setting_lines(dict(rows=split3)))  # no median to trust
    assert "3.00 ms per code against 1.50 ms with CUDA graphs (2.00x)" in lines[3] and "300 ms against 40 ms" in lines[3]
    assert seed_setting_lines(dict(rows=[rows[0]])) == [lines[2]]  # HF alone: its frames only
    # HF's trials 3x apart: the range of ratios, and no per-frame growth read from medians of both
    split = [dict(rows[0], trials_s=[66.0, 22.0 * 4.0])] + rows[1:]
    lines = seed_setting_lines(dict(rows=split))
    assert "4.00 and 3.00 s per frame (1.33x)" not in " ".join(lines) and len(lines) == 5  # 1.33x: still agree
    assert "HF: its trials agree within 1.33x (66.0 and 88.0 s)." in lines[2]
    split = [dict(rows[0], trials_s=[22.0 * 9.0, 22.0 * 3.0])] + rows[1:]
    lines = seed_setting_lines(dict(rows=split))
    assert "9.00 and 3.00 s per frame (3.00x)" in lines[2] and "ratio is 1.50x to 4.50x (the default port: 3.00x to 9.00x)" in lines[2]
    assert not any("first frame took" in ln for ln in lines)
    # HF with cuDNN attention off: its own lines, in its own words, beside the default's
    flash = dict(rows[0], name="hf_seed_flash", s_per_frame=4.0, trials_s=[90.0, 86.0], frame_s=[3.0, 5.0])
    lines = seed_setting_lines(dict(rows=rows + [flash]))
    assert "HF with cuDNN attention off 4.00 s per frame" in lines[3] and "2.00x, against" in lines[3]
    assert "4.00x HF with cuDNN attention off" in lines[4] and "agree within 1.05x (90.0 and 86.0 s)" in lines[5]
    # HF's static path failed: why, from the lease's errors (a row, when there is one, wins)
    failed = dict(rows=rows, errors=[dict(group="hf_static", error="exit 139 (SIGSEGV)"), dict(group="x", error="other")])
    assert "static cache + torch.compile gave no row: exit 139 (SIGSEGV)." in " ".join(seed_setting_lines(failed))
    assert "other" not in " ".join(seed_setting_lines(failed))
    assert "gave no row" not in " ".join(seed_setting_lines(dict(failed, rows=rows + [static])))
    fig = seed_frames_plot(rows)
    (ax,) = fig.axes
    assert [ln.get_label() for ln in ax.lines] == ["hf_seed", "vllm_seed", "vllm_seed_defaults"]
    assert ax.lines[0].get_ydata().tolist() == [6.0, 7.0, 9.0] and ax.lines[1].get_xdata().tolist() == [2, 3]
    with pytest.raises(ValueError, match="nothing to plot"):
        seed_frames_plot([dict(name="hf", s_per_frame=1.0)])


def test_committed_seed_results_name_their_lease_and_render_in_notebook_07():
    """The seed setting's leases (issue 25) in results/benchmark_*.json: one commit and one lease each,
    both sides of the ratio in that lease, and seed_section quotes the lease's own figures and notes
    under its id and commit."""
    from terra_nb.bench.render import seed_section
    from terra_nb.bench.results import by_lease

    seen = 0
    for stem, res in bench_results.load_results().items():
        text = seed_section(stem, res)
        for lid, lease in by_lease(res):
            by = {r["name"]: r for r in lease["rows"]}
            hf = [n for n in ("hf_seed", "hf_seed_flash") if n in by]
            if not ({"vllm_seed"} | set(hf)) & set(by):
                continue
            seen += 1
            assert lease["commit"] and lease["lease"] and lease["env"]["git_commit"] == lease["commit"], lid
            assert hf and "vllm_seed" in by, (lid, "both sides of the seed ratio come from one lease")
            block = text[text.index(f"**results/{stem}.json, lease `{lid}`**"):]
            for name in hf:
                ratio = by[name]["s_per_frame"] / by["vllm_seed"]["s_per_frame"]
                assert f"{ratio:.2f}x, against the seed's 2.60x" in block and lease["commit"] in block
            assert all(n in block for n in lease["notes"])
    assert seen
    assert seed_section("x", dict(rows=[dict(name="hf", s_per_frame=1.0)])) == ""
