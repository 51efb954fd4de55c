"""The GPU runner's report: `results/gpu_report_<gpu>.md` from what `tools/gpu_runner.sh` left in
its state folder (environment, per-notebook papermill summaries and results, test and nbval steps).

    python tools/gpu_report.py STATE_DIR --run TEXT [--commit SHA] [--out DIR] [--note TEXT ...]
        # writes DIR/gpu_report_<gpu>.md and .json: one commit, one run
    python tools/gpu_report.py STATE_DIR --record-tree   # STATE_DIR/tree.json (the runner's setup)

A report holds the results of one run: one commit (the code the device ran; `--commit` overrides
the device copy's `git rev-parse`, which is stale when its .git came from elsewhere) and one run
(`--run`: a name for the run, e.g. "H200, first run"). Re-runs on another commit or machine belong
in a report of their own, or in the JSON's `other_runs` (a separate, labelled table).

What the device ran is recorded when the runner's `setup` installs the project (`tree.json`): the
tree of its files (every file git does not ignore, hashed into a git tree with a scratch index, so
neither the device copy's index, file modes nor HEAD enter it), the HEAD its git reports and the
tracked files whose content differs from that HEAD. The report checks the tree against `--commit`
where the repository has that commit (the CPU side, from the runner's state archive), and every
step records the HEAD it ran on, so that a state holding steps of several checkouts says so.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def markdown_table(rows) -> str:
    """`terra_nb.workbook.results.markdown_table`, imported where a report is written: importing
    anything of terra_nb imports torch and transformers (terra_nb/__init__ registers the HF classes:
    ~9 s of CPU on the 2-core machine), which the runner's setup step (`--record-tree`) never needs."""
    from terra_nb.workbook.results import markdown_table as table

    return table(rows)


def gpu_slug(device: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'NVIDIA H200' -> 'h200'; otherwise a lower-case word."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", device)
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_") or "gpu").lower()


def _git(repo: Path, *args: str, stdin: str | None = None, env: dict | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True,
                          check=True, timeout=120, env=env).stdout


def working_tree(repo: Path = REPO) -> str:
    """The git tree id of every file in `repo` that git does not ignore, as they are on disk, in a
    scratch index (the repository's own index does not enter). File modes are HEAD's where HEAD has
    the file: a copy that lost the +x bits still has the commit's tree."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GIT_INDEX_FILE=os.path.join(tmp, "index"))
        _git(repo, "read-tree", "HEAD", env=env)
        _git(repo, "-c", "core.fileMode=false", "add", "-A", ".", env=env)
        return _git(repo, "write-tree", env=env).strip()


def tree_state(repo: Path = REPO) -> dict:
    """What is checked out: the tree of its files, the HEAD its git reports and the tracked files
    whose content differs from that HEAD (blob by blob, not `git status`, so a copied tree whose
    modes, timestamps or index changed still counts as HEAD)."""
    try:
        head = _git(repo, "rev-parse", "HEAD").strip()
        entries = []
        for line in _git(repo, "ls-tree", "-r", "-z", "HEAD").split("\0"):
            if line:
                meta, path = line.split("\t", 1)
                mode, kind, blob = meta.split()
                if kind == "blob" and mode != "120000":  # symbolic links: nothing to hash here
                    entries.append((path, blob))
        present = [(p, b) for p, b in entries if (repo / p).is_file()]
        hashes = _git(repo, "hash-object", "--stdin-paths", stdin="".join(p + "\n" for p, _ in present)).split()
        tree = working_tree(repo)
    except (OSError, subprocess.SubprocessError) as e:
        return {"commit": None, "clean": None, "changed": [], "error": str(e)[:200]}
    changed = sorted({p for (p, b), h in zip(present, hashes) if h != b} | {p for p, _ in entries if not (repo / p).is_file()})
    return {"commit": head, "short": head[:7], "clean": not changed, "changed": changed, "tree": tree}


def commit_label(tree: dict | None) -> str:
    """'abc1234' for a checkout whose tracked files are HEAD's, 'abc1234-dirty (...)' otherwise."""
    if not tree or not tree.get("commit"):
        return "unknown" + (f" ({tree['error']})" if tree and tree.get("error") else "")
    if tree["clean"]:
        return tree["short"]
    shown = ", ".join(tree["changed"][:8]) + (", ..." if len(tree["changed"]) > 8 else "")
    return f"{tree['short']}-dirty ({len(tree['changed'])} tracked files differ from it: {shown})"


