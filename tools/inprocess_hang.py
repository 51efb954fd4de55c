"""Reproduce, with a time limit, what a `ValueError` raised *inside the model* does to an engine
whose core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), and record it.

    python tools/inprocess_hang.py            # -> results/inprocess_hang.json, under the installed vLLM's version

A TinyAV engine in a fresh interpreter whose `embed_multimodal` raises a `ValueError` for a clip
longer than 8 frames (a value check placed in the model, where it must not be): one good request
twice (the control: the same greedy tokens), the too-long clip, then the good request again, waited
for `--wait` seconds in a thread; the
interpreter is killed after `--kill-after` seconds whatever happens. Not a test: when the engine
hangs, the run costs the whole wait, so `make test` reads the record instead
(tests/test_port_av_hang.py) and notebook 13 shows it. Records are kept per vLLM version.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RECORD = REPO / "results" / "inprocess_hang.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the good request after the bad one")
    ap.add_argument("--kill-after", type=float, default=300.0)
    args = ap.parse_args(argv)

    import vllm

    from terra_nb.lessons.port_av import reproduce_hang
    from terra_nb.port_av.checkpoints import write_random_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_random_checkpoint(Path(tmp) / "tiny_av")
        result = reproduce_hang(ckpt, wait_s=args.wait, kill_after_s=args.kill_after)
    result["recorded"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    import os

    import torch

    where = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {os.cpu_count()} cores"
    result["device"] = f"{where} (vLLM {vllm.__version__}), engine core in process"
    records = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    records[vllm.__version__] = result
    RECORD.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
