"""The generated sections of README.md and docs/: one table of them, one command that refreshes them.

    python -m terra_nb.workbook.docs            # rewrite every generated section from the result files
    python -m terra_nb.workbook.docs --check    # exit 1 and name each section that is out of date

A generated section is the text between `<!-- NAME:start -->` and `<!-- NAME:end -->` in its file.
Its producer returns Markdown computed from committed result files; nothing is typed in, so a file
cannot drift from its records (tests/test_docs.py fails when one has). The producers live beside
what they render (the benchmark's headline in `bench/headline.py`, the toy world's standing in
`toyworld/readme.py`, the GPU and CPU run reports in `tools/`); the two short ones that only the
README and docs/benchmarks.md need are here.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from terra_nb.bench.stats import and_text, interval_text, rollouts_list_text, rollouts_text
from terra_nb.workbook.paths import REPO, RESULTS


@dataclass(frozen=True)
class Section:
    file: str        # relative to the repository
    name: str        # the marker's name: <!-- name:start --> ... <!-- name:end -->
    producer: str    # "package.module:function" or "tools/script.py:function", called without arguments

    @property
    def start(self) -> str:
        return f"<!-- {self.name}:start -->"

    @property
    def end(self) -> str:
        return f"<!-- {self.name}:end -->"


SECTIONS = (
    Section("README.md", "answer", "terra_nb.workbook.docs:answer_markdown"),
    Section("README.md", "headline", "terra_nb.bench.headline:headline_markdown"),
    Section("docs/benchmarks.md", "runs", "terra_nb.bench.headline:runs_markdown"),
    Section("docs/benchmarks.md", "gap", "terra_nb.bench.headline:gap_markdown"),
    Section("docs/benchmarks.md", "split", "terra_nb.bench.headline:split_markdown"),
    Section("docs/benchmarks.md", "hf-probe", "terra_nb.workbook.docs:hf_probe_markdown"),
    Section("docs/benchmarks.md", "gpu-report", "tools/gpu_report.py:docs_section"),
    Section("docs/benchmarks.md", "cpu-times", "tools/cpu_times.py:docs_section"),
    Section("docs/toy-world.md", "toy-standing", "terra_nb.toyworld.readme:readme_section"),
)


def producer(section: Section) -> Callable[[], str]:
    """The function named by `section.producer`; a script under tools/ is loaded from its file."""
    where, func = section.producer.split(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, REPO / where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, func)


def replace_section(text: str, start: str, end: str, body: str) -> str:
    """`text` with what lies between the markers `start` and `end` replaced by `body`."""
    for marker in (start, end):
        if text.count(marker) != 1:
            raise ValueError(f"expected the marker {marker} exactly once, found it {text.count(marker)} times")
    a, b = text.index(start) + len(start), text.index(end)
    if b < a:
        raise ValueError(f"{end} comes before {start}")
    return text[:a] + "\n" + body.strip() + "\n" + text[b:]


def section_text(text: str, section: Section) -> str:
    """What a file's text holds between the section's markers."""
    return text[text.index(section.start) + len(section.start):text.index(section.end)].strip()


def refresh(root: Path = REPO, sections=SECTIONS, check: bool = False) -> list[str]:
    """Render every section and write those that differ (or, with `check`, only name them).
    Returns "file: name" for each section that was (or would be) rewritten."""
    changed = []
    for s in sections:
        path = Path(root) / s.file
        text = path.read_text()
        new = replace_section(text, s.start, s.end, producer(s)())
        if new != text:
            changed.append(f"{s.file}: {s.name}")
            if not check:
                path.write_text(new)
    return changed


# ------------------------------------------------------------------ the two producers of this module

def _interval(c: dict) -> str:
    return interval_text(c["speedup"], c["interval"])


def _against_stock(cs: list[dict], gap: str | None = None, runs: list[dict] | None = None) -> str:
    """The port against stock, batch by batch, and what the intervals allow saying; then `gap`
    (`headline.gap_clause`), where a profile of the same run says where a slower step's time went.
    With `runs` (more than one run of the same port code), `cs` are their pooled rows
    (`headline.across_runs`), and the run-by-run figures follow."""
    figures = and_text([_interval(c) for c in cs])
    slower = [c["batch"] for c in cs if c["interval"][1] < 1]
    faster = [c["batch"] for c in cs if c["interval"][0] > 1]
    verdict = "within the trials' noise of stock's speed" + (
        f" except at {rollouts_list_text(slower)}, where it is measurably slower" if slower else "")
    if faster:
        verdict += f"; measurably faster at {rollouts_list_text(faster)}"
    over = (f" over {len(runs)} runs of the same port code (the median round, its interval drawn over runs "
            f"and rounds)" if runs else "")
    each = ("; run by run " + "; ".join(f"{and_text([f'{x:.2f}x' for x in c['per_run']])} at "
                                        f"{rollouts_text(c['batch'])}" for c in cs) if runs else "")
    return (f"- **Against stock vLLM** (vLLM's own Llama of the same shape): the port runs at {figures} of "
            f"stock's speed at {rollouts_list_text([c['batch'] for c in cs])}{over}: {verdict}{each}"
            + (f"; {gap}." if gap else "."))


def answer_markdown(results_dir: Path | None = None) -> str:
    """The README's answer in plain words, one line each, from the headline's result files."""
    from terra_nb.bench.headline import across_runs, gap_clause, gap_rows, latest, s_per_frame, split_clause
    from terra_nb.bench.records import loaded, newest, of_same_run, same_code_runs
    from terra_nb.bench.workload import SEED_FIGURES

    (stock_file, stock), (_, seed) = latest("stock", results_dir), latest("seed", results_dir)
    profile = of_same_run("*_mm_path_steps.json", stock, stock_file.parent)
    same = [r for _, r in same_code_runs(stock, "*_headline_stock.json", stock_file.parent)]
    splits = loaded("*_headline_mm_path.json", stock_file.parent)
    split = newest(splits)[1] if splits else None
    pair = {c["name"]: c for c in seed["analysis"]}
    eager, defaults = pair["port_seed_vs_hf"], pair["port_defaults_vs_hf"]
    frame = {side: s_per_frame(seed, eager["block"], side) for side in ("hf", "port_seed", "port_defaults")}
    launch_share = 1 - frame["port_defaults"] / frame["port_seed"]
    reproduced = {"met": "reproduced", "missed": "not reproduced"}.get(eager["verdict"], "not resolved")
    exceeded = {"met": "above", "missed": "below"}.get(defaults["verdict"], "not resolved against")
    seed_hf, seed_vllm = max(SEED_FIGURES.values()), min(SEED_FIGURES.values())
    trials = and_text(sorted({str(c["trials"]) for r in same for c in r["analysis"]}, key=int))
    against_stock = (f"{trials} a side against stock on {stock['device']}, commit{'s' if len(same) > 1 else ''} "
                     f"{and_text([r['commit'][:7] for r in same]) if len(same) > 1 else stock['commit'][:7]}")
    return "\n".join([
        _against_stock(across_runs(same), split_clause(split) if split else None, runs=same) if len(same) > 1 else
        _against_stock(stock["analysis"], gap_clause(gap_rows(stock, profile[1])) if profile else None),
        f"- **Against HF**: the port with vLLM's defaults (CUDA graphs, prefix caching) runs at {_interval(defaults)} "
        f"HF's speed on one video, {exceeded} the seed's {eager['target']:.1f}x.",
        f"- **The seed's {eager['target']:.1f}x** (the write-up this project reproduces) **in its own setting** "
        f"(vLLM run eagerly, no prefix caching): {_interval(eager)}, {reproduced}. At one video both sides wait on Python's per-step work, not the GPU "
        f"({launch_share:.0%} of the eager port's time is what CUDA graphs remove), so the ratio moves with the host: "
        f"HF here {frame['hf']:.2f} s a frame (the seed's {seed_hf:.2f}), the eager port {frame['port_seed']:.2f} "
        f"(the seed's vLLM {seed_vllm:.2f}).",
        f"- Speed-ups of the port (above 1: the port is faster) with 95% intervals, interleaved trials "
        f"({against_stock}; {eager['trials']} a side against HF on {seed['device']}, commit {seed['commit'][:7]}; "
        f"vLLM {stock['versions']['vllm']}): [the headline](#the-headline).",
    ])


def hf_probe_markdown(path: Path | None = None) -> str:
    """HF's one-off cost per new key length under cuDNN's attention, with the machine it was seen on."""
    d = json.loads(Path(path or RESULTS / "hf_probe_h200.json").read_text())
    p = d["probe"]
    s = p["settings"]["default"]
    return (f"On {p['device']} (torch {p['torch']}, cuDNN {p['cudnn']}), with SDPA free to choose cuDNN's attention "
            f"(torch's default there), HF's decode step at a key length new to the process took "
            f"{s['cold_ms_median']:.1f} ms and at a length seen before {s['warm_ms_median']:.1f} ms "
            f"({s['cold_over_warm']:.1f}x, medians of {p['steps']} steps; `results/hf_probe_h200.json`, "
            "`python3 tools/hf_probe.py`). A first video pays that at every step: a cold HF run looks "
            "slower than a warm one. The headline's HF side therefore runs with cuDNN's attention ruled out.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only name the sections that are out of date (exit 1 if any)")
    args = ap.parse_args(argv)
    changed = refresh(check=args.check)
    for c in changed:
        print(("stale: " if args.check else "rewritten: ") + c)
    if not changed:
        print(f"all {len(SECTIONS)} generated sections are up to date")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
