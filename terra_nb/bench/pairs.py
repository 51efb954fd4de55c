"""Interleaved comparisons: every side alive in a process of its own, trials taken in turn.

Timing one engine for all its trials and then the other confounds the comparison with whatever
the machine did in between (clocks, other tenants, a warmer cache) and with the order. Here each
side (`sides.SideSpec`) is built once in its own worker process (so each engine has its own
memory and none hands memory back to another), all of them stay alive, and a *block* (one
workload: batch, frames, temperature) takes its trials in rounds: round r runs every side once,
the order rotated by r (A B, B A, A B, ...). Trial r of every side uses the same sampling seed.
A *comparison* names two sides of a block, the setting it tests, and optionally a target
speed-up; its two sides' recorded settings must agree on everything else (`settings.check_pair`),
checked before the first trial.

    python -m terra_nb.bench pairs --plan headline_stock --out results/pairs/<machine>_headline_stock.json

The result file is rewritten after every round (a run cut short keeps what it measured), and
records each side's settings as the engine reports them, the device, versions, the command and
every trial in the order it ran. `analysis` (speed-ups, intervals, verdicts) is recomputed from
the trials by `analyse`, never typed in.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

from terra_nb.bench.settings import ALL, check_pair
from terra_nb.bench.sides import SideSpec
from terra_nb.bench.stats import compare


@dataclasses.dataclass(frozen=True)
class Block:
    """One workload that several sides run in turn: `frames` frames after the context for `batch`
    rollouts at once, `trials` rounds, sampling at `temperature`; with `step_profile`, each engine
    side's frame steps profiled on one more rollout after the timed rounds (`sides.Side.step_profile`)."""
    name: str
    sides: tuple[str, ...]
    batch: int
    frames: int
    trials: int = 5
    temperature: float = 0.9
    step_profile: bool = False

    def __post_init__(self):
        if len(set(self.sides)) < 2:
            raise ValueError(f"block {self.name!r} needs at least two different sides, got {self.sides}")
        if self.trials < 1 or self.batch < 1 or self.frames < 1:
            raise ValueError(f"block {self.name!r}: trials, batch and frames must be >= 1")


@dataclasses.dataclass(frozen=True)
class Pair:
    """A speed-up of `first` over `second` in block `block`; `under_test`: the settings it changes on
    purpose (`settings.ALL` for whole engines, e.g. HF against vLLM); `target`: the speed-up `first`
    must reach for the verdict `met` (None: no verdict)."""
    name: str
    block: str
    first: str
    second: str
    under_test: tuple[str, ...] | str = ()
    target: float | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sides, the blocks they run, and the pairs compared. Sides start in the order given, each
    finishing its start before the next begins (two engines sizing their memory at once would
    race for it); all stay alive until every block has run. `env`: (name, value) pairs of
    environment variables every side's process starts with (each side records its `VLLM_*` ones)."""
    preset: str
    n_ctx: int
    sides: tuple[SideSpec, ...]
    blocks: tuple[Block, ...]
    pairs: tuple[Pair, ...]
    seed: int = 0
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        names = [s.name for s in self.sides]
        if len(set(names)) != len(names):
            raise ValueError(f"side names must be unique: {names}")
        blocks = {b.name: b for b in self.blocks}
        for b in self.blocks:
            unknown = set(b.sides) - set(names)
            if unknown:
                raise ValueError(f"block {b.name!r} names sides that the plan lacks: {sorted(unknown)}")
        for p in self.pairs:
            if p.block not in blocks:
                raise ValueError(f"pair {p.name!r}: no block {p.block!r}")
            if {p.first, p.second} - set(blocks[p.block].sides) or p.first == p.second:
                raise ValueError(f"pair {p.name!r}: {p.first!r} and {p.second!r} must be two sides of block {p.block!r}")


# ---------------------------------------------------------------- the worker process of one side