def step_commits(state: Path) -> dict[str, list[str]]:
    """HEAD -> the steps that ran on it (steps recorded before HEADs were recorded: 'unrecorded')."""
    out: dict[str, list[str]] = {}
    for step in sorted((state / "steps").glob("*.json")):
        s = json.loads(step.read_text())
        out.setdefault(s.get("commit") or "unrecorded", []).append(s["step"])
    return out


def tree_check(tree: dict | None, commit: str | None, repo: Path = REPO) -> str | None:
    """Whether the files the device ran are `commit`'s tree: a sentence, or None with nothing to say."""
    if not tree or not tree.get("tree"):
        return None
    if commit:
        try:
            expected = _git(repo, "rev-parse", f"{commit}^{{tree}}").strip()
        except (OSError, subprocess.SubprocessError):
            return f"files run: tree {tree['tree'][:12]} (commit {commit} is not in this repository: not checked)"
        same = expected == tree["tree"]
        return (f"files run: tree {tree['tree'][:12]}, " + ("the same as" if same else "**DIFFERENT from**")
                + f" commit {commit}'s")
    return f"files run: tree {tree['tree'][:12]}; the device's git: {commit_label(tree)}"


def _commit(state: Path, commit: str | None) -> str:
    """`--commit`, else what setup recorded (tree.json), else the environment's git_commit."""
    if commit:
        return commit
    tree = _json(state / "tree.json")
    if tree:
        return commit_label(tree)
    return (_json(state / "environment.json") or {}).get("git_commit") or "unknown"


def commit_lines(state: Path, commit: str | None) -> list[str]:
    """The header's check of the files run, and a warning when the steps ran on several HEADs."""
    lines = []
    check = tree_check(_json(state / "tree.json"), commit)
    if check:
        lines.append(f"- {check}")
    heads = step_commits(state)
    if len(heads) > 1:
        lines.append("- **steps from more than one checkout** (not one run): " + "; ".join(
            f"{c}: {', '.join(steps)}" for c, steps in heads.items()))
    return lines


def _json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _pytest_line(log: Path) -> str:
    """pytest's closing line ('12 passed, 1 skipped in 80.1s'), without the '=' rule."""
    if not log.exists():
        return ""
    lines = [ln.strip("= \n") for ln in log.read_text(errors="replace").splitlines()
             if re.search(r"\b(passed|failed|error|skipped|no tests ran)\b", ln) and " in " in ln]
    return lines[-1] if lines else ""


def notebook_rows(state: Path) -> list[dict]:
    """One row per notebook that papermill or nbval ran: status, preset and wall time of each."""
    runs = {}
    for summary in sorted((state / "reproduce").glob("*/summary.json")):
        s = json.loads(summary.read_text())
        for nb in s["notebooks"]:
            name = Path(nb["notebook"]).name
            params = {**s.get("parameters", {}), **s.get("notebook_parameters", {}).get(name[:2], {})}
            runs[name[:2]] = (name, nb, params.get("preset", "?"))
    numbers = sorted(set(runs) | {p.stem[6:] for p in (state / "steps").glob("nbval_*.json")})
    rows, running = [], unfinished_steps(state)
    for nn in numbers:
        name, nb, preset = runs.get(nn, (nn, None, ""))
        nbval = _json(state / "steps" / f"nbval_{nn}.json")
        if f"reproduce_{nn}" in running and nb is None:
            nb = {"status": "unfinished", "seconds": None, "error": "still running when the report was written"}
        rows.append({
            "notebook": name, "papermill": "not run" if nb is None else nb["status"], "preset": preset,
            "wall time (s)": None if nb is None else nb["seconds"],
            "nbval": ("not run" if nbval is None else "passed" if nbval["rc"] == 0 else f"FAILED (exit {nbval['rc']})"),
            "nbval time (s)": None if nbval is None else nbval["seconds"],
            "error": ((nb or {}).get("error") or "")[:120],
        })
    return rows


