"""The README's CPU time table, from a recorded `make reproduce` run rather than typed figures.

    python tools/cpu_times.py record outputs/summary.json   # -> results/cpu_reproduce.json
    python tools/cpu_times.py --readme                      # README's table from that file

`record` keeps what a reader needs to judge the times: the machine (CPU model, cores), the load
average before and after the run (these 2-core machines are often shared), the commit (refused
when the tree was dirty: a time must name the code it measured), versions, the command and each
notebook's wall time, kernel start included.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from terra_nb.workbook.results import rewrite_readme_section  # noqa: E402

RECORD = REPO / "results" / "cpu_reproduce.json"
README_START, README_END = "<!-- cpu-times:start -->", "<!-- cpu-times:end -->"


def record(summary_path: Path, load_before: str | None = None, out: Path = RECORD) -> dict:
    """The reproduce run's summary.json, reduced to what the README table and a reader need."""
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
        "notebooks": [{"notebook": Path(n["notebook"]).stem, "status": n["status"], "seconds": n["seconds"]}
                      for n in s["notebooks"]],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return data


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def readme_section(path: Path = RECORD) -> str:
    if not path.exists():
        return "No CPU run is recorded yet (`python tools/cpu_times.py record outputs/summary.json`)."
    d = json.loads(path.read_text())
    ok = [n for n in d["notebooks"] if n["status"] == "ok"]
    lines = [
        f"Wall time per notebook (kernel start included) of one `make reproduce` on {d['device']} "
        f"({d['cpu_count']} cores), commit {d['commit']}, {d['date']}; load average "
        f"{d['load_average_before'] or 'not recorded'} before the run and {d['load_average_after']} after "
        f"(vllm {d['versions']['vllm']}, torch {d['versions']['torch']}; recorded in "
        "`results/cpu_reproduce.json`). `make reproduce` writes your machine's times to "
        "`outputs/report.md`.",
        "",
        "| notebook | status | wall time |",
        "|---|---|---:|",
        *[f"| `{n['notebook']}` | {n['status']} | {_duration(n['seconds'])} |" for n in d["notebooks"]],
        f"| all {len(d['notebooks'])} | {len(ok)} ok | {_duration(d['total_seconds'])} |",
    ]
    return "\n".join(lines)


def update_readme(readme: Path = REPO / "README.md", path: Path = RECORD) -> bool:
    return rewrite_readme_section(readme, README_START, README_END, readme_section(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="?", choices=["record"])
    ap.add_argument("summary", nargs="?", type=Path, help="the summary.json `make reproduce` wrote")
    ap.add_argument("--load-before", default=None, help="the load average before the run (e.g. from `uptime`)")
    ap.add_argument("--readme", action="store_true", help="rewrite README's CPU time table from the record")
    args = ap.parse_args(argv)
    if args.command == "record":
        if args.summary is None:
            ap.error("record needs the path of summary.json")
        d = record(args.summary, args.load_before)
        print(f"recorded {len(d['notebooks'])} notebooks, {d['total_seconds']} s, commit {d['commit']} -> {RECORD}")
    if args.readme:
        print("README updated" if update_readme() else "README already up to date")
    if not (args.command or args.readme):
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
