"""Result files written by notebooks and collected into `outputs/report.md`.

Convention: a notebook has a papermill parameter `out_dir` (None when a reader runs it in
JupyterLab or nbval runs it, the outputs folder when `python -m terra_nb.workbook.reproduce` runs it).
- `figure_path(out_dir, "02_layout")` -> `<out_dir>/figures/02_layout.png` (or None): pass it as
  `save=` to any plotting function in `terra_nb.workbook.viz`;
- `record_result("parity", {...}, out_dir)` -> `<out_dir>/results/parity.json`; the report renders
  every such file as a section (scalars as a key/value table, lists of dicts as tables).
With `out_dir=None` both are no-ops, so running a notebook by hand writes nothing.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from terra_nb.workbook.paths import figures_dir, results_dir


def figure_path(out_dir, name: str) -> Path | None:
    """Where a notebook saves figure `name` (a PNG under `<out_dir>/figures/`, the folder made), or None."""
    if out_dir is None:
        return None
    name = name if name.endswith(".png") else name + ".png"
    figures_dir(out_dir).mkdir(parents=True, exist_ok=True)
    return figures_dir(out_dir) / name


def _jsonable(x: Any) -> Any:
    """Tensors, numpy values, paths and dtypes -> plain JSON values."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):  # torch.Tensor, numpy arrays and scalars
        return _jsonable(x.tolist())
    if hasattr(x, "item"):
        return _jsonable(x.item())
    return str(x)


def record_result(name: str, data: Mapping[str, Any], out_dir) -> Path | None:
    """Write `data` as `<out_dir>/results/<name>.json` for the report; returns the path (None if no out_dir).

    Optional keys with a meaning in the report: `title` (section heading), `note` (a paragraph
    under it). Every other key becomes a row of a key/value table, or its own table when its value
    is a list of dicts (e.g. `rows` of a benchmark).
    """
    if out_dir is None:
        return None
    if not isinstance(data, Mapping):
        raise TypeError(f"record_result expects a dict, got {type(data).__name__}")
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad result name {name!r}: use a plain file stem such as '06_parity'")
    path = results_dir(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")
    return path


def load_results(out_dir) -> dict[str, dict]:
    """All result files under `<out_dir>/results/`, by name, in name order."""
    d = results_dir(out_dir)
    return {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))} if d.is_dir() else {}


def _cell(v: Any) -> str:
    if isinstance(v, float):
        s = f"{v:.4g}" if (v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5)) else f"{v:.4f}".rstrip("0").rstrip(".")
        return s or "0"
    if isinstance(v, (dict, list)):
        v = json.dumps(v)
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[Mapping[str, Any]], columns: list[str] | None = None) -> str:
    """List of dicts -> a GitHub Markdown table (columns: union of keys in first-seen order)."""
    if columns is None:
        columns = []
        for r in rows:
            columns += [k for k in r if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out += _flatten(v, key + ".")
        else:
            out.append((key, v))
    return out


def result_to_markdown(name: str, data: Mapping[str, Any], level: int = 3) -> str:
    """One result file as a Markdown section (see `record_result` for the layout rules)."""
    h = "#" * level
    parts = [f"{h} {data.get('title', name)}"]
    if data.get("note"):
        parts.append(str(data["note"]))
    scalars, tables = [], []
    for k, v in data.items():
        if k in ("title", "note"):
            continue
        if isinstance(v, list) and v and all(isinstance(r, Mapping) for r in v):
            tables.append((k, v))
        elif isinstance(v, Mapping):
            scalars += _flatten(v, k + ".")
        else:
            scalars.append((k, v))
    if scalars:
        parts.append(markdown_table([{"key": k, "value": v} for k, v in scalars]))
    for k, rows in tables:
        parts.append(f"**{k}**\n\n" + markdown_table(rows))
    return "\n\n".join(parts)