def unfinished_steps(state: Path) -> set[str]:
    """Steps the lanes had started (or started again) but not finished when the report was
    written, as the runner names them ('test_fast', 'reproduce_09'): their records, if any, are
    a first attempt's."""
    log = state / "lanes.log"
    running: set[str] = set()
    for line in (log.read_text().splitlines() if log.exists() else []):
        m = re.match(r"\S+ (start|retry|done) +(\w+) (\w+)", line)
        if m:
            name = f"{m.group(2)}_{m.group(3)}"
            (running.discard if m.group(1) == "done" else running.add)(name)
    return running


def lane_lines(state: Path) -> list[str]:
    """`start`'s lanes: when each step started and ended (empty when steps ran one by one)."""
    log = state / "lanes.log"
    if not log.exists():
        return []
    text = log.read_text().rstrip()
    lanes = re.findall(r"lane (\w+): engines capped at ([0-9.]+)", text)
    retries = [line.split(" ", 1)[1] for line in text.splitlines() if " retry " in line]
    out = [f"## Timeline (`gpu_runner.sh start`: {len(lanes)} lanes side by side on the one GPU)", "",
           "Each lane capped its engines' share of GPU memory (`TERRA_NB_GPU_MEMORY_UTILIZATION`: "
           + ", ".join(f"{name} {share}" for name, share in lanes) + "); wall times above include sharing "
           "the GPU and its host.", ""]
    out += [f"Steps run a second time after losing the engines' start-up memory race: {len(retries)}"
            + (" (" + "; ".join(retries) + ")" if retries else "") + ".", ""]
    return out + ["```", text, "```", ""]


def test_rows(state: Path) -> list[dict]:
    rows, running = [], unfinished_steps(state)
    for step in sorted((state / "steps").glob("test_*.json")):
        s = json.loads(step.read_text())
        rerun = s["step"] in running
        rows.append({"group": s["step"][5:], "exit": s["rc"], "seconds": s["seconds"],
                     "pytest": ("(second attempt unfinished when the machine was returned; this is the first's) " if rerun else "")
                     + _pytest_line(step.with_name(f"{s['step']}.attempt1.log.txt") if rerun else step.with_suffix(".log"))})
    return rows


def parity_lines(state: Path) -> list[str]:
    res = _json(state / "reproduce" / "06" / "results" / "06_parity.json")
    if res is None:
        return ["(notebook 06 left no parity result)"]
    out = [f"- free-running greedy, HF vs vLLM: {res['equal']} of {res['tokens']} codes equal over "
           f"{res['frames']} frames; first mismatch: {res['first_mismatch']}"]
    tf = res.get("teacher_forced")
    if tf:
        out.append(f"- teacher-forced (both score HF's rollout), {tf['dtype']}: top-1 agreement {tf['top1_agreement']}, "
                   f"{tf['top1_disagreements']} disagreements of which {tf['of_which_near_ties']} near-ties; largest "
                   f"|HF - vLLM| logprob {tf['max_abs_logprob_gap']:.4g} (tolerance {tf['tolerance']:g}); "
                   f"positions where HF's two best codes lie within the tolerance: "
                   f"{tf['positions_with_hf_top2_within_tolerance']} of {tf['scored_codes']}; passed: {tf['passed']}")
    return out


