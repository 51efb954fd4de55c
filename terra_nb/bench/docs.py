"""The generated sections of README.md and docs/, and the command that refreshes them.

    python -m terra_nb.bench.docs            # rewrite every generated section from the result files
    python -m terra_nb.bench.docs --check    # exit 1 and name each section that is out of date

Each producer returns Markdown computed from committed result files; nothing is typed in
(tests/test_docs.py fails when a section is stale). The producers live beside what they render: the
benchmark's in `bench/headline.py`, the toy world's standing in `toyworld/readme.py`, the GPU and CPU
run reports in `tools/`. The table sits here, above them, so that nothing below imports the
benchmark to render a page (`workbook.docs` holds the markers' machinery).
"""
from __future__ import annotations

import sys

from terra_nb.workbook.docs import Section, main

SECTIONS = (
    Section("README.md", "answer", "terra_nb.bench.headline:answer_markdown"),
    Section("README.md", "headline", "terra_nb.bench.headline:headline_markdown"),
    Section("docs/benchmarks.md", "stock", "terra_nb.bench.headline:stock_markdown"),
    Section("docs/benchmarks.md", "seed", "terra_nb.bench.headline:seed_markdown"),
    Section("docs/benchmarks.md", "gap", "terra_nb.bench.headline:gap_markdown"),
    Section("docs/benchmarks.md", "hf-probe", "terra_nb.bench.headline:hf_probe_markdown"),
    Section("docs/benchmarks.md", "gpu-report", "tools/gpu_report.py:docs_section"),
    Section("docs/benchmarks.md", "cpu-times", "tools/cpu_times.py:docs_section"),
    Section("docs/toy-world.md", "toy-standing", "terra_nb.toyworld.readme:readme_section"),
)

if __name__ == "__main__":
    sys.exit(main(SECTIONS))
