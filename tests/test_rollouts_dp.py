"""Rollouts spread over engine cores by vLLM's data parallelism (`terra_nb.rollouts`): what is refused
before any engine starts. A live two-rank engine runs in notebook 15 (greedy equals HF over the ranks,
seeded codes the same on every rank, a killed rank's rollouts named), in tests/test_serve_dp.py (the
server) and tests/test_rollouts_ray.py (a Ray cluster)."""
from __future__ import annotations

import socket

import psutil
import pytest
import torch

from terra_nb.rollouts import _pins, check_local_room, make_dp_engine
from terra_nb.rollouts import main as rollouts_main
from terra_nb.toyworld.score import toy_checkpoint_dir


def test_bad_setups_are_refused_before_any_engine_starts():
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    for size, why in [(0, "whole number >= 1, got 0"), (1.5, "got 1.5"), (True, "got True"),
                      (10**4, "GiB of memory is free|GPUs; this host has")]:
        with pytest.raises(ValueError, match=why):
            make_dp_engine(toy_checkpoint_dir(), size)
    with pytest.raises(ValueError, match="tensor_parallel_size must be a whole number"):
        make_dp_engine(toy_checkpoint_dir(), 2, tensor_parallel_size=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # a port that nothing listens on
        with pytest.raises(ValueError, match="no Ray cluster reachable at 127.0.0.1"):
            make_dp_engine(toy_checkpoint_dir(), 2, ray_address=f"127.0.0.1:{s.getsockname()[1]}")
    with pytest.raises(ValueError, match="ray_address must be HOST:PORT"):
        make_dp_engine(toy_checkpoint_dir(), 2, ray_address="head-node")
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children


@pytest.mark.parametrize("argv, why", [(["--rollouts", "0"], "--rollouts must be >= 1"),
                                       (["--max-in-flight", "0"], "--max-in-flight must be >= 1"),
                                       (["--frames", "46"], "actions"), (["--temperature", "-1"], "temperature"),
                                       (["-n", "0"], "data_parallel_size must be a whole number >= 1, got 0"),
                                       (["--result", "r.json"], "give --trials N too"),
                                       (["--trials", "-1"], "--trials must be >= 0"),
                                       (["--one-rank-engine"], "--one-rank-engine goes with --trials")])
def test_the_command_refuses_bad_arguments_before_any_engine_starts(argv, why, capsys):
    with pytest.raises(SystemExit) as exit_:
        rollouts_main(argv)
    assert exit_.value.code == 2 and why in capsys.readouterr().err


def test_more_ranks_than_gpus_are_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_local_room(2, 1, 0)
    with pytest.raises(ValueError, match="3 ranks x 1 GPUs each need 3 GPUs; this host has 2"):
        check_local_room(3, 1, 0)
    with pytest.raises(ValueError, match="2 ranks x 2 GPUs each need 4 GPUs"):
        check_local_room(2, 2, 0)


def test_bad_pins_are_refused():
    for pin in (2, -1, True, [0], [0, 0, 0], "0"):
        with pytest.raises(ValueError, match="pin must be"):
            _pins(pin, 2, 2)
    assert _pins(None, 2, 2) == [None, None] and _pins(1, 2, 2) == [1, 1] and _pins([0, 1], 2, 2) == [0, 1]