def _serve(conn, spec: SideSpec, ckpt: str, preset: str, n_ctx: int, log: str | None = None) -> None:
    """A side's process: build it, report its settings, then run trials until told to close.

    With `log`, the process writes its output (vLLM's engine log) there instead of the parent's
    stdout/stderr. Its engine core runs in this process unless the environment says otherwise
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: one process a side, and the workers are in reach for
    `settings.effective_settings`); the value is recorded with the settings either way."""
    import os

    if log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        from terra_nb.bench.sides import build_side

        side = build_side(spec, Path(ckpt), preset, n_ctx)
        conn.send(("ready", dict(side.settings(), start_s=round(side.start_s, 2))))
    except BaseException:  # noqa: BLE001  (the parent reports it)
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg[0] == "close":
            side.close()
            conn.send(("closed", None))
            return
        try:
            if msg[0] == "counters":
                conn.send(("counters", side.counters()))
                continue
            if msg[0] == "last_steps":
                conn.send(("steps", side.last_steps))
                continue
            if msg[0] == "step_profile":
                conn.send(("profile", side.step_profile(*msg[1:])))
                continue
            conn.send(("seconds", side.trial(*msg[1:])))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))


class SideTimeout(RuntimeError):
    """A side gave no answer in time (a hung engine, or work far slower than planned)."""


START_TIMEOUT_S = 1200.0
"""The longest a side may take to start: load, compile, capture CUDA graphs (minutes on a GPU)."""

TRIAL_TIMEOUT_S = 900.0
"""The longest one trial (or a close) may take before the side counts as hung."""


class Worker:
    """The parent's handle on one side's process, spawned: a new Python holding no engine, no CUDA and
    no vLLM state of the parent's, with the parent's environment as it is now. A side that does not
    answer within its timeout is stopped and raises `SideTimeout` naming it (`serve`: what the
    process runs, `_serve` unless a test gives another)."""

    def __init__(self, spec: SideSpec, ckpt: Path, preset: str, n_ctx: int, log: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, trial_timeout_s: float = TRIAL_TIMEOUT_S, serve=_serve):
        ctx = mp.get_context("spawn")
        self.spec, self.log, self.trial_timeout_s = spec, log, trial_timeout_s
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, spec, str(ckpt), preset, n_ctx, log and str(log)), daemon=False)
        self.proc.start()
        self.record = self._answer("ready", start_timeout_s)

    def _log_tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return f"\n--- the end of its log ({self.log}):\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def _answer(self, expect: str, timeout_s: float | None = None):
        timeout_s = self.trial_timeout_s if timeout_s is None else timeout_s
        t0 = time.perf_counter()
        while not self.conn.poll(min(5.0, timeout_s)):
            if not self.proc.is_alive():
                raise RuntimeError(f"side {self.spec.name!r}: its process died (exit {self.proc.exitcode})" + self._log_tail())
            if time.perf_counter() - t0 >= timeout_s:
                self.proc.kill()
                self.proc.join(timeout=30)
                raise SideTimeout(f"side {self.spec.name!r} gave no answer ({expect}) within {timeout_s:.0f} s: its "
                                  "process was stopped (a hung engine, or work slower than the timeout allows)"
                                  + self._log_tail())
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"side {self.spec.name!r} failed:\n{value}" + self._log_tail())
        assert kind == expect, (kind, expect)
        return value

    def trial(self, batch: int, frames: int, temperature: float, seed: int) -> float:
        self.conn.send(("trial", batch, frames, temperature, seed))
        return self._answer("seconds")

    def last_steps(self) -> dict | None:
        """The side's last trial, frame by frame in three figures (`sides.Side.last_steps`); None
        for a side whose trials are not a frame loop (HF, sessions)."""
        self.conn.send(("last_steps",))
        return self._answer("steps")

    def counters(self) -> dict[str, float]:
        """The side's engine counters now (`settings.engine_counters`)."""
        self.conn.send(("counters",))
        return self._answer("counters")

    def step_profile(self, batch: int, frames: int, temperature: float, seed: int) -> dict:
        """The side's frame-step profile on one more rollout (`sides.Side.step_profile`)."""
        self.conn.send(("step_profile", batch, frames, temperature, seed))
        return self._answer("profile")

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.conn.send(("close",))
                self._answer("closed")
        finally:
            self.proc.join(timeout=120)
            if self.proc.is_alive():
                self.proc.kill()


# ---------------------------------------------------------------- running a plan

def round_order(sides: tuple[str, ...], r: int) -> list[str]:
    """Round r's order: the sides rotated by r (two sides: A B, B A, A B, ...)."""
    k = r % len(sides)
    return list(sides[k:] + sides[:k])


