"""The CPU time table of docs/benchmarks.md, from a recorded `make reproduce` run rather than typed figures.

    python tools/cpu_times.py record outputs/summary.json   # -> results/cpu_reproduce.json
    python -m terra_nb.bench.docs                           # docs/benchmarks.md's table from that file

`record --merge` adds (or replaces) only the notebooks of a run restricted to them (`make reproduce
REPRODUCE_ARGS="--only 12"`), each with its own commit, date and load, and keeps every other
notebook's record as it was; the table notes which notebooks were timed on their own.

`record` keeps what a reader needs to judge the times: the machine (CPU model, cores), the load
average before and after the run (these 2-core machines are often shared), the commit (refused
when the tree was dirty: a time must name the code it measured), versions, the command and each
notebook's wall time, kernel start included, with a digest of the notebook's code cells at that
commit (`code_digest`): a notebook whose code changed since has no recorded time any more
(`stale_notebooks`, checked by tests/test_reader_pass.py).

The section also says which notebooks start a vLLM engine, read from the notebooks'
code (`engine_notebooks`: a call of one of `ENGINE_CALLS`), and the table counts the notebooks.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "results" / "cpu_reproduce.json"
NOTEBOOKS = REPO / "notebooks"
# Calls that build a vLLM engine in a notebook's code (the kernel's own, or, for `pairs.run_plan`,
# one process per side).
ENGINE_CALLS = ("make_llm", "make_session_engine", "pairs.run_plan", "LLM", "vllm.LLM", "AsyncLLM", "ServerThread",
                "make_dp_engine")
# Calls that start their engines in processes of their own, as the section says.
ENGINE_CALL_NOTES = {"pairs.run_plan": "each side's engine in a process of its own"}


def notebook_paths(folder: Path = NOTEBOOKS) -> list[Path]:
    return sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))


def _code_cells(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def code_digest(nb_or_path) -> str:
    """sha256 (first 16 hex digits) of a notebook's code cells, in order: what a wall time measured.
    Markdown and stored outputs do not count."""
    nb = nbformat.read(nb_or_path, as_version=4) if isinstance(nb_or_path, (str, Path)) else nb_or_path
    h = hashlib.sha256()
    for src in _code_cells(nb):
        h.update(src.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _calls(src: str) -> set[str]:
    """Dotted names of the functions called in `src` (IPython magics and shell lines left out)."""
    src = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call):
            f, parts = node.func, []
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
            names.add(".".join(reversed(parts)))
    return names


def engine_calls(path: Path) -> list[str]:
    """The `ENGINE_CALLS` that notebook `path`'s code makes."""
    calls = set().union(*[_calls(s) for s in _code_cells(nbformat.read(path, as_version=4))])
    return [c for c in ENGINE_CALLS if c in calls]


def engine_notebooks(folder: Path = NOTEBOOKS) -> list[str]:
    """Numbers ("03", ...) of the notebooks whose code starts a vLLM engine."""
    return [p.name[:2] for p in notebook_paths(folder) if engine_calls(p)]


def number_list(numbers: list[str]) -> str:
    """["03", "04", "10"] -> "03, 04 and 10"."""
    return numbers[0] if len(numbers) == 1 else ", ".join(numbers[:-1]) + " and " + numbers[-1]


def stale_notebooks(path: Path = RECORD, folder: Path = NOTEBOOKS) -> list[str]:
    """Notebooks whose time the record does not hold for their present code: missing from the record,
    recorded without a digest, or with another code digest; and recorded notebooks no longer there."""
    d = json.loads(Path(path).read_text())
    rec = {n["notebook"]: n.get("code_sha256") for n in d["notebooks"]}
    here = {p.stem: code_digest(p) for p in notebook_paths(folder)}
    out = [f"{s}: not in the record" for s in here if s not in rec]
    out += [f"{s}: code changed since commit {d['commit']}" for s in here if s in rec and rec[s] != here[s]]
    out += [f"{s}: recorded, but no such notebook" for s in rec if s not in here]
    return out


