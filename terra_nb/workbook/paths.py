"""Where things live, resolved from the package location rather than the working directory.

Notebooks run with their own folder (`notebooks/`) as the working directory: JupyterLab,
nbval and `python -m terra_nb.workbook.reproduce` all agree on that. Code and notebooks still never
write `../data`: they use these constants, which work from any directory.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (the folder holding `terra_nb/`, `notebooks/`, `data/`)."""

DATA = REPO / "data"
NOTEBOOKS = REPO / "notebooks"
OUTPUTS = REPO / "outputs"
CHECKPOINTS = REPO / "checkpoints"
RESULTS = REPO / "results"
"""Committed result files (e.g. the GPU benchmark), as opposed to `outputs/` which is generated."""


def figures_dir(out_dir) -> Path:
    return Path(out_dir) / "figures"


def results_dir(out_dir) -> Path:
    return Path(out_dir) / "results"
