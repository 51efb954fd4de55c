"""A load test of the world-model server: many WebSocket sessions at once against one server.

    python -m terra_nb.serve.load                                   # 64 sessions, the toy model, on this machine
    python -m terra_nb.serve.load --sessions 256 --frames 6 --out results/serve/gpu.json   # on a GPU
    python -m terra_nb.serve.load --url http://127.0.0.1:8000       # a server already running (`make serve`)

Every run opens all its sessions at once (`asyncio`, the copyable `AsyncClient` and raw `websockets`).
First one **mixed** run, which also warms the engine up:

* **good** clients start on one of a few contexts (`contexts`) and drive `frames` frames greedily,
  the policy in the client (`steer`: the next actions depend on the frame just received);
* **drop** clients start, take some frames, send a step and close the socket while that frame is
  being made (`drop_client`);
* **bad** clients send a bad message (`BAD_INPUTS`, in turn: malformed JSON, NaN actions, codes out
  of range, actions of the wrong shape) and must get the error naming its rule; those whose bad
  message is a step then step again and must be served (`bad_client`).

Then `trials` timed runs each way with every session good, alternated (S I, I S, S I, ...): the
server's, and in-process `session_rollout` of the same rollouts on the same engine, all at once
(open loop on the actions the clients sent: independent clients are an open loop, each sends its
next step when its own frame is out): the same concurrency and work.

Checks (`checks`): every good session's codes equal the in-process rollout of the same context and
actions token for token (greedy); no client waits past `timeout` (nothing hangs); after every run
the engine core's free KV blocks are back at their count before the load (nothing leaks); every
bad input got its rule. Speed (`summarize`): frames/s of the timed runs both ways, medians and
their ratio (the target: within 10%, ratio >= 0.9: what serving over a network may cost), latency
per frame as the clients saw it.

In-process server (`ServerThread`, the default): the reference runs on the server's own engine, on
its loop. With `--url`: the reference gets an engine of its own, built here with the same engine
arguments (pass the server's `--engine-arg`s again); the KV blocks are read from `/health`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from .toy import arc_actions

__all__ = ["BAD_INPUTS", "LoadPlan", "checks", "contexts", "in_process_trial", "main", "roles", "run_load",
           "load_results", "plot_load", "provenance_row", "result_row",
           "server_target", "server_trial", "steer", "summarize"]

GREEDY = {"temperature": 0}
BAD_INPUTS = ("malformed_json", "actions_not_finite", "code_out_of_range", "wrong_action_shape")
"""What the bad clients send, in turn; each name is the rule the server must answer with."""
BAD_STEPS = ("actions_not_finite", "wrong_action_shape")
"""Bad inputs sent as a step of a started session: the session must serve the next good step."""


@dataclass
class LoadPlan:
    """One load: `sessions` clients at once, of which `drops` drop mid-session and `bad` send bad
    input; the rest are good and drive `frames` frames each from one of `n_contexts` contexts."""

    sessions: int = 64
    frames: int = 3
    drops: int = 4
    bad: int = 4
    n_contexts: int = 4
    n_ctx: int = 3
    trials: int = 3
    timeout: float = 120.0
    seed: int = 39

    def __post_init__(self):
        if self.sessions < self.n_contexts:
            raise ValueError(f"{self.sessions} sessions cannot use {self.n_contexts} contexts")
        if self.drops + self.bad >= self.sessions:
            raise ValueError(f"{self.drops} drops + {self.bad} bad leave no good session of {self.sessions}")
        if self.frames < 2:
            raise ValueError("frames >= 2: a drop leaves while a step's frame is being made")
        if self.trials < 1:
            raise ValueError("trials >= 1")


def roles(plan: LoadPlan) -> list[str]:
    """Each client's role ("good", "drop", "bad"), the drops and bad ones spread over the list."""
    out = ["good"] * plan.sessions
    special = ["drop"] * plan.drops + ["bad"] * plan.bad
    stride = plan.sessions / max(1, len(special))
    for k, role in enumerate(special[::2] + special[1::2]):  # drops and bad ones interleaved
        out[int(k * stride)] = role
    return out


