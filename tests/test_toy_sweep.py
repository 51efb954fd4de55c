"""tools/toy_sweep.py, the training-settings sweep behind docs/toy-world.md's table: its run
specifications parse like the trainer's defaults. (The sweep itself trains models for minutes: its
runs are recorded in results/, with their commands.)"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import toy_sweep  # noqa: E402



def test_parse_run_types_settings_like_train_defaults():
    assert toy_sweep.parse_run("a b:steps=12,lr=1e-3,init=random") == ("a b", {"steps": 12, "lr": 1e-3, "init": "random"})
    with pytest.raises(SystemExit):
        toy_sweep.parse_run("x:stepz=3")
