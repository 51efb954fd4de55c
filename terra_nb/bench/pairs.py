"""Interleaved comparisons: every side alive in a process of its own, trials taken in turn.

Timing one engine for all its trials and then the other confounds the comparison with whatever the
machine did in between, and with the order. Here each side (`sides.SideSpec`) is built once in its
own spawned process, all stay alive, and a *block* (batch, frames, temperature) takes its trials in
rounds: round r runs every side once, the order rotated by r (A B, B A, ...), with one sampling seed.
A *pair* names two sides of a block, the settings it changes on purpose and optionally a target;
its sides' settings as the engines report them must agree on everything else (`settings.check_pair`),
checked before the first trial. The result file is rewritten after every round and records the
settings, device, versions, command and every trial; `analyse` recomputes its speed-ups.
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
    """A workload its sides run in turn: `frames` frames for `batch` rollouts, `trials` rounds."""
    name: str
    sides: tuple[str, ...]
    batch: int
    frames: int
    trials: int = 5
    temperature: float = 0.9

    def __post_init__(self):
        if len(set(self.sides)) < 2:
            raise ValueError(f"block {self.name!r} needs at least two different sides, got {self.sides}")
        if self.trials < 1 or self.batch < 1 or self.frames < 1:
            raise ValueError(f"block {self.name!r}: trials, batch and frames must be >= 1")


@dataclasses.dataclass(frozen=True)
class Pair:
    """A speed-up of `first` over `second` in `block`; `under_test`: the settings it changes on purpose
    (`settings.ALL`: whole engines, e.g. HF against vLLM); `target`: the speed-up `first` must reach."""
    name: str
    block: str
    first: str
    second: str
    under_test: tuple[str, ...] | str = ()
    target: float | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sides, the blocks they run, the pairs compared. Sides start one after the other (two engines
    sizing their memory at once would race for it) and live until every block ran."""
    preset: str
    n_ctx: int
    sides: tuple[SideSpec, ...]
    blocks: tuple[Block, ...]
    pairs: tuple[Pair, ...]
    seed: int = 0

    def __post_init__(self):
        names = [s.name for s in self.sides]
        if len(set(names)) != len(names):
            raise ValueError(f"side names must be unique: {names}")
        blocks = {b.name: b for b in self.blocks}
        for b in (b for b in self.blocks if set(b.sides) - set(names)):
            raise ValueError(f"block {b.name!r} names sides that the plan lacks: {sorted(set(b.sides) - set(names))}")
        for p in self.pairs:
            if p.block not in blocks:
                raise ValueError(f"pair {p.name!r}: no block {p.block!r}")
            if {p.first, p.second} - set(blocks[p.block].sides) or p.first == p.second:
                raise ValueError(f"pair {p.name!r}: {p.first!r} and {p.second!r} must be two sides of block {p.block!r}")


# ---------------------------------------------------------------- the process of one side

def _serve(conn, spec: SideSpec, ckpt: str, preset: str, n_ctx: int, log: str | None = None) -> None:
    """A side's process: build it, report its settings, answer trials until told to close. Its output
    goes to `log`; its engine core runs in this process, so `effective_settings` reaches the workers."""
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
    while (msg := conn.recv())[0] != "close":
        try:
            conn.send(("counters", side.counters()) if msg[0] == "counters" else ("seconds", side.trial(*msg[1:])))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
    side.close()
    conn.send(("closed", None))


class SideTimeout(RuntimeError):
    """A side gave no answer in time (a hung engine, or work far slower than planned)."""


START_TIMEOUT_S, TRIAL_TIMEOUT_S = 1200.0, 900.0   # a GPU engine compiles for minutes; a trial, or a close