def contexts(layout, plan: LoadPlan) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n_contexts` starts (codes `[n_ctx, P]`, actions `[n_ctx, 6, 3]`): random codes of the
    model's codebook, each driven along its own arc (seeded: the same every run)."""
    g = torch.Generator().manual_seed(plan.seed)
    out = []
    for k in range(plan.n_contexts):
        codes = torch.randint(0, layout.num_codes, (plan.n_ctx, layout.image_tokens), generator=g)
        actions = torch.from_numpy(np.stack([arc_actions(6.0 + k, 0.02 * (k % 3 - 1))] * plan.n_ctx))
        out.append((codes, actions))
    return out


def steer(codes) -> np.ndarray:
    """The clients' policy: left after a frame whose codes sum to an odd number, right otherwise."""
    return arc_actions(8.0, 0.05 if int(np.sum(codes)) % 2 else -0.05)


# ---------------------------------------------------------------------------- the clients
async def good_client(client, ctx, ctx_actions, frames: int) -> dict:
    """Drive one session: its codes `[frames][P]`, the actions it sent, each frame's latency (ms, as
    the client saw it: from sending the message to the frame's arrival)."""
    sent, ms = [], []
    began = time.perf_counter()
    async with client.session(ctx, ctx_actions, sampling=GREEDY) as s:
        codes = [s.first["codes"]]
        ms.append((time.perf_counter() - began) * 1e3)
        for _ in range(frames - 1):
            actions = steer(codes[-1])
            sent.append(actions)
            t = time.perf_counter()
            codes.append((await s.step(actions))["codes"])
            ms.append((time.perf_counter() - t) * 1e3)
    return {"role": "good", "codes": codes, "actions": sent, "ms": ms, "done": time.perf_counter()}


def _start_message(ctx, ctx_actions) -> str:
    return json.dumps({"type": "start", "context": ctx.tolist(), "actions": ctx_actions.tolist(), "sampling": GREEDY})


async def _recv(ws, timeout: float) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def drop_client(ws_url: str, ctx, ctx_actions, after: int, timeout: float) -> dict:
    """Start, take `after` frames, send the next step and close at once: the client leaves while
    that frame is being made."""
    from websockets.asyncio.client import connect

    ws = await connect(ws_url, open_timeout=timeout, max_size=None)
    try:
        await ws.send(_start_message(ctx, ctx_actions))
        got = [await _recv(ws, timeout)]
        for _ in range(after - 1):
            await ws.send(json.dumps({"type": "step", "actions": steer(got[-1]["codes"]).tolist()}))
            got.append(await _recv(ws, timeout))
        await ws.send(json.dumps({"type": "step", "actions": steer(got[-1]["codes"]).tolist()}))
    finally:
        await ws.close()
    return {"role": "drop", "frames_before_drop": len(got), "ok": all(m["type"] == "frame" for m in got)}


async def bad_client(ws_url: str, kind: str, ctx, ctx_actions, num_codes: int, timeout: float) -> dict:
    """Send the bad input `kind` (a key of `BAD_INPUTS`); the answer must name that rule. A bad
    step comes after a good start, and a good step after it must still get its frame."""
    from websockets.asyncio.client import connect

    start = _start_message(ctx, ctx_actions)
    async with connect(ws_url, open_timeout=timeout, max_size=None) as ws:
        if kind in BAD_STEPS:
            await ws.send(start)
            first = await _recv(ws, timeout)
            bad = [[float("nan"), 0.0, 0.0]] * 6 if kind == "actions_not_finite" else steer(first["codes"]).tolist()[:5]
            await ws.send(json.dumps({"type": "step", "actions": bad}))
        elif kind == "malformed_json":
            await ws.send(start[: len(start) // 2])
        else:  # code_out_of_range: one code past the codebook
            bad_ctx = ctx.clone()
            bad_ctx[0, 0] = num_codes + 7
            await ws.send(_start_message(bad_ctx, ctx_actions))
        answer = await _recv(ws, timeout)
        served_on = None
        if kind in BAD_STEPS:
            await ws.send(json.dumps({"type": "step", "actions": steer(first["codes"]).tolist()}))
            served_on = (await _recv(ws, timeout)).get("index") == 1
        await ws.send(json.dumps({"type": "end"}))
        await _recv(ws, timeout)
    return {"role": "bad", "kind": kind, "rule": answer.get("rule"), "refused": answer.get("rule") == kind,
            "served_on": served_on}


async def _timed(coro, timeout: float) -> dict:
    """A client's result, or {"hung": True} when it takes longer than `timeout` s in all, or its error."""
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        return {"hung": True}
    except Exception as e:  # noqa: BLE001 - reported, counted as a failure by `checks`
        return {"error": f"{type(e).__name__}: {e}"}


# ---------------------------------------------------------------------------- one trial each way
async def server_trial(url: str, plan: LoadPlan, starts, num_codes: int) -> dict:
    """Every client at once against the server at `url`; returns each client's result (in `roles`
    order), the wall time until the last good session's last frame, and frames/s of the good ones."""
    from .client import AsyncClient

    ws_url = "ws" + url[len("http"):] + "/v1/sessions"  # http(s)://host:port -> ws(s)://host:port/v1/sessions
    kinds = roles(plan)
    budget = plan.timeout * (plan.frames + 2)  # a client's whole run
    async with AsyncClient(url, timeout=plan.timeout) as client:
        jobs = []
        for i, role in enumerate(kinds):
            ctx, ctx_actions = starts[i % len(starts)]
            if role == "good":
                jobs.append(good_client(client, ctx, ctx_actions, plan.frames))
            elif role == "drop":
                jobs.append(drop_client(ws_url, ctx, ctx_actions, 1 + i % (plan.frames - 1), plan.timeout))
            else:
                kind = BAD_INPUTS[kinds[:i].count("bad") % len(BAD_INPUTS)]
                jobs.append(bad_client(ws_url, kind, ctx, ctx_actions, num_codes, plan.timeout))
        began = time.perf_counter()
        results = await asyncio.gather(*(_timed(job, budget) for job in jobs))
    ends = [r["done"] for r in results if r.get("role") == "good"]
    wall = (max(ends) if ends else time.perf_counter()) - began
    frames = sum(len(r["codes"]) for r in results if r.get("role") == "good")
    return {"clients": results, "seconds": wall, "frames": frames, "frames_per_s": frames / wall}


async def in_process_trial(engine, context: torch.Tensor, actions: torch.Tensor, frames: int) -> dict:
    """`session_rollout` of the good sessions' rollouts at once (open loop on the actions their
    clients sent) on `engine`, on the loop it serves: codes `[B, frames, P]`, seconds, frames/s."""
    from ..port.rollout import SamplingConfig
    from ..port.session_rollout import session_rollout

    began, cpu = time.perf_counter(), time.thread_time()
    codes = await session_rollout(engine, context, actions, frames, SamplingConfig(temperature=0), progress=False)
    wall = time.perf_counter() - began
    return {"codes": codes, "seconds": wall, "frames": codes.shape[0] * codes.shape[1],
            "frames_per_s": codes.shape[0] * codes.shape[1] / wall, "loop_cpu_s": time.thread_time() - cpu}


def reference_inputs(plan: LoadPlan, starts, trial: dict) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The good sessions of a server trial as one batch: contexts `[B, n_ctx, P]`, actions
    `[B, n_ctx + frames - 1, 6, 3]` (the context's and those the client sent), their client indices."""
    idx = [i for i, r in enumerate(trial["clients"]) if r.get("role") == "good"]
    if not idx:
        raise RuntimeError("no good session completed: nothing to compare in-process")
    ctx = torch.stack([starts[i % len(starts)][0] for i in idx])
    acts = torch.stack([torch.cat([starts[i % len(starts)][1], torch.from_numpy(np.stack(trial["clients"][i]["actions"]))])
                        for i in idx])
    return ctx, acts, idx


# ---------------------------------------------------------------------------- the load
@dataclass
class Target:
    """Where the load goes: the server's URL, how to read its engine core's KV blocks, and how to
    run a coroutine on the loop of the engine that makes the in-process reference."""

    url: str
    kv_blocks: object      # () -> {"free", "total"}
    run_reference: object  # (coroutine factory engine -> coro) -> result
    layout: object
    engine: object = None
    loop_cpu: object = None  # () -> CPU seconds of the server's event-loop thread so far (None: unknown)


def run_async(coro):
    """`server.run(coro)` (uvloop where installed), also from a thread whose loop is running (a
    notebook's cell): then in a thread of its own."""
    from .server import run

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run, coro).result()


def _server_run(target: Target, plan: LoadPlan, starts) -> dict:
    """One server trial, with the CPU time its event loop spent on it (where the target can say)."""
    cpu = target.loop_cpu() if target.loop_cpu else None
    run = run_async(server_trial(target.url, plan, starts, target.layout.num_codes))
    if cpu is not None:
        run["loop_cpu_s"] = target.loop_cpu() - cpu
    return run


def wait_free(kv_blocks, count: int, timeout: float = 30.0) -> int:
    """Poll the free KV blocks until they are `count` again (or `timeout` s): the last reading."""
    deadline = time.monotonic() + timeout
    while (free := kv_blocks()["free"]) != count and time.monotonic() < deadline:
        time.sleep(0.1)
    return free


def run_load(target: Target, plan: LoadPlan, log=print) -> dict:
    """One mixed trial (every role at once: drops and bad input among the good sessions; it also
    warms the engine up), then `trials` timed trials each way with every session good, alternated
    (S I, I S, S I, ...). Returns every run (each with the free KV blocks read after it)."""
    starts = contexts(target.layout, plan)
    blocks = target.kv_blocks()
    if blocks is None:
        raise RuntimeError("the engine core reports no KV blocks (the plugin's terra_kv_blocks utility is not "
                           "installed there): the leak check needs them")
    free_at_start = blocks["free"]

    def settle(run: dict, what: str) -> dict:
        run["free_after"] = wait_free(target.kv_blocks, free_at_start)
        log(f"{what}: {run['frames']} frames in {run['seconds']:.2f} s ({run['frames_per_s']:.1f} frames/s); "
            f"free KV blocks {run['free_after']} (start {free_at_start})")
        return run

    mixed = settle(_server_run(target, plan, starts),
                   f"mixed: {plan.sessions} sessions, {plan.drops} drops, {plan.bad} bad, server")
    timed = replace(plan, drops=0, bad=0)
    server_runs, inproc_runs = [], []
    for t in range(plan.trials):  # the first server run gives the clients' actions to the in-process runs
        for side in ("server", "in-process") if t % 2 == 0 else ("in-process", "server"):
            if side == "server":
                run = _server_run(target, timed, starts)
                server_runs.append(run)
            else:
                ctx, acts, _ = reference_inputs(timed, starts, server_runs[0])
                run = target.run_reference(lambda engine: in_process_trial(engine, ctx, acts, plan.frames))
                inproc_runs.append(run)
            settle(run, f"trial {t}: {plan.sessions} sessions, {side}")
    return {"plan": plan, "starts": starts, "mixed": mixed, "server": server_runs, "in_process": inproc_runs,
            "reference": inproc_runs[0]["codes"], "kv_blocks_at_start": blocks}


def checks(load: dict) -> dict:
    """The load test's verdicts (each True when it holds), with what each found. The reference of
    a timed server run's session i is in-process rollout i; of the mixed run's good session i,
    in-process rollout i % n_contexts (the same context, policy and greedy sampling)."""
    plan, ref = load["plan"], load["reference"]
    runs = [load["mixed"], *load["server"]]
    mismatched = compared = hung = 0
    errors, refusals, served_on = [], [], []
    for run in runs:
        for i, r in enumerate(run["clients"]):
            hung += bool(r.get("hung"))
            if "error" in r:
                errors.append(r["error"])
            if r.get("role") == "good":
                compared += 1
                j = i if run is not load["mixed"] else i % len(load["starts"])
                mismatched += not torch.equal(torch.tensor(r["codes"]), ref[j])
            elif r.get("role") == "bad":
                refusals.append(r["refused"])
                if r["served_on"] is not None:
                    served_on.append(r["served_on"])
            elif r.get("role") == "drop" and not r["ok"]:
                errors.append("a dropping client got an error before it left")
    expected = (plan.sessions - plan.drops - plan.bad) + plan.sessions * len(load["server"])
    leaks = [load["kv_blocks_at_start"]["free"] - run["free_after"] for run in runs + load["in_process"]]
    same_in_process = all(torch.equal(run["codes"], ref) for run in load["in_process"])
    return {
        "greedy_parity": {"ok": mismatched == 0 and compared == expected and same_in_process,
                          "mismatched_sessions": mismatched, "compared_sessions": compared,
                          "in_process_trials_equal": same_in_process},
        "no_hang": {"ok": hung == 0, "hung_clients": hung, "timeout_s": plan.timeout},
        "no_client_errors": {"ok": not errors, "errors": errors[:10]},
        "bad_inputs_refused_by_rule": {"ok": len(refusals) == plan.bad and all(refusals) and all(served_on),
                                       "refused": sum(refusals), "bad_clients": len(refusals),
                                       "served_on_after_a_bad_step": sum(served_on), "bad_steps": len(served_on)},
        "no_kv_leak": {"ok": not any(leaks), "leaked_blocks_per_run": leaks},
    }


def summarize(load: dict) -> dict:
    """Frames/s both ways (medians of the timed trials), their ratio; the mixed run's frames/s
    (good sessions' frames only); per-frame latency of the good sessions of the timed server runs."""
    server = [r["frames_per_s"] for r in load["server"]]
    inproc = [r["frames_per_s"] for r in load["in_process"]]
    good = [r for run in load["server"] for r in run["clients"] if r.get("role") == "good"]
    ms, first = [m for r in good for m in r["ms"][1:]], [r["ms"][0] for r in good]
    ratio = statistics.median(server) / statistics.median(inproc)
    return {"server": {"median": statistics.median(server), "trials": server,
                       "seconds": [r["seconds"] for r in load["server"]], **_loop_cpu(load["server"])},
            "in_process": {"median": statistics.median(inproc), "trials": inproc,
                           "seconds": [r["seconds"] for r in load["in_process"]], **_loop_cpu(load["in_process"])},
            "ratio": ratio, "within_10pct": ratio >= 0.9,
            "mixed_run": {"frames_per_s": load["mixed"]["frames_per_s"], "seconds": load["mixed"]["seconds"],
                          "good_frames": load["mixed"]["frames"]},
            "latency_ms": {"step_median": _q(ms, 0.5), "step_p90": _q(ms, 0.9),
                           "first_frame_median": _q(first, 0.5), "first_frame_p90": _q(first, 0.9), "steps": len(ms)}}


def _loop_cpu(runs: list[dict]) -> dict:
    """The event loop's CPU time a frame (ms) and its busy share (CPU / wall), medians over the
    trials: a loop busy near 1.0 is what limits frames/s. Empty where the trials lack it."""
    if not runs or any("loop_cpu_s" not in r for r in runs):
        return {}
    return {"loop_cpu_ms_per_frame": statistics.median(1e3 * r["loop_cpu_s"] / r["frames"] for r in runs),
            "loop_busy": statistics.median(r["loop_cpu_s"] / r["seconds"] for r in runs)}


def _q(values, q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


# ---------------------------------------------------------------------------- reading and showing
def plot_load(load: dict, save=None):
    """Two panels: each good session's latency per frame (the timed server runs; frame 0 includes
    the context's prefill) and frames/s per trial, server against in-process."""
    import matplotlib.pyplot as plt

    good = [r for run in load["server"] for r in run["clients"] if r.get("role") == "good"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    ms = np.array([r["ms"] for r in good])
    for k in range(ms.shape[1]):
        a.scatter(np.full(len(ms), k) + np.linspace(-0.2, 0.2, len(ms)), ms[:, k], s=6, alpha=0.5)
    a.plot(range(ms.shape[1]), np.median(ms, 0), "k_-", ms=20, label="median")
    a.set(xlabel="frame of the session (0: after the start)", ylabel="ms, as the client saw it",
          title=f"latency per frame ({len(good)} sessions, {len(load['server'])} timed runs)", xticks=range(ms.shape[1]))
    a.legend()
    trials = np.arange(len(load["server"]))
    b.bar(trials - 0.2, [r["frames_per_s"] for r in load["server"]], 0.4, label="server (WebSocket)")
    b.bar(trials + 0.2, [r["frames_per_s"] for r in load["in_process"]], 0.4, label="in-process session_rollout")
    b.set(xlabel="trial", ylabel="frames/s (all sessions)", title=f"{load['plan'].sessions} sessions at once",
          xticks=trials)
    b.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)
    fig.tight_layout()
    if save:
        fig.savefig(save, dpi=110, bbox_inches="tight")
    return fig


def load_results(folder=None, earlier: bool = False) -> dict[str, dict]:
    """{file name: contents} of the committed load-test results (`results/serve/*.json`); with
    `earlier`, also the results they superseded (`results/serve/earlier/`, named `earlier/<file>`)."""
    from ..workbook.paths import REPO

    folder = Path(folder) if folder else REPO / "results" / "serve"
    paths = sorted(folder.glob("*.json")) + (sorted(folder.glob("earlier/*.json")) if earlier else [])
    return {p.relative_to(folder).as_posix(): json.loads(p.read_text()) for p in paths}


def shown_commit(commit: str | None) -> str:
    """A result's commit as a reader sees it: a run from a tree with uncommitted changes says so in words."""
    if not commit:
        return "?"
    return commit.removesuffix("-dirty") + (" + local changes" if commit.endswith("-dirty") else "")


def shown_command(command: str) -> str:
    """A result's command as a reader sees it: absolute paths (a scratch folder of the machine it ran
    on) shortened to their file names."""
    return re.sub(r"(?<![\w:])/(?:[^\s/]+/)+([^\s/]+)", r"\1", command)


def provenance_row(name: str, r: dict) -> dict:
    """One result file's provenance as a table row: machine, versions, commit, command."""
    return {"file": name, "device": r["device"], "vLLM": r["versions"]["vllm"], "torch": r["versions"]["torch"],
            "commit": shown_commit(r["commit"]), "dtype": r["dtype"], "max_num_seqs": r["engine"]["max_num_seqs"],
            "command": f"`{shown_command(r['command'])}`"}


def result_row(name: str, r: dict) -> dict:
    """One result file as a table row."""
    fps = r["frames_per_s"]
    return {"file": name, "device": r["device"], "vLLM": r["versions"]["vllm"], "commit": shown_commit(r["commit"]),
            "sessions": r["sessions"], "frames": r["shapes"]["frames_per_session"], "drops": r["drops"],
            "bad": r["bad_inputs"], "server frames/s": round(fps["server"]["median"], 1),
            "in-process frames/s": round(fps["in_process"]["median"], 1), "ratio": round(fps["ratio"], 3),
            "trials": r["trials"], "checks": "all pass" if r["ok"] else
            ", ".join(k for k, v in r["checks"].items() if not v["ok"]) + " FAILED"}


# ---------------------------------------------------------------------------- the two targets
def thread_target(model, engine_args: dict, metrics: bool, plan: LoadPlan):
    """A `ServerThread` on `model` (started), and the `Target` that drives it; stop the server after.
    Its engine schedules every session of the plan at once (`max_num_seqs`, unless `engine_args`
    says otherwise): the server admits no more sessions than that."""
    from .server import ServerThread

    engine_args = {"max_num_seqs": plan.sessions, **engine_args}
    server = ServerThread(model, engine_args=engine_args, metrics=metrics, max_frames=max(1000, plan.frames)).start()
    return server, server_target(server)


def server_target(server) -> Target:
    """The `Target` of a started `ServerThread`: its URL, its KV blocks, its engine on its loop."""
    from ..port.layout import FrameLayout

    layout = FrameLayout.from_config(server.engine.model_config.hf_config)

    async def loop_cpu():
        return time.thread_time()

    return Target(server.url, server.kv_blocks, lambda make: server.call(make(server.engine)), layout, server.engine,
                  lambda: server.call(loop_cpu()))


def url_target(url: str, model, engine_args: dict, metrics: bool):
    """A running server at `url`; the reference on an engine of its own built here (`make_session_engine`)."""
    import httpx

    from ..port.layout import FrameLayout
    from ..port.session_rollout import engine_loop, make_session_engine

    from .server import event_loop_factory

    def health():
        return httpx.get(url.rstrip("/") + "/health", timeout=60).json()

    def kv_blocks():
        return health()["kv_blocks"]

    if kv_blocks() is None:
        raise RuntimeError(f"{url}/health reports no KV blocks: the leak check needs them")
    # On the same kind of event loop as the server's (uvloop where installed).
    from .engine import serving_defaults

    engine = make_session_engine(model, loop_factory=event_loop_factory(), disable_log_stats=not metrics,
                                 **{**serving_defaults(model), **engine_args})
    layout = FrameLayout.from_config(engine.model_config.hf_config)

    def run_reference(make):
        return asyncio.run_coroutine_threadsafe(make(engine), engine_loop(engine)).result()

    return engine, Target(url.rstrip("/"), kv_blocks, run_reference, layout, engine,
                          lambda: health().get("loop_cpu_s"))


def engine_settings(engine) -> dict:
    """The settings read back from the engine that both sides ran on (or the reference's)."""
    mc, sc, cc = engine.model_config, engine.vllm_config.scheduler_config, engine.vllm_config.cache_config
    return {"model": str(mc.model), "dtype": str(mc.dtype).replace("torch.", ""), "max_model_len": mc.max_model_len,
            "max_num_seqs": sc.max_num_seqs, "max_num_batched_tokens": sc.max_num_batched_tokens,
            "enforce_eager": mc.enforce_eager, "enable_prefix_caching": cc.enable_prefix_caching,
            "block_size": cc.block_size, "log_stats": bool(getattr(engine, "log_stats", None)),
            "stream_interval": getattr(sc, "stream_interval", None)}


# ---------------------------------------------------------------------------- the command
def parser() -> argparse.ArgumentParser:
    from .__main__ import engine_arg

    p = argparse.ArgumentParser(prog="python -m terra_nb.serve.load", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a Terra checkpoint folder (default: the toy model, data/toy/model)")
    p.add_argument("--url", default=None, help="a server already running (default: one started in this process)")
    p.add_argument("--sessions", type=int, default=LoadPlan.sessions, help="clients at once, all kinds")
    p.add_argument("--frames", type=int, default=LoadPlan.frames, help="frames each good session drives")
    p.add_argument("--drops", type=int, default=LoadPlan.drops, help="clients that leave mid-frame")
    p.add_argument("--bad", type=int, default=LoadPlan.bad, help="clients that send bad input")
    p.add_argument("--contexts", type=int, default=LoadPlan.n_contexts, help="distinct contexts of the good sessions")
    p.add_argument("--trials", type=int, default=LoadPlan.trials, help="trials each way (medians)")
    p.add_argument("--timeout", type=float, default=LoadPlan.timeout, help="s a client waits for one answer")
    p.add_argument("--engine-arg", type=engine_arg, action="append", default=[], metavar="KEY=VALUE",
                   help="a vLLM engine argument over make_async_engine's defaults (repeatable)")
    p.add_argument("--disable-log-stats", action="store_true", help="vLLM's stats off (as the server's flag)")
    p.add_argument("--out", default=None, help="the result JSON (default: results/serve/<cpu|gpu>_<date>.json)")
    return p


def record(load: dict, verdicts: dict, speed: dict, settings: dict, command: str, url: str | None) -> dict:
    """The result file's content."""
    from ..workbook.show import environment_info

    env = environment_info()
    plan, layout = load["plan"], load["layout"]
    return {
        "what": "terra_nb.serve load test: concurrent WS sessions vs in-process session_rollout",
        "command": command, "commit": env["git_commit"], "date": env["date"],
        "device": env["device"], "device_type": env["device_type"], "cpu_count": env["cpu_count"],
        "versions": {k: env[k] for k in ("vllm", "torch", "transformers", "python")},
        "server": "external: " + url if url else "ServerThread (this process)",
        "engine": settings, "dtype": settings["dtype"],
        "shapes": {"image_tokens": layout.image_tokens, "action_tokens": layout.action_tokens,
                   "action_dim": layout.action_dim, "num_codes": layout.num_codes, "n_ctx": plan.n_ctx,
                   "frames_per_session": plan.frames},
        "sessions": plan.sessions, "good": plan.sessions - plan.drops - plan.bad, "drops": plan.drops,
        "bad_inputs": plan.bad, "bad_kinds": list(BAD_INPUTS), "contexts": plan.n_contexts, "trials": plan.trials,
        "timeout_s": plan.timeout, "kv_blocks_at_start": load["kv_blocks_at_start"],
        "frames_per_s": speed, "checks": verdicts,
        "ok": all(v["ok"] for v in verdicts.values()),
    }


def default_out(device_type: str) -> Path:
    from ..workbook.paths import REPO

    return REPO / "results" / "serve" / f"{'gpu' if device_type == 'cuda' else 'cpu'}_{time.strftime('%Y-%m-%d')}.json"


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from ..toyworld.tokenizer import toy_data_dir

    plan = LoadPlan(sessions=args.sessions, frames=args.frames, drops=args.drops, bad=args.bad,
                    n_contexts=args.contexts, trials=args.trials, timeout=args.timeout)
    model = args.model or str(toy_data_dir() / "model")
    engine_args, metrics = dict(args.engine_arg), not args.disable_log_stats
    command = "python -m terra_nb.serve.load " + " ".join(sys.argv[1:] if argv is None else argv)
    began = time.perf_counter()
    server = engine = None
    try:
        if args.url:
            engine, target = url_target(args.url, model, engine_args, metrics)
        else:
            server, target = thread_target(model, engine_args, metrics, plan)
        print(f"engine up in {time.perf_counter() - began:.1f} s; {plan.sessions} sessions x {plan.frames} frames, "
              f"{plan.drops} drops, {plan.bad} bad, {plan.trials} trials each way", flush=True)
        load = run_load(target, plan, log=lambda s: print(s, flush=True))
        load["layout"] = target.layout
        settings = engine_settings(target.engine)
    finally:
        if server is not None:
            server.stop()
        if engine is not None:
            from ..port.session_rollout import shutdown_async_engine

            shutdown_async_engine(engine)
    verdicts, speed = checks(load), summarize(load)
    result = record(load, verdicts, speed, settings, command, args.url)
    out = Path(args.out) if args.out else default_out(result["device_type"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"checks": {k: v["ok"] for k, v in verdicts.items()}, "frames_per_s": {
        "server": round(speed["server"]["median"], 2), "in_process": round(speed["in_process"]["median"], 2),
        "ratio": round(speed["ratio"], 3)}, "seconds": round(time.perf_counter() - began, 1), "out": str(out)}))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
