"""Notebook kernels drop known environment noise from stderr and nothing else; the committed
notebooks carry no stderr output and no warnings."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from terra_nb.workbook import reproduce
from terra_nb_kernel import NOISE, NoiseFilter, drop_noise

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import nb as nbtools  # noqa: E402

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SAMPLES = {
    "triton without a CPU backend": "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "NUMA binding notice": "[W1122 01:57:43.901668965 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for "
                           "memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to "
                           "these NUMA nodes. (function init_cpu_memory_env)",
    "weight-loading progress bar": "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 107.22it/s]",
}


pytestmark = pytest.mark.notebook


def test_every_pattern_has_a_sample():
    assert set(SAMPLES) == set(NOISE)
    for name, line in SAMPLES.items():
        assert NOISE[name].match(line)


def test_drop_noise_keeps_everything_else():
    bar = ("\rLoading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]"
           "\rLoading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 107.22it/s]\n\n")
    assert drop_noise(bar) == ""
    assert drop_noise(SAMPLES["triton without a CPU backend"] + "\n") == ""
    assert drop_noise(SAMPLES["NUMA binding notice"] + "\nValueError: a real problem\n") == "ValueError: a real problem\n"
    assert drop_noise("Triton is installed, but something else\n") == "Triton is installed, but something else\n"
    assert drop_noise("\n") == "\n" and drop_noise("") == ""


NOISY_CELL = r'''
import subprocess, sys, warnings
lines = {lines!r}
subprocess.run([sys.executable, "-c",
                "import sys, warnings\n"
                "for ln in " + repr(lines) + ": sys.stderr.write(ln + '\\n')\n"
                "warnings.warn('`torch.distributed.reduce_op` is deprecated, please use x', FutureWarning)\n"
                "sys.stderr.write('a real problem\\n')"], check=True)
warnings.warn("a warning about our own code", UserWarning)
'''


HEAVY = ("terra_nb", "torch", "transformers")
"""What a kernel must not import while it starts (`terra_nb_kernel`'s docstring: ~9 s of CPU each)."""


def test_kernel_drops_noise_from_engine_processes(tmp_path, monkeypatch):
    """A child process (like the engine's) prints every noise line, a noise warning, a real line;
    the kernel's own code warns: only the two real ones reach the notebook. The kernel started
    without importing terra_nb, torch or transformers (its output stream is `terra_nb_kernel`'s)."""
    path = nbtools.write_notebook(tmp_path / "01_noise.ipynb", [
        ("md", "# t\nWhat you will learn: x"),
        ("params", 'device = "cpu"\npreset = "tiny"\nout_dir = None'),
        ("code", f"import sys\nprint(type(sys.stderr).__name__, [m for m in {HEAVY!r} if m in sys.modules])"),
        ("code", NOISY_CELL.format(lines=list(SAMPLES.values()))),
        ("md", "## Summary\n...\n## Pitfalls\n..."),
    ])
    (tmp_path / "out").mkdir()
    run = reproduce.run_notebook(path, tmp_path / "out", {"device": "cpu", "preset": "tiny", "out_dir": None})
    assert run.status == "ok", run.failure_line()
    started, cell = [c for c in nbformat.read(tmp_path / "out" / path.name, as_version=4).cells if c.cell_type == "code"][-2:]
    assert "".join(o.get("text", "") for o in started.outputs) == "QuietOutStream []\n", started.outputs
    err = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stderr")
    assert "a real problem" in err and "a warning about our own code" in err
    assert not any(s in err for s in ("Triton", "NUMA", "safetensors", "reduce_op")), err


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_has_no_stderr_or_warnings(path):
    problems = []
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else str(out.get("data", {}).get("text/plain", ""))
            if out.get("name") == "stderr":
                problems.append(f"cell #{i + 1}: stderr {text[:120]!r}")
            elif "Warning:" in text or "warnings.warn" in text:
                problems.append(f"cell #{i + 1}: a warning {text[:120]!r}")
    assert problems == [], "\n".join(problems)


def test_blank_chunks_after_dropped_noise_go_too():
    f = NoiseFilter()
    chunks = ["\r" + SAMPLES["weight-loading progress bar"], "\n", "\n", "real\n", "\n"]
    assert [f.feed(c) for c in chunks] == ["", "", "", "real\n", "\n"]
    assert NoiseFilter().feed("\n") == "\n"


def test_kernel_side_imports_no_torch():
    """What every kernel (the output stream) and every pytest process (the nbval plugin, xdist's
    controller included) imports stays light: no terra_nb, torch or transformers."""
    r = subprocess.run([sys.executable, "-c", "import sys, terra_nb_kernel, terra_nb_kernel.nbval\n"
                        f"print([m for m in {HEAVY!r} if m in sys.modules])"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "[]\n", r.stdout + r.stderr