class Worker:
    """The parent's handle on one side's spawned process (no engine, CUDA or vLLM state of the
    parent's). A side silent past its timeout is stopped and raises `SideTimeout` naming it."""

    def __init__(self, spec: SideSpec, ckpt: Path, preset: str, n_ctx: int, log: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, trial_timeout_s: float = TRIAL_TIMEOUT_S, serve=_serve):
        ctx = mp.get_context("spawn")
        self.spec, self.log, self.trial_timeout_s = spec, log, trial_timeout_s
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, spec, str(ckpt), preset, n_ctx, log and str(log)))
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

    def counters(self) -> dict[str, float]:
        self.conn.send(("counters",))
        return self._answer("counters")

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
    """Start every side, check every pair's settings (`settings.UnequalSettings` before any trial),
    run the blocks round by round; return (and with `out`, keep writing) the result. Rounds past
    `deadline_s` are skipped, a side silent for `trial_timeout_s` stops the run (`SideTimeout`): both
    listed in `errors`. Engine logs go to `<log_dir>/<side>.log` (default: beside `out`). `run`: how
    the run was started; `commit`: the code that runs, where the machine's git is stale."""
    import tempfile

    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    if log_dir is None:
        log_dir = out.parent / f"{out.stem}_logs" if out is not None else Path(tempfile.mkdtemp(prefix="pairs_logs_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    res = header(plan, ckpt, run)
    if commit:   # the machine's own git was stale: its word stays in `env.device_git_commit`
        res.update(commit=commit, env=dict(res["env"], device_git_commit=res["env"]["git_commit"], git_commit=commit))
    workers: dict[str, Worker] = {}

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
                       warmup_s={}, counters={})
            res["blocks"].append(rec)
            for s in b.sides:  # untimed: the first call at a new batch pays one-off costs
                rec["warmup_s"][s] = round(workers[s].trial(b.batch, 1, b.temperature, plan.seed), 3)
            before = {s: workers[s].counters() for s in b.sides}
            for r in tqdm(range(b.trials), desc=f"{b.name}: {' vs '.join(b.sides)}", disable=not progress):
                if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                    res["errors"].append(dict(block=b.name, error=f"rounds {r}..{b.trials - 1} skipped: past "
                                              f"the {deadline_s:.0f} s deadline"))
                    break
                for s in round_order(b.sides, r):
                    rec["trials_s"][s].append(round(workers[s].trial(b.batch, b.frames, b.temperature, plan.seed + 1 + r), 4))
                    rec["order"].append(s)
                flush()
            rec["counters"] = counter_deltas(before, {s: workers[s].counters() for s in b.sides})
            flush()
    except SideTimeout as e:
        res["errors"].append(dict(error=str(e).split("\n")[0]))
        raise
    finally:
        for w in workers.values():
            try:
                w.close()
            except Exception as e:  # noqa: BLE001  (a side that cannot close must not hide the results)
                res["errors"].append(dict(side=w.spec.name, error=f"close: {e}"))
        flush()
    return res


def counter_deltas(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """Per side with counters, what its engine counted over a block's timed trials (after minus
    before), with `codes_per_step`: a code of its own per request step plus the accepted drafts."""
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


def header(plan: Plan, ckpt: Path, run: str | None) -> dict:
    """What a result says of itself: device, versions, date, commit, command, preset, dtype, plan."""
    from terra_nb.port.config import LlamaActionConfig
    from terra_nb.workbook.show import environment_info

    env = environment_info()
    return dict(kind="interleaved", run=run, date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                device=env["device"], versions={k: env[k] for k in ("vllm", "torch", "transformers", "python")},
                env=env, commit=env["git_commit"], command=" ".join(shlex.quote(a) for a in sys.argv),
                preset=plan.preset, n_ctx=plan.n_ctx,
                dtype=str(LlamaActionConfig.from_pretrained(str(ckpt)).dtype).removeprefix("torch."),
                plan=plan_dict(plan), sides={}, blocks=[], errors=[])


def analyse(res: dict) -> list[dict]:
    """Each planned pair's speed-up, 95% interval and verdict, from the trials in `res` (pure)."""
    blocks = {b["name"]: b for b in res["blocks"]}
    out = []
    for p in res["plan"]["pairs"]:
        b = blocks.get(p["block"])
        n = b and min(len(b["trials_s"][p["first"]]), len(b["trials_s"][p["second"]]))
        if not n:
            continue
        c = compare(b["trials_s"][p["first"]][:n], b["trials_s"][p["second"]][:n], p.get("target"))
        out.append(dict(name=p["name"], block=p["block"], first=p["first"], second=p["second"], trials=n,
                        batch=b["batch"], frames=b["frames"], speedup=round(c["speedup"], 4),
                        interval=[round(x, 4) for x in c["interval"]], target=p.get("target"), verdict=c["verdict"],
                        under_test=p["under_test"] if p["under_test"] == ALL else list(p["under_test"])))
    return out


def _under_test(pair: dict):   # as `Pair` holds it: `ALL`, or a tuple of setting names
    return pair["under_test"] if pair["under_test"] == ALL else tuple(pair["under_test"])


def audit(res: dict) -> None:
    """A result file checked against itself: `ValueError` if its `analysis` does not recompute from
    its trials, `settings.UnequalSettings` if a pair's recorded sides differ outside what it tests."""
    if analyse(res) != res["analysis"]:
        raise ValueError("a ratio does not recompute from the trials")
    for p in res["plan"]["pairs"]:
        check_pair(p["first"], res["sides"][p["first"]], p["second"], res["sides"][p["second"]], _under_test(p))


def plan_dict(plan: Plan) -> dict:
    """A plan as JSON, kept in its result file (`plan_of` reads it back)."""
    return dict(preset=plan.preset, n_ctx=plan.n_ctx, seed=plan.seed, sides=[dataclasses.asdict(s) for s in plan.sides],
                blocks=[dataclasses.asdict(b) for b in plan.blocks], pairs=[dataclasses.asdict(p) for p in plan.pairs])


def plan_of(res: dict) -> Plan:
    """The plan a result file ran (`plan_dict` read back): `bench remake` runs it again."""
    d = res["plan"]
    fields = {f.name for f in dataclasses.fields(Block)}   # a file may record a field no block takes now
    sides = tuple(SideSpec(**dict(s, sdpa=tuple(s["sdpa"]) if s.get("sdpa") else None)) for s in d["sides"])
    blocks = tuple(Block(**dict({k: v for k, v in b.items() if k in fields}, sides=tuple(b["sides"]))) for b in d["blocks"])
    pairs = tuple(Pair(**dict(p, under_test=_under_test(p))) for p in d["pairs"])
    return Plan(d["preset"], d["n_ctx"], sides, blocks, pairs, d.get("seed", 0))