def _digest_at(commit: str, stem: str) -> str | None:
    try:
        text = subprocess.run(["git", "show", f"{commit}:notebooks/{stem}.ipynb"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout
    except subprocess.CalledProcessError:
        return None
    return code_digest(nbformat.reads(text, as_version=4))


def record(summary_path: Path, load_before: str | None = None, out: Path = RECORD, merge: bool = False) -> dict:
    """The reproduce run's summary.json, reduced to what the time table and a reader need.

    `merge`: the run's notebooks go into the existing record at `out` (replacing a notebook's old
    entry), each carrying the run's commit, date and load averages; the other notebooks' entries and
    the record's own header stay, and the total is the old one with the merged times swapped in."""
    s = json.loads(Path(summary_path).read_text())
    env = s["environment"]
    commit = env.get("git_commit") or ""
    if not commit or commit.endswith("-dirty") or commit == "unknown":
        raise SystemExit(f"cpu_times: the run's commit is {commit!r}: commit first, then `make reproduce`")
    data = {
        "date": env["date"], "device": env["device"], "cpu_count": env["cpu_count"], "commit": commit,
        "versions": {k: env[k] for k in ("python", "torch", "transformers", "vllm")},
        "load_average_before": load_before, "load_average_after": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "parameters": {k: v for k, v in s["parameters"].items() if k != "out_dir"},
        "total_seconds": s["total_seconds"],
        "notebooks": [{"notebook": Path(n["notebook"]).stem, "status": n["status"], "seconds": n["seconds"],
                       "code_sha256": _digest_at(commit, Path(n["notebook"]).stem)}
                      for n in s["notebooks"]],
    }
    if merge:
        data = _merged(json.loads(Path(out).read_text()), data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return data


def _merged(old: dict, run: dict) -> dict:
    """`old` record with `run`'s notebooks in it, each marked with the run it came from."""
    new = {n["notebook"]: dict(n, commit=run["commit"], date=run["date"], device=run["device"],
                               cpu_count=run["cpu_count"], load_average_before=run["load_average_before"],
                               load_average_after=run["load_average_after"]) for n in run["notebooks"]}
    kept = [n for n in old["notebooks"] if n["notebook"] not in new]
    replaced = sum(n["seconds"] for n in old["notebooks"] if n["notebook"] in new)
    notebooks = sorted(kept + list(new.values()), key=lambda n: n["notebook"])
    total = round(old["total_seconds"] - replaced + sum(n["seconds"] for n in new.values()), 1)
    return dict(old, notebooks=notebooks, total_seconds=total)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def docs_section(path: Path = RECORD) -> str:
    """docs/benchmarks.md's CPU time table (terra_nb.bench.docs); the record keeps the load averages."""
    if not path.exists():
        return "No CPU run is recorded yet (`python tools/cpu_times.py record outputs/summary.json`)."
    d = json.loads(path.read_text())
    ok = [n for n in d["notebooks"] if n["status"] == "ok"]
    lines = [
        f"Wall time per notebook (kernel start included) of one `make reproduce` on {d['device']} "
        f"({d['cpu_count']} cores, shared), commit {d['commit']}, {d['date'][:10]} "
        f"(vllm {d['versions']['vllm']}, torch {d['versions']['torch']}; `results/cpu_reproduce.json`). "
        "`make reproduce` writes your machine's times to `outputs/report.md`.",
        "",
        "| notebook | status | wall time |",
        "|---|---|---:|",
        *[f"| `{n['notebook']}` | {n['status']} | {_duration(n['seconds'])} |" for n in d["notebooks"]],
        f"| all {len(d['notebooks'])} | {len(ok)} ok | {_duration(d['total_seconds'])} |",
    ]
    alone = [n for n in d["notebooks"] if n.get("commit")]
    if alone:
        lines += ["", "Timed in a run of their own (`make reproduce REPRODUCE_ARGS=\"--only NN\"`): "
                  + "; ".join(f"`{n['notebook']}` on {n['device']} ({n['cpu_count']} cores), commit {n['commit']}"
                              for n in alone) + "."]
    engines = engine_notebooks()
    if engines:
        by_call: dict[str, list[str]] = {}
        for p in notebook_paths():
            calls = engine_calls(p)
            if calls:
                by_call.setdefault(calls[0], []).append(p.name[:2])
        how = "; ".join(f"{number_list(nbs)} through `{call}`"
                        + (f" ({ENGINE_CALL_NOTES[call]})" if call in ENGINE_CALL_NOTES else "")
                        for call, nbs in by_call.items())
        lines += ["", f"{len(engines)} of the {len(notebook_paths())} notebooks start a vLLM engine, "
                      f"{number_list(engines)} ({how})"
                  + (f"; {number_list(others)} start none." if (others := [p.name[:2] for p in notebook_paths()
                                                                           if p.name[:2] not in engines]) else ".")]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="?", choices=["record"])
    ap.add_argument("summary", nargs="?", type=Path, help="the summary.json `make reproduce` wrote")
    ap.add_argument("--load-before", default=None, help="the load average before the run (e.g. from `uptime`)")
    ap.add_argument("--merge", action="store_true",
                    help="record only the run's notebooks into the existing record, keeping the others'")
    args = ap.parse_args(argv)
    if args.command == "record":
        if args.summary is None:
            ap.error("record needs the path of summary.json")
        d = record(args.summary, args.load_before, merge=args.merge)
        print(f"recorded {len(d['notebooks'])} notebooks, {d['total_seconds']} s, commit {d['commit']} -> {RECORD}")
    if not args.command:
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