def report_data(state: Path, commit: str | None = None, run: str | None = None,
                notes: list[str] | None = None) -> dict:
    """What docs/benchmarks.md's GPU section is generated from (saved beside the report as JSON)."""
    env = _json(state / "environment.json") or {}
    parity = _json(state / "reproduce" / "06" / "results" / "06_parity.json") or {}
    running = unfinished_steps(state)
    return {
        "device": env.get("device", "unknown GPU"), "date": env.get("date"),
        "versions": {k: env.get(k) for k in ("python", "torch", "transformers", "vllm")},
        "commit": _commit(state, commit), "run": run or "run not named",
        "notebooks": notebook_rows(state),
        "parity_06": {k: parity.get(k) for k in ("equal", "tokens", "frames", "first_mismatch", "teacher_forced")},
        "tests": [{"group": r["group"], "exit": r["exit"], "seconds": r["seconds"],
                   "unfinished": f"test_{r['group']}" in running} for r in test_rows(state)],
        "notes": list(notes or []),
        "other_runs": [],
    }


def build_report(state: Path, notes: list[str] | None = None, commit: str | None = None,
                 run: str | None = None) -> tuple[str, str]:
    env = _json(state / "environment.json") or {}
    device = env.get("device", "unknown GPU")
    nbs, tests = notebook_rows(state), test_rows(state)
    data = report_data(state, commit, run)
    lines = [
        f"# GPU runner report: {device}",
        "",
        "Written by `tools/gpu_runner.sh` (steps: setup, `make reproduce BACKEND=gpu` notebook by notebook, "
        "`make test BACKEND=gpu` in groups and nbval notebook by notebook, report).",
        "",
        f"- date: {env.get('date', '?')}",
        f"- device: {device} ({env.get('gpu_count', '?')} GPU(s), {env.get('cpu_count', '?')} CPU cores)",
        f"- versions: python {env.get('python')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"vllm {env.get('vllm')}",
        f"- commit: {data['commit']} (every result below is this commit's)",
        *commit_lines(state, commit),
        f"- run: {data['run']}",
        "",
        "## Notebooks (papermill: `make reproduce BACKEND=gpu`; nbval: the notebooks' defaults, "
        "tiny model, on the GPU)",
        "",
        markdown_table(nbs) if nbs else "(no notebook ran)",
        "",
        f"papermill total: {sum(r['wall time (s)'] or 0 for r in nbs):.0f} s, "
        f"{sum(r['papermill'] == 'ok' for r in nbs)} of {len(nbs)} notebooks ok; nbval: "
        f"{sum(r['nbval'] == 'passed' for r in nbs)} of {len(nbs)} passed, "
        f"{sum(r['nbval time (s)'] or 0 for r in nbs):.0f} s.",
        "",
        "## bf16 parity (notebook 06, Terra shape, random weights)",
        "",
        *parity_lines(state),
        "",
        "## Unit tests (`make test BACKEND=gpu`, in groups)",
        "",
        markdown_table(tests) if tests else "(no test group ran)",
        "",
        f"unit-test groups: {sum(r['exit'] == 0 for r in tests)} of {len(tests)} passed, "
        f"{sum(r['seconds'] for r in tests):.0f} s in all.",
        "",
        *lane_lines(state),
    ]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    bench = _json(state / "reproduce" / "07" / "results" / "07_benchmark_here.json")
    if bench:
        lines += ["", "## Notebook 07's re-measurement", "", bench.get("note", ""), "",
                  markdown_table(bench.get("rows", []))]
    return gpu_slug(device), "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- docs/benchmarks.md's GPU section

def _nbval_line(rows: list[dict]) -> str:
    ran = [r for r in rows if r["nbval"] != "not run"]
    failed = [r["notebook"][:2] for r in ran if r["nbval"] != "passed"]
    return (f"{len(ran) - len(failed)} of {len(ran)} passed"
            + (f" (failed: {', '.join(failed)})" if failed else ""))


