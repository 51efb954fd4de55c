"""Rollouts spread over two engine cores by vLLM's data parallelism (`terra_nb.rollouts`), the toy model.

One `AsyncLLM` with two engine cores serves the module; HF is the reference (one engine equals it token
for token: tests/test_session_rollout.py), and pinning every rollout to one rank is one engine core in the
same set-up. The set-up checks start no engine. The last test kills a rank: keep it last.
"""
from __future__ import annotations

import os
import signal
import socket

import psutil
import pytest
import torch

from terra_nb.port.rollout import SamplingConfig, hf_rollout
from terra_nb.port.session_rollout import session_rollout_sync
from terra_nb.rollouts import LOST, check_local_room, dp_rollouts, make_dp_engine, shutdown_dp_engine
from terra_nb.rollouts import main as rollouts_main
from terra_nb.toyworld.score import load_toy_model, toy_checkpoint_dir

GREEDY = SamplingConfig(temperature=0)
SEEDED = SamplingConfig(temperature=1.0, seed=7)


def random_inputs(batch, n_ctx, n_frames, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, n_ctx, 64), generator=g), torch.randn(batch, n_ctx + n_frames - 1, 6, 3, generator=g)


@pytest.fixture(scope="module")
def engine():
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("two ranks need two GPUs")
    engine = make_dp_engine(toy_checkpoint_dir(), 2)
    yield engine
    shutdown_dp_engine(engine)


@pytest.fixture(scope="module")
def hf():
    return load_toy_model()


def hf_codes(hf, ctx, acts, n_frames):
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model on a shared 2-core machine
    try:
        return hf_rollout(hf, ctx, acts, n_frames, GREEDY, progress=False)
    finally:
        torch.set_num_threads(n)


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


@pytest.mark.engine
def test_greedy_rollouts_spread_over_both_ranks_and_equal_one_engine(engine, hf):
    ctx, acts = random_inputs(4, 3, 3, seed=0)
    run = dp_rollouts(engine, ctx, acts, 3, GREEDY, progress=False)  # first: the load balancer sees idle ranks
    assert run.sessions_per_rank() == {0: 2, 1: 2} and run.lost == {}
    assert torch.equal(run.frames, hf_codes(hf, ctx, acts, 3))
    one = dp_rollouts(engine, ctx, acts, 3, GREEDY, pin=0, progress=False)  # one engine core serves them all
    assert one.ranks == [[0]] * 4 and torch.equal(one.frames, run.frames)
    # two rounds (a full window of 25 frames, then a new session from the last 3): each round may change rank
    ctx, acts = random_inputs(2, 23, 3, seed=1)
    two = dp_rollouts(engine, ctx, acts, 3, GREEDY, progress=False)
    assert [len(r) for r in two.ranks] == [2, 2]
    assert torch.equal(two.frames, hf_codes(hf, ctx, acts, 3))


@pytest.mark.engine
def test_seeded_rollouts_equal_whichever_rank_serves_them(engine):
    ctx, acts = random_inputs(4, 3, 3, seed=2)
    runs = [dp_rollouts(engine, ctx, acts, 3, SEEDED, pin=pin, progress=False) for pin in (0, 1, None)]
    assert [r.ranks for r in runs[:2]] == [[[0]] * 4, [[1]] * 4]
    for r in runs[1:]:
        assert torch.equal(r.frames, runs[0].frames)
    assert torch.equal(session_rollout_sync(engine, ctx, acts, 3, SEEDED, progress=False), runs[0].frames)  # same seeds
    greedy = dp_rollouts(engine, ctx, acts, 3, GREEDY, progress=False)
    assert (runs[0].frames != greedy.frames).float().mean() > 0.5  # it did sample
    assert not torch.equal(runs[0].frames[0], runs[0].frames[1])    # and each rollout drew its own noise


@pytest.mark.engine
def test_bad_pins_are_refused(engine):
    ctx, acts = random_inputs(2, 3, 1, seed=3)
    for pin in (2, -1, True, [0], [0, 0, 0], "0"):
        with pytest.raises(ValueError, match="pin must be"):
            dp_rollouts(engine, ctx, acts, 1, GREEDY, pin=pin, progress=False)


@pytest.mark.engine
def test_a_killed_rank_loses_its_rollouts_and_the_rest_come_back(engine, hf):
    """Last in the module: the engine does not survive it. Rollout 0 on rank 0, the others on rank 1,
    two at a time; rank 1's process is killed as the first rollout finishes, so at least three
    rollouts never finish, whichever rank is faster."""
    ctx, acts = random_inputs(6, 3, 3, seed=4)
    core = next(p for p in engine.engine_core.resources.engine_manager.processes if p.name.endswith("_DP1"))

    def kill_rank_1(b, frames):
        if core.is_alive():
            os.kill(core.pid, signal.SIGKILL)

    run = dp_rollouts(engine, ctx, acts, 3, GREEDY, pin=[0] + [1] * 5, max_in_flight=2, on_rollout=kill_rank_1,
                      progress=False)
    assert run.done and len(run.lost) >= 3 and sorted(run.done + list(run.lost)) == list(range(6))
    assert torch.equal(run.frames[run.done], hf_codes(hf, ctx[run.done], acts[run.done], 3))
    for b, why in run.lost.items():
        assert "EngineCore_DP1 died" in why and (f"on rank {run.ranks[b][-1]}" if run.ranks[b]
                                                 else "before its first frame") in why
        assert (run.frames[b] == LOST).all()
    with pytest.raises(RuntimeError, match="engine group is dead"):
        dp_rollouts(engine, ctx, acts, 3, GREEDY, progress=False)
