"""tools/mutants.py (the mutation check, run by hand: slow) still applies: every mutant's anchor
occurs exactly once in the source, and applying it changes the file."""
from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest

from terra_nb.workbook.paths import REPO

spec = importlib.util.spec_from_file_location("mutants", REPO / "tools" / "mutants.py")
mutants = sys.modules["mutants"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(mutants)


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_still_applies(mutant, tmp_path):
    for site in mutant.sites:
        if (REPO / site.path).is_file():
            (tmp_path / site.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / site.path, tmp_path / site.path)
    site = mutants.apply(mutant, tmp_path)
    assert (tmp_path / site.path).read_text() != (REPO / site.path).read_text()
    assert all((REPO / t.split("::")[0]).is_file() for t in mutant.tests)   # a file, or one test of it


def test_a_missing_anchor_fails_loudly(tmp_path):
    m = mutants.MUTANTS[0]
    for site in m.sites:
        (tmp_path / site.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / site.path).write_text("nothing to mutate here\n")
    with pytest.raises(ValueError, match="anchor found .*0 times"):
        mutants.apply(m, tmp_path)
