"""The in-process hang PORTING.md ("Request checks") and notebook 13 describe, held to its record:
`tools/inprocess_hang.py` reproduces it in a fresh interpreter with a time limit (a `ValueError`
raised in `embed_multimodal`, then a good request) and writes `results/inprocess_hang.json` per
vLLM release. Re-running it here would cost the whole wait, the engine hanging, so this test reads
the record of the installed release (a release without one is skipped, naming the command that
makes one) and the source line that explains it."""
from __future__ import annotations

import inspect
import json

import pytest

from terra_nb.workbook.paths import REPO

RECORD = REPO / "results" / "inprocess_hang.json"


def test_the_recorded_in_process_run_left_the_failed_request_unfinished_and_generate_waiting():
    import vllm

    records = json.loads(RECORD.read_text())
    record = records.get(vllm.__version__)
    if record is None:
        pytest.skip(f"no record for vLLM {vllm.__version__}: run `python tools/inprocess_hang.py` "
                    f"(recorded: {sorted(records)})")
    assert record["vllm"] == vllm.__version__ and record["multiprocessing"] == "0"
    assert len(record["good_before"]) == 4  # the engine served before the bad request
    assert record["bad"] == "ValueError: the audio encoder takes at most 8 frames"
    # request 0 good, 1 bad, 2 good: only the bad one is left, still running, and generate waits on it
    assert record["unfinished_after_bad"] == 1 and record["unfinished"] == 1
    [(request_id, status)] = record["scheduler_requests"].items()
    assert request_id.startswith("1-") and status == "RUNNING"
    assert record["returned"] is False and record["good_after_s"] >= record["wait_s"] > 0


def test_llm_generate_returns_only_when_the_engine_has_no_unfinished_request():
    """Why one orphaned request blocks every later `LLM.generate` in that process."""
    from vllm import LLM

    assert "while self.llm_engine.has_unfinished_requests():" in inspect.getsource(LLM._run_engine)
