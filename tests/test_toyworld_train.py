"""The toy model's training script (`python -m terra_nb.toyworld.train`), run small: a few clips
of 10 frames, a few steps. It must be seeded (two runs, one through the CLI, write byte-identical weights), it must
learn (the loss falls well below a uniform guess), and what it writes must be a released-style
checkpoint that HF loads with every weight used, with the training record beside it.

Measured here (2-core AVX2 EPYC, 1 thread): both runs together take about 12 s; the loss falls
from 6.26 (ln 513 = 6.24) to 4.86 within 30 steps. (Clips of 25 frames, the default, took 35 s for
the same claims: 25-frame clips train every temporal slot of a round, which no check here needs.) The shipped checkpoint's full run is recorded
in data/toy/model/toy_training.json (device and times); its settings were chosen by the runs in
data/toy/sweep.json.
"""
from __future__ import annotations

import json
import math
import os

import pytest

from terra_nb.workbook.checkpoints import preset_config_dict
from terra_nb.toyworld import training_record
from terra_nb.toyworld.train import DEFAULTS, main, train

SMALL = dict(n_clips=6, n_frames=10, steps=30, batch=2, warmup=4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, single_thread):
    """Two small training runs, one through `train`, one through the CLI; the dataset cache
    (`outputs/toy/`, relative to the working directory) goes to a temporary folder."""
    root = tmp_path_factory.mktemp("train")
    old = os.getcwd()
    os.chdir(root)
    try:
        _, record = train(out_dir=root / "a", log=lambda _: None, device="cpu", **SMALL)
        main(["--out", str(root / "b"), "--device", "cpu"] + [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()])
    finally:
        os.chdir(old)
    return root, record


def test_training_is_seeded(runs):
    root, _ = runs
    a, b = ((root / x / "model.safetensors").read_bytes() for x in "ab")
    assert a == b, "two seeded runs on the same machine wrote different weights"


def test_training_learns(runs):
    _, record = runs
    losses = record["losses"]                                # one value every 10 steps
    assert len(losses) == math.ceil(SMALL["steps"] / 10)
    assert abs(losses[0] - math.log(513)) < 0.5, losses      # starts near a uniform guess
    assert losses[-1] < losses[0] - 1.0, losses


def test_training_writes_a_released_style_checkpoint(runs):
    from transformers import AutoModelForCausalLM

    root, record = runs
    out = root / "a"
    assert json.loads((out / "config.json").read_text()) == preset_config_dict("tiny")
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    stored = training_record(out)                            # what notebook 08 reads
    assert stored["settings"] == {**DEFAULTS, **SMALL}
    assert stored["losses"] == record["losses"]
    assert stored["threads"] >= 1 and stored["cpu_capability"] and stored["cpu"]
    assert stored["device"] == "cpu"                         # where it ran, beside the loss curve


def test_unknown_setting_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"unknown training setting\(s\) \['stpes'\]"):
        train(out_dir=tmp_path / "x", stpes=10)
    assert not (tmp_path / "x").exists()
