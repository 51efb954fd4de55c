"""`python -m terra_nb.bench ...`: the benchmark's command line.

    python -m terra_nb.bench pairs --plan headline_stock --out results/pairs/<machine>_headline_stock.json
    python -m terra_nb.bench remake results/pairs/<file>.json --out <new file>
    python -m terra_nb.bench quality --out results/faster/<machine>_quality_toy.json
    python -m terra_nb.bench profile --engine port --out <file>.json

`pairs` runs a named plan (`plans.PLANS`, `lever_plans.FASTER_PLANS`) into one result file,
rewritten after every round; `remake` runs a result file's own plan again. `quality` scores the toy
model under each engine variant; `profile` splits one engine's decode step. The README's
and docs' sections that render the results: `python -m terra_nb.bench.docs`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

COMMIT_HELP = "the commit whose code ran, where the machine's git is stale"


def main(argv=None):
    from terra_nb.bench.lever_plans import FASTER_PLANS
    from terra_nb.bench.plans import PLAN_NAMES

    ap = argparse.ArgumentParser(prog="python -m terra_nb.bench", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, what in (("pairs", "interleaved comparisons of a named plan, one result file"),
                       ("remake", "run a result file's plan again (the plan it recorded), into --out")):
        p = sub.add_parser(name, help=what)
        if name == "pairs":
            p.add_argument("--plan", required=True, help="one of " + ", ".join(PLAN_NAMES + tuple(FASTER_PLANS)))
            p.add_argument("--trials", type=int, default=None,
                           help="rounds of every block instead of the plan's (recorded in the file's plan)")
        else:
            p.add_argument("result")
        p.add_argument("--ckpt-root", default="checkpoints")
        p.add_argument("--out", required=True, help="the result file, rewritten after every round")
        p.add_argument("--run", help="how this run was started (machine: command), kept in the file")
        p.add_argument("--deadline-s", type=float, default=None, help="skip rounds that would start after this many seconds")
        p.add_argument("--trial-timeout-s", type=float, default=None,
                       help="stop the run when a side gives no answer to a trial for this many seconds")
        p.add_argument("--commit", help=COMMIT_HELP)
    q = sub.add_parser("quality", help="the toy model's quality under each engine variant (bench/quality.py)")
    q.add_argument("--out", required=True)
    q.add_argument("--variants", default=None, help="comma-separated names of quality.VARIANTS (default: all it can)")
    q.add_argument("--clips", type=int, default=8)
    q.add_argument("--commit", help=COMMIT_HELP)
    pr = sub.add_parser("profile", help="where one decode step's time goes on one engine (port or stock): the host's "
                        "parts and the GPU's kernels (bench/profiling.py), write JSON")
    pr.add_argument("--engine", choices=("port", "stock"), required=True)
    pr.add_argument("--preset", default="terra")
    pr.add_argument("--ckpt-root", default="checkpoints")
    pr.add_argument("--out", required=True)
    pr.add_argument("--engine-kwargs", type=json.loads, default={}, help='JSON engine arguments, e.g. \'{"max_num_seqs": 64}\'')
    pr.add_argument("--commit", help=COMMIT_HELP)
    from terra_nb.bench.profiling import ProfileSpec

    for f in dataclasses.fields(ProfileSpec):   # --batch, --decode-steps, --n-ctx, ...
        kind = (lambda v: v.lower() in ("1", "true", "yes")) if f.type in (bool, "bool") else type(f.default)
        pr.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    a = ap.parse_args(argv)
    if a.cmd in ("pairs", "remake"):
        _pairs(a)
    elif a.cmd == "quality":
        _quality(a)
    else:
        _profile(a)


def _pairs(a: argparse.Namespace) -> None:
    from terra_nb.bench.lever_plans import FASTER_PLANS
    from terra_nb.bench.pairs import TRIAL_TIMEOUT_S, plan_of, run_plan
    from terra_nb.bench.plans import named_plan
    from terra_nb.bench.workload import checkpoint

    if a.cmd == "pairs":
        plan = FASTER_PLANS[a.plan]() if a.plan in FASTER_PLANS else named_plan(a.plan)
    else:
        plan = plan_of(json.loads(Path(a.result).read_text()))
    if getattr(a, "trials", None):
        plan = dataclasses.replace(plan, blocks=tuple(dataclasses.replace(b, trials=a.trials) for b in plan.blocks))
    res = run_plan(plan, checkpoint(Path(a.ckpt_root), plan.preset), Path(a.out), a.run, a.deadline_s, commit=a.commit,
                   trial_timeout_s=a.trial_timeout_s or TRIAL_TIMEOUT_S)
    for c in res["analysis"]:
        print(f"{c['name']}: {c['speedup']:.3f}x [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}], "
              f"{c['trials']} trials a side, verdict {c['verdict']}")
    if res["errors"]:
        print(json.dumps(res["errors"], indent=2))


def _profile(a: argparse.Namespace) -> None:   # `--commit` names the code that ran, the device's stale name kept
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the step clocks reach into the engine core
    from terra_nb.bench.profiling import ProfileSpec, profile_side, summary_lines
    from terra_nb.bench.workload import checkpoint

    spec = ProfileSpec(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ProfileSpec)})
    res = profile_side(a.engine, checkpoint(Path(a.ckpt_root), a.preset), a.preset, spec, a.engine_kwargs)
    if a.commit:
        res = dict(res, env=dict(res["env"], device_git_commit=res["env"].get("git_commit"), git_commit=a.commit))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    print("\n".join(summary_lines(res)))


def _quality(a: argparse.Namespace) -> None:
    from terra_nb.bench.quality import VARIANTS, measure_quality, quality_checks, write

    variants = None if a.variants is None else {v: VARIANTS[v] for v in a.variants.split(",")}
    res = measure_quality(variants, n_clips=a.clips)
    if a.commit:
        res = dict(res, device_git_commit=res["commit"], commit=a.commit)
    res["checks"] = [quality_checks(res, c) for c in ("bf16_fp8kv", "bf16_fp8")]
    write(res, Path(a.out))
    print(json.dumps({k: res[k] for k in ("variants", "checks")}, indent=2))


if __name__ == "__main__":
    main()