def report_paragraph(stem: str, d: dict) -> str:
    """One report in a paragraph: the machine, the commit, and every figure of that one run."""
    nbs = d["notebooks"]
    times = ", ".join(f"{r['notebook'][:2]} {r['wall time (s)']:.0f} s"
                      + ("" if r["preset"] == "terra" else f" ({r['preset']})")
                      for r in nbs if r["papermill"] == "ok")
    out = [f"**[results/{stem}.md](../results/{stem}.md)** ({d['device']}, vLLM {d['versions']['vllm']}, "
           f"commit {d['commit']}, {(d.get('date') or 'date not recorded')[:10]}). Papermill ran "
           f"{sum(r['papermill'] == 'ok' for r in nbs)} of {len(nbs)} notebooks without error, wall time each "
           f"(Terra shape unless marked): {times}. nbval: {_nbval_line(nbs)}."]
    if "tests" in d:  # reports written before the JSON carried the test groups say nothing of them
        tests = d["tests"]
        passed = [t["group"] for t in tests if t["exit"] == 0]
        others = [t["group"] + (" (unfinished)" if t.get("unfinished") else f" (exit {t['exit']})")
                  for t in tests if t["exit"] != 0]
        out.append(f"Unit-test groups: {len(passed)} of {len(tests)} passed"
                   + (f" ({', '.join(passed)})" if passed else "") + (f"; not passed: {', '.join(others)}" if others else "")
                   + ".")
    p, tf = d.get("parity_06") or {}, (d.get("parity_06") or {}).get("teacher_forced")
    if tf:
        out.append(f"Notebook 06 ({tf['dtype']}): teacher-forced top-1 agreement {tf['top1_agreement']}, "
                   f"{tf['of_which_near_ties']} of {tf['top1_disagreements']} disagreements near-ties, largest logprob "
                   f"gap {tf['max_abs_logprob_gap']:.2g} (tolerance {tf['tolerance']:g}); free-running greedy "
                   f"agreement {p['equal']}/{p['tokens']}"
                   + (f", first flip at code {p['first_mismatch']['index']}." if p.get("first_mismatch") else "."))
    for run in d.get("other_runs", []):
        res = "; ".join(f"{nb} {status}" for nb, status in run["nbval"].items())
        out.append(f"Another commit, in the report's separate table: {run['commit']}: nbval {res}.")
    return " ".join(out)


def docs_section(results_dir: Path = REPO / "results") -> str:
    """docs/benchmarks.md's GPU section: one paragraph per committed report (terra_nb.bench.docs)."""
    reports = {p.stem: json.loads(p.read_text()) for p in sorted(results_dir.glob("gpu_report_*.json"))}
    if not reports:
        return "No GPU report is committed yet (`results/gpu_report_<gpu>.json`)."
    return "\n\n".join(report_paragraph(stem, d) for stem, d in reports.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("state", type=Path, nargs="?")
    ap.add_argument("--out", type=Path, default=None, help="folder for the report (default: the state folder)")
    ap.add_argument("--note", action="append", default=[], help="a line for the report's Notes section")
    ap.add_argument("--commit", default=None, help="the commit the device ran (default: its git rev-parse)")
    ap.add_argument("--run", default=None, help='a name for the run, e.g. "H200, second run"')
    ap.add_argument("--record-tree", action="store_true",
                    help="only write STATE_DIR/tree.json: the files checked out here and git's HEAD")
    args = ap.parse_args(argv)
    if args.record_tree:
        if args.state is None:
            ap.error("STATE_DIR is required with --record-tree")
        args.state.mkdir(parents=True, exist_ok=True)
        tree = tree_state()
        (args.state / "tree.json").write_text(json.dumps(tree, indent=2))
        print(tree_check(tree, None) or f"git commit: {commit_label(tree)}")
        return 0
    if args.state is None:
        ap.error("STATE_DIR is required")
    slug, text = build_report(args.state, args.note, args.commit, args.run)
    out = (args.out or args.state) / f"gpu_report_{slug}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    data = report_data(args.state, args.commit, args.run, args.note)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(text)
    print(f"written: {out} and {out.with_suffix('.json').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
