"""terra_nb.workbook.timing_traps: notebook 07's traps 1-2 timed on a real tiny checkpoint."""
from __future__ import annotations

import pytest

from terra_nb.workbook.timing_traps import hf_timing_traps


@pytest.mark.usefixtures("single_thread")
def test_hf_timing_traps_times_three_ways(tiny_ckpt):
    t = hf_timing_traps(tiny_ckpt, "tiny", repeats=1)   # each call asserts it generated exactly one frame
    assert set(t) == {"first_call_s", "later_call_s", "min_new_tokens_s"}
    assert all(0 < s < 120 for s in t.values()), t
