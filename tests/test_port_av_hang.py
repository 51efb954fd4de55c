"""What a `ValueError` raised inside the model did to an engine whose core runs in the process,
held to its record: `tools/inprocess_hang.py` reproduces it in a fresh interpreter with a time
limit (a good request twice, a `ValueError` raised in `embed_multimodal`, then the good request
again) and writes `results/inprocess_hang.json` per vLLM release. Re-running it here would cost the
whole wait where the engine hangs, so the tests read the records (PORTING.md, "Request checks",
and notebook 13 quote them) and the source line that explains the 0.32 hang."""
from __future__ import annotations

import inspect
import json

from terra_nb.workbook.paths import REPO

RECORDS = json.loads((REPO / "results" / "inprocess_hang.json").read_text())


def _common(record: dict, version: str) -> None:
    assert record["vllm"] == version and record["multiprocessing"] == "0"
    assert record["bad"] == "ValueError: the audio encoder takes at most 8 frames"
    assert record["unfinished_after_bad"] == 1  # the failed request is still the engine's
    assert len(record["good_before"]) == 4 and record.get("good_again", record["good_before"]) == record["good_before"]


def test_on_vllm_032_the_failed_request_stays_running_and_generate_never_returns():
    record = RECORDS["0.32.0"]
    _common(record, "0.32.0")
    [(request_id, status)] = record["scheduler_requests"].items()
    assert request_id.startswith(("1-", "2-")) and status == "RUNNING"  # the bad one (after 1 or 2 good ones)
    assert record["unfinished"] == 1 and record["returned"] is False
    assert record["good_after_s"] >= record["wait_s"] > 0


def test_on_vllm_026_the_next_request_returns_with_other_tokens():
    """Recorded on an H100 (vLLM 0.26 is not installed on the CPU machines): no hang, but the same
    greedy request gives other tokens after the error than twice before it."""
    record = RECORDS["0.26.0"]
    _common(record, "0.26.0")
    assert record["returned"] is True and record["unfinished"] == 0
    assert record["good_again"] == record["good_before"] != record["good_after"]


def test_llm_generate_returns_only_when_the_engine_has_no_unfinished_request():
    """Why, on 0.32, one orphaned request blocks every later `LLM.generate` in that process."""
    from vllm import LLM

    assert "while self.llm_engine.has_unfinished_requests():" in inspect.getsource(LLM._run_engine)
