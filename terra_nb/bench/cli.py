"""The benchmark: HF `generate` vs our vLLM port vs stock vLLM Llama, seconds per generated frame.

Each engine runs in its own process (a vLLM engine does not hand its GPU memory back reliably),
so a lease is a few invocations that each write a *part*, merged into one lease's file; the
leases' files are combined into the one results file (each ratio between two rows of one lease):

    python -m terra_nb.bench run --rows hf,vllm_eager --out part_a.json
    python -m terra_nb.bench run --rows vllm,vllm_b8,vllm_b32 --out part_b.json
    python -m terra_nb.bench run --rows stock_llama --out part_c.json
    python -m terra_nb.bench merge part_a.json part_b.json part_c.json --lease TEXT --out results/leases/h200_<date>_<what>.json
    python -m terra_nb.bench combine results/leases/*.json --out results/benchmark_h200.json

Tensor parallelism, TP=1 and TP=2 on one 2-GPU machine (rows `vllm_tp<T>[_b<N>|_prefill]`, the
ratios `tp2_vs_tp1_b<N>` and `tp2_vs_tp1_prefill`; tools/gpu.sh part `tp`):

    python -m terra_nb.bench tp --tp 1 --batches 1,32 --prefill-prompts 8 --out part_tp1.json
    python -m terra_nb.bench tp --tp 2 --batches 1,32 --prefill-prompts 8 --ref part_tp1.json --out part_tp2.json

`combine results/leases/*.json` is the one command that builds the results file: results/leases/
holds exactly the leases it combines (a test checks the committed file against them), and a lease
that is replaced moves to results/raw/. `merge --curve-notes` appends the notes a curve lease needs,
computed from its parts and rows (`parts_workload_line`, `curve_target_lines`).

Workload (`Workload`): 3 context frames from the sample, then frames generated with the sample
trajectory's actions, temperature 0.9 (the public generator's default), warm-up excluded, the
median of repeated trials. Lengths are forced the cheap way: `eos_token_id=None` in HF and
`ignore_eos=True` in vLLM (never `min_new_tokens` / `min_tokens`: both slow decoding down).

This module is the command line only (argparse); the package's `__init__` lists what each module does.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from terra_nb.bench.measure import StepSpec
from terra_nb.bench.render import curve_target_lines, parts_workload_line, seed_lease_notes, tp_lease_notes, update_readme
from terra_nb.bench.results import combine_files, lease_id, merge
from terra_nb.bench.runner import profile, run, tensor_parallel
from terra_nb.bench.plans import PLAN_NAMES
from terra_nb.bench.workload import ROW_NAMES, SEED_FIGURES, Workload, checkpoint


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    """`--n-ctx`, `--long-repeats`, ...: every `Workload` field but the preset (its own `--preset`)."""
    for f in dataclasses.fields(Workload):
        if f.name != "preset":
            parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)


def _workload(a: argparse.Namespace) -> Workload:
    """The `Workload` of parsed arguments (`--preset` and `_add_workload_args`' options)."""
    return Workload(preset=a.preset, **{f.name: getattr(a, f.name) for f in dataclasses.fields(Workload) if f.name != "preset"})


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m terra_nb.bench", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure some rows, write one part")
    r.add_argument("--rows", required=True, help=f"comma-separated, from {','.join(ROW_NAMES)}")
    r.add_argument("--preset", default="terra")
    r.add_argument("--ckpt-root", default="checkpoints")
    r.add_argument("--out", required=True)
    _add_workload_args(r)
    r.add_argument("--engine-kwargs", type=json.loads, default={},
                   help='JSON keyword arguments for every vLLM engine, e.g. \'{"max_num_seqs": 256}\'')
    r.add_argument("--deadline-s", type=float, default=None, help="skip rows that would start after this many seconds")
    r.add_argument("--profile", action="store_true", help="also profile each vLLM engine (key `profile` in the part)")
    r.add_argument("--profile-batch", type=int, default=32)
    r.add_argument("--profile-decode-steps", type=int, default=64)
    r.add_argument("--step-batches", default="", help="comma-separated batches whose rows also get a frame-step "
                   "profile (key `step_profile`, see bench/step_profile.py)")
    r.add_argument("--step-frames", type=int, default=6, help="frames of each step profile's rollout")
    pr = sub.add_parser("profile", help="cProfile + torch.profiler of one engine (port or stock), write JSON")
    pr.add_argument("--engine", choices=("port", "stock"), required=True)
    pr.add_argument("--preset", default="terra")
    pr.add_argument("--ckpt-root", default="checkpoints")
    pr.add_argument("--out", required=True)
    pr.add_argument("--engine-kwargs", type=json.loads, default={})
    from terra_nb.bench.profiling import ProfileSpec

    for f in dataclasses.fields(ProfileSpec):
        kind = (lambda v: v.lower() in ("1", "true", "yes")) if f.type in (bool, "bool") else type(f.default)
        pr.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    pc = sub.add_parser("profile-compare", help="port vs stock, section by section, from two profile files")
    pc.add_argument("port")
    pc.add_argument("stock")
    t = sub.add_parser("tp", help="tensor parallelism: greedy tokens vs TP=1 (from --ref), the frame loop per "
                       "batch and prefill alone, one part (rows vllm_tp<T>, vllm_tp<T>_b<N>, vllm_tp<T>_prefill)")
    t.add_argument("--tp", type=int, default=2)
    t.add_argument("--ref", help="a part or results file holding TP=1 greedy_tokens")
    t.add_argument("--preset", default="terra")
    t.add_argument("--ckpt-root", default="checkpoints")
    t.add_argument("--out", required=True, help="the part, rewritten after every row")
    t.add_argument("--batches", default="1", help="comma-separated rollouts at once, a row each (e.g. 1,32,128)")
    t.add_argument("--prefill-prompts", type=int, default=0, help="with N > 0, a row of prefill alone: N long "
                   "random prompts at once, one token each")
    t.add_argument("--deadline-s", type=float, default=None, help="skip rows that would start after this many seconds")
    t.add_argument("--engine-kwargs", type=json.loads, default={},
                   help="JSON keyword arguments for the engine at either size, e.g. '{\"enforce_eager\": true}'")
    _add_workload_args(t)
    sub.add_parser("readme", help="rewrite the README's benchmark table from results/benchmark_*.json")
    sub.add_parser("headline", help="rewrite the README's headline block from results/pairs/*_headline_*.json")
    m = sub.add_parser("merge", help="merge one lease's parts into one lease's file, e.g. results/leases/h200_<date>_<what>.json")
    m.add_argument("parts", nargs="+")
    m.add_argument("--out", required=True)
    m.add_argument("--lease", help="which machine lease measured the parts (the file's `lease`), e.g. 'H200 lease 1 of "
                   "2026-11-27: bash tools/gpu.sh bg curve_port curve_stock'")
    m.add_argument("--note", action="append", default=[], help="a note on what the file's figures leave out (repeatable)")
    m.add_argument("--curve-notes", action="store_true", help="append notes computed from the parts and rows: the "
                   "workload every part shared (parts_workload_line; refused where the parts differ) and the curve "
                   "against its targets (CURVE_TARGETS, curve_target_lines)")
    m.add_argument("--seed-notes", action="store_true", help="append notes computed from the parts and rows of a "
                   "seed lease: the workload the parts shared and seed_lease_notes (with --earlier, an "
                   "earlier seed lease's file; with --probe, an hf_probe result)")
    m.add_argument("--tp-notes", action="store_true", help="append notes computed from the parts and rows of a "
                   "`bench tp` lease: the workload the parts shared and tp_lease_notes (TP=2 ÷ TP=1 per "
                   "batch and for prefill, greedy codes, why not at 1 rollout)")
    m.add_argument("--earlier", help="an earlier seed lease's file, for --seed-notes")
    m.add_argument("--probe", help="an hf_probe result file (results/hf_probe_<gpu>.json), for --seed-notes")
    m.add_argument("--error", action="append", default=[], metavar="GROUP=TEXT",
                   help="a failure the parts could not record (e.g. a process that died): adds {group, error} to `errors`")
    m.add_argument("--commit", help="the commit whose code ran, where the device's git named another (a stale .git): "
                   "sets `commit` and `env.git_commit`, keeping the device's in `env.device_git_commit`")
    m.add_argument("--chart", action="store_true", help="also write a PNG chart beside --out (not committed)")
    c = sub.add_parser("combine", help="combine lease files (merge's) into results/benchmark_<gpu>.json; "
                       "each lease's id is its file's stem")
    c.add_argument("leases", nargs="+")
    c.add_argument("--out", required=True)
    pp = sub.add_parser("pairs", help="interleaved comparisons of a named plan (bench/plans.py): every side in "
                        "its own process, trials in turn, settings read back and checked, one result file")
    pp.add_argument("--plan", required=True, help="one of " + ", ".join(PLAN_NAMES))
    pp.add_argument("--ckpt-root", default="checkpoints")
    pp.add_argument("--out", required=True, help="the result file, rewritten after every round")
    pp.add_argument("--lease", help="which machine lease ran it, e.g. 'H200 lease 1 of 2026-11-26'")
    pp.add_argument("--deadline-s", type=float, default=None, help="skip rounds that would start after this many seconds")
    pp.add_argument("--commit", help="the commit whose code ran, where the machine's git is stale (pairs.with_commit)")
    pp.add_argument("--trials", type=int, default=None,
                    help="rounds of every block instead of the plan's (recorded in the file's plan: remake repeats it)")
    q = sub.add_parser("quality", help="the toy model's quality under each engine variant (bench/quality.py: fp32, "
                       "bf16, FP8 KV, FP8 weights) against HF float32, teacher-forced and free-running")
    q.add_argument("--out", required=True)
    q.add_argument("--variants", default=None, help="comma-separated names of quality.VARIANTS (default: all a GPU "
                   "runs, or quality.CPU_VARIANTS on the CPU)")
    q.add_argument("--clips", type=int, default=8)
    q.add_argument("--commit", help="the commit whose code ran, where the machine's git is stale")
    rm = sub.add_parser("remake", help="run a result file's plan again (the plan it recorded), into --out")
    rm.add_argument("result")
    rm.add_argument("--ckpt-root", default="checkpoints")
    rm.add_argument("--out", required=True)
    rm.add_argument("--lease")
    rm.add_argument("--deadline-s", type=float, default=None)
    rm.add_argument("--commit")
    a = ap.parse_args(argv)
    if a.cmd in ("pairs", "remake"):
        from terra_nb.bench.pairs import plan_of, run_plan
        from terra_nb.bench.plans import named_plan

        plan = named_plan(a.plan) if a.cmd == "pairs" else plan_of(json.loads(Path(a.result).read_text()))
        if getattr(a, "trials", None):
            plan = dataclasses.replace(plan, blocks=tuple(dataclasses.replace(b, trials=a.trials) for b in plan.blocks))
        ckpt = checkpoint(Path(a.ckpt_root), Workload(preset=plan.preset))
        res = run_plan(plan, ckpt, Path(a.out), a.lease, a.deadline_s, commit=a.commit)
        for c in res["analysis"]:
            print(f"{c['name']}: {c['speedup']:.3f}x [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}], "
                  f"{c['trials']} trials a side, verdict {c['verdict']}")
        if res["errors"]:
            print(json.dumps(res["errors"], indent=2))
        return
    if a.cmd == "quality":
        from terra_nb.bench.quality import VARIANTS, measure_quality, quality_checks, write

        variants = None if a.variants is None else {v: VARIANTS[v] for v in a.variants.split(",")}
        res = measure_quality(variants, n_clips=a.clips)
        if a.commit:
            res = dict(res, device_git_commit=res["commit"], commit=a.commit)
        res["checks"] = [quality_checks(res, c) for c in ("bf16_fp8kv", "bf16_fp8")]
        write(res, Path(a.out))
        print(json.dumps({k: res[k] for k in ("variants", "checks")}, indent=2))
        return
    if a.cmd == "run":
        wl = _workload(a)
        from terra_nb.bench.profiling import ProfileSpec

        spec = ProfileSpec(batch=a.profile_batch, decode_steps=a.profile_decode_steps, n_ctx=wl.n_ctx,
                           temperature=wl.temperature) if a.profile else None
        steps = StepSpec(tuple(int(b) for b in a.step_batches.split(",") if b), a.step_frames)
        res = run(a.rows.split(","), wl, Path(a.ckpt_root), a.engine_kwargs, partial=Path(a.out),
                  deadline_s=a.deadline_s, profile_spec=spec, steps=steps)
        print(json.dumps([{k: v for k, v in r.items() if k != "greedy_tokens"} for r in res["rows"]], indent=2))
        if "profile" in res:
            from terra_nb.bench.profiling import summary_lines

            print("\n".join(summary_lines(res["profile"])))
    elif a.cmd == "profile":
        from terra_nb.bench.profiling import ProfileSpec, summary_lines

        spec = ProfileSpec(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ProfileSpec)})
        res = profile(a.engine, Workload(preset=a.preset, n_ctx=spec.n_ctx), Path(a.ckpt_root), spec, a.engine_kwargs)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))
        print("\n".join(summary_lines(res)))
    elif a.cmd == "profile-compare":
        from terra_nb.bench.profiling import compare

        port, stock = (json.loads(Path(f).read_text()) for f in (a.port, a.stock))
        print(json.dumps(compare(port, stock), indent=2))
    elif a.cmd == "headline":
        from terra_nb.bench.headline import update_readme as update_headline

        print("README headline updated" if update_headline() else "README headline already up to date")
    elif a.cmd == "readme":
        print("README updated" if update_readme() else "README already up to date")
    elif a.cmd == "tp":
        ref = json.loads(Path(a.ref).read_text()) if a.ref else None
        res = tensor_parallel(_workload(a), Path(a.ckpt_root), a.tp, ref, tuple(int(b) for b in a.batches.split(",") if b),
                              a.prefill_prompts, partial=Path(a.out), deadline_s=a.deadline_s, engine_kwargs=a.engine_kwargs)
        print(json.dumps([{k: v for k, v in r.items() if k != "greedy_tokens"} for r in res["rows"]], indent=2))
        if res["errors"]:
            print(json.dumps(res["errors"], indent=2))
    elif a.cmd == "combine":
        res = combine_files([Path(f) for f in a.leases])
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        for e in res["ratios"]:
            print(f"{e['lease']}: {e['name']} = {e['value']:.3f} ({e['divides']}; {e['numerator']} / {e['denominator']})")
    else:
        parts = [json.loads(Path(p).read_text()) for p in a.parts]
        res = merge(parts)
        if a.lease:
            res["lease"] = a.lease
        if a.commit:
            res["env"] = dict(res["env"], device_git_commit=res["env"].get("git_commit"), git_commit=a.commit)
            res["commit"] = a.commit
        notes = list(a.note)
        if a.curve_notes:
            notes += [parts_workload_line(parts)] + curve_target_lines(res)
        if a.seed_notes:
            earlier = json.loads(Path(a.earlier).read_text()) if a.earlier else None
            if earlier:
                earlier.setdefault("lease_id", lease_id(a.earlier))
            probe = json.loads(Path(a.probe).read_text()) if a.probe else None
            notes += [parts_workload_line(parts)] + seed_lease_notes(res, earlier, probe)
        if a.tp_notes:
            notes += [parts_workload_line(parts, may_differ=("tensor_parallel_size",))] + tp_lease_notes(res)
        for e in a.error:
            group, _, text = e.partition("=")
            res["errors"].append(dict(group=group, error=text))
        if notes:
            res["notes"] = notes
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        for part in parts:  # the full profiles, beside the results: results/profile_<gpu>_<engine>.json
            if "profile" in part:
                prof = dict(part["profile"], env=part["env"], command=part["command"], dtype=part["dtype"])
                stem = out.stem.replace("benchmark", "profile") if "benchmark" in out.stem else f"profile_{out.stem}"
                out.with_name(f"{stem}_{prof['engine']}.json").write_text(json.dumps(prof, indent=2))
        if a.chart:
            from terra_nb.workbook.viz import bar_chart_benchmark

            frame_rows = [r for r in res["rows"] if "s_per_frame" in r]   # not a TP prefill row (prompt tokens)
            bar_chart_benchmark(frame_rows, SEED_FIGURES, note=f"{res['device']}, vLLM {res['versions']['vllm']}",
                                save=out.with_suffix(".png"), curve=res["curve"])
        print(json.dumps({k: res[k] for k in ("device", "speedup_vs_hf", "prefix_cache_hit_rate", "ratios")}, indent=2))


if __name__ == "__main__":
    main()