def run_plan(plan: Plan, ckpt: Path, out: Path | None = None, run: str | None = None,
             deadline_s: float | None = None, progress: bool = True, log_dir: Path | None = None,
             commit: str | None = None, trial_timeout_s: float = TRIAL_TIMEOUT_S) -> dict:
    """Start every side, check every pair's settings, run the blocks round by round; return (and
    with `out`, keep writing) the result. Rounds that would start after `deadline_s` are skipped
    and listed in `errors`. A pair whose sides differ outside `under_test` raises
    `settings.UnequalSettings` before any trial. Each side's engine log goes to
    `<log_dir>/<side>.log` (default: beside `out`, else a temporary folder), not to this output.
    `commit`: the code that runs, where this machine's git is stale (`with_commit`); `run`: how it
    was started (machine, command), kept as the file's `run`. A side that does not answer a trial
    within `trial_timeout_s` stops the run with `SideTimeout` (listed in `errors` too)."""
    import tempfile

    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    if log_dir is None:
        log_dir = out.parent / f"{out.stem}_logs" if out is not None else Path(tempfile.mkdtemp(prefix="pairs_logs_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    res = header(plan, ckpt, run)
    if commit:
        res = with_commit(res, commit)
    workers: dict[str, Worker] = {}
    saved_env = {k: os.environ.get(k) for k, _ in plan.env}
    os.environ.update(dict(plan.env))  # the sides' processes inherit it when they start

    def flush():
        res["analysis"] = analyse(res)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(res, indent=2) + "\n")

    try:
        for spec in plan.sides:
            workers[spec.name] = Worker(spec, ckpt, plan.preset, plan.n_ctx, log_dir / f"{spec.name}.log",
                                        trial_timeout_s=trial_timeout_s)
            res["sides"][spec.name] = dict(kind=spec.kind, asked=spec.engine_kwargs,
                                           sdpa=list(spec.sdpa) if spec.sdpa else None, **workers[spec.name].record)
        for p in plan.pairs:
            check_pair(p.first, res["sides"][p.first], p.second, res["sides"][p.second], p.under_test)
        flush()
        for b in plan.blocks:
            rec = dict(dataclasses.asdict(b), sides=list(b.sides), order=[], trials_s={s: [] for s in b.sides},
                       trial_steps={s: [] for s in b.sides}, warmup_s={}, counters={})
            res["blocks"].append(rec)
            for s in b.sides:  # untimed: the first call at a new batch pays one-off costs
                rec["warmup_s"][s] = round(workers[s].trial(b.batch, 1, b.temperature, plan.seed), 3)
            before = {s: workers[s].counters() for s in b.sides}
            bar = tqdm(range(b.trials), desc=f"{b.name}: {' vs '.join(b.sides)}", disable=not progress)
            for r in bar:
                if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                    res["errors"].append(dict(block=b.name, error=f"rounds {r}..{b.trials - 1} skipped: past "
                                              f"the {deadline_s:.0f} s deadline"))
                    break
                for s in round_order(b.sides, r):
                    sec = workers[s].trial(b.batch, b.frames, b.temperature, plan.seed + 1 + r)
                    rec["order"].append(s)
                    rec["trials_s"][s].append(round(sec, 4))
                    rec["trial_steps"][s].append(workers[s].last_steps())
                flush()
            rec["counters"] = counter_deltas(before, {s: workers[s].counters() for s in b.sides})
            if b.step_profile:   # after the counters: the profiled rollout is not a trial
                rec["step_profiles"] = {s: workers[s].step_profile(b.batch, b.frames, b.temperature, plan.seed)
                                        for s in b.sides if workers[s].spec.kind != "hf"}
            flush()
    except SideTimeout as e:
        res["errors"].append(dict(error=str(e).split("\n")[0]))
        raise
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for w in workers.values():
            try:
                w.close()
            except Exception as e:  # noqa: BLE001  (a side that cannot close must not hide the results)
                res["errors"].append(dict(side=w.spec.name, error=f"close: {e}"))
        flush()
    return res


def counter_deltas(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """Per side, what its engine counted over a block's timed trials (`settings.engine_counters`
    after minus before), with `codes_per_step` where it generated: one code of its own per request
    step plus the accepted drafts. Sides without counters are left out."""
    out = {}
    for side, end in after.items():
        if not end:
            continue
        d = {k: round(v - before.get(side, {}).get(k, 0.0), 1) for k, v in end.items()}
        steps = d.get("generation_tokens", 0) - d.get("spec_decode_num_accepted_tokens", 0)
        if steps > 0:
            d["codes_per_step"] = round(d["generation_tokens"] / steps, 4)
        out[side] = d
    return out


VERSIONS = ("vllm", "torch", "transformers", "python")


def with_commit(res: dict, commit: str) -> dict:
    """`res` naming `commit` as the code that ran, where the machine's own git was stale (a device
    copy of the tree can carry an old `.git`): its word stays in `env.device_git_commit`."""
    env = dict(res["env"], device_git_commit=res["env"].get("git_commit"), git_commit=commit)
    return dict(res, env=env, commit=commit)


def header(plan: Plan, ckpt: Path, run: str | None) -> dict:
    """What a result says of itself: device, versions, date, commit, command, preset, dtype, context."""
    from terra_nb.port.config import LlamaActionConfig
    from terra_nb.workbook.show import environment_info

    env = environment_info()
    return dict(kind="interleaved", run=run, date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                device=env["device"], versions={k: env[k] for k in VERSIONS}, env=env, commit=env["git_commit"],
                command=" ".join(shlex.quote(a) for a in sys.argv), preset=plan.preset, n_ctx=plan.n_ctx,
                dtype=str(LlamaActionConfig.from_pretrained(str(ckpt)).dtype).removeprefix("torch."),
                plan=plan_dict(plan),
                sides={}, blocks=[], errors=[])


def analyse(res: dict) -> list[dict]:
    """Each planned pair's speed-up, 95% interval and verdict, from the trials in `res` (pure)."""
    blocks = {b["name"]: b for b in res["blocks"]}
    out = []
    for p in res["plan"]["pairs"]:
        b = blocks.get(p["block"])
        if b is None:
            continue
        a_s, b_s = b["trials_s"][p["first"]], b["trials_s"][p["second"]]
        n = min(len(a_s), len(b_s))
        if n == 0:
            continue
        c = compare(p["first"], a_s[:n], p["second"], b_s[:n], p.get("target"))
        out.append(dict(name=p["name"], block=p["block"], first=p["first"], second=p["second"], trials=n,
                        batch=b["batch"], frames=b["frames"], speedup=round(c.value, 4),
                        interval=[round(x, 4) for x in c.interval], target=p.get("target"), verdict=c.verdict,
                        under_test=p["under_test"] if p["under_test"] == ALL else list(p["under_test"])))
    return out


def _under_test(pair: dict):
    """A recorded pair's `under_test` as `Pair` holds it (`ALL`, or a tuple of setting names)."""
    return pair["under_test"] if pair["under_test"] == ALL else tuple(pair["under_test"])


def audit(res: dict) -> None:
    """A result file checked against itself: `ValueError` if its `analysis` does not recompute from
    its trials, `settings.UnequalSettings` if a planned pair's recorded sides differ outside what it
    tests (`check_pair`, as `run_plan` checked before the first trial)."""
    if analyse(res) != res["analysis"]:
        raise ValueError("a ratio does not recompute from the trials")
    for p in res["plan"]["pairs"]:
        check_pair(p["first"], res["sides"][p["first"]], p["second"], res["sides"][p["second"]], _under_test(p))


def plan_dict(plan: Plan) -> dict:
    """A plan as JSON (kept in its result file, so that `plan_of` can run it again)."""
    return dict(preset=plan.preset, n_ctx=plan.n_ctx, seed=plan.seed, sides=[dataclasses.asdict(s) for s in plan.sides],
                blocks=[dataclasses.asdict(b) for b in plan.blocks], pairs=[dataclasses.asdict(p) for p in plan.pairs],
                env=[list(kv) for kv in plan.env])


def plan_of(res: dict) -> Plan:
    """The plan a result file ran (`plan_dict` read back): `bench remake` runs it again."""
    d = res["plan"]
    sides = tuple(SideSpec(**dict(s, sdpa=tuple(s["sdpa"]) if s.get("sdpa") else None)) for s in d["sides"])
    blocks = tuple(Block(**dict(b, sides=tuple(b["sides"]))) for b in d["blocks"])
    pairs = tuple(Pair(**dict(p, under_test=_under_test(p))) for p in d["pairs"])
    return Plan(d["preset"], d["n_ctx"], sides, blocks, pairs, d.get("seed", 0), tuple(map(tuple, d.get("env", ()))))
