"""The port copies: `terra_nb/port/` moved into another project, under another name, works alone.

The folder is copied to a temporary package `terra_port_copy`, declared as a vLLM general plugin
the way an installed project would (a `*.dist-info/entry_points.txt` on the path), and a fresh
interpreter, with `VLLM_PLUGINS` naming only the copy and a `terra_nb` that cannot be imported
first on `PYTHONPATH` (the engine's own processes inherit both), registers the copy, builds the
HF model through `AutoModelForCausalLM` and a vLLM engine from the copy alone, and rolls out one
greedy frame on each. The two must agree token by token.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import terra_nb.port

COPY = "terra_port_copy"

_SCRIPT = rf"""
import json, sys
import torch
import {COPY}
from {COPY}.vllm_plugin import register
register()
from transformers import AutoModelForCausalLM
from {COPY}.rollout import SamplingConfig, hf_rollout
from {COPY}.vllm_compat import shutdown_llm
from {COPY}.vllm_rollout import make_llm, vllm_rollout

hf = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
g = torch.Generator().manual_seed(3)
lay = hf.layout
ctx = torch.randint(0, lay.num_codes, (2, lay.image_tokens), generator=g)
acts = torch.randn(2, lay.action_tokens, lay.action_dim, generator=g)
greedy = SamplingConfig(temperature=0.0)
hf_codes = hf_rollout(hf, ctx, acts, 1, greedy, progress=False)
llm = make_llm(sys.argv[1], max_frames=3, enforce_eager=True)
vllm_codes = vllm_rollout(llm, ctx, acts, 1, greedy, progress=False)
shutdown_llm(llm)
print("PROBE" + json.dumps({{
    "hf": hf_codes.tolist(), "vllm": vllm_codes.tolist(), "hf_class": type(hf).__module__,
    "terra_nb_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "terra_nb"),
}}))
"""


def _make_copy(root: Path) -> None:
    """`root/terra_port_copy/` (the port's .py files), its plugin entry point, and a `terra_nb`
    that refuses to import (so any leftover `import terra_nb` fails loudly)."""
    shutil.copytree(Path(terra_nb.port.__file__).parent, root / COPY, ignore=shutil.ignore_patterns("__pycache__"))
    dist = root / f"{COPY}-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {COPY}\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{COPY} = {COPY}.vllm_plugin:register\n")
    (root / "terra_nb").mkdir()
    (root / "terra_nb" / "__init__.py").write_text('raise ImportError("the copied port imported terra_nb")\n')


def test_a_copy_of_the_port_under_another_name_serves_alone_with_hf_parity(tiny_ckpt, tmp_path):
    _make_copy(tmp_path)
    # the copy first; whatever PYTHONPATH already holds (the GPU runner's vLLM lives there) after it
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "VLLM_PLUGINS": COPY}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tiny_ckpt)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=500)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(line[len("PROBE"):])
    assert out["hf_class"] == f"{COPY}.hf_model" and out["terra_nb_loaded"] == []
    hf, vl = out["hf"][0], out["vllm"][0]
    assert len(hf) == len(vl) == 64  # one frame of the tiny preset's 64 codes
    first_diff = next((i for i, (a, b) in enumerate(zip(hf, vl)) if a != b), None)
    assert first_diff is None, f"HF and vLLM differ first at code {first_diff}: {hf[first_diff]} vs {vl[first_diff]}"
