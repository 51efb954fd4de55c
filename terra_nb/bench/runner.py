"""Running the benchmark's rows: which rows run in which process, and what a process writes.

Each engine runs in its own process (a vLLM engine does not hand its GPU memory back reliably):
`measure` starts `python -m terra_nb.bench run` once per engine group and merges the parts
(`results.merge`); `run` is what such a process does, one group after the other through
`measure`'s row functions, each part headed by `part_header`. `profile` (one engine profiled) and
`tensor_parallel` (`bench tp`) are the other two kinds of part.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import traceback
from pathlib import Path
from typing import Callable

from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout
from terra_nb.bench.engines import NO_MULTICAST_TP_KWARGS, port_engine, shutdown, stock_engine
from terra_nb.bench.measure import (StepSpec, bench_hf, bench_prefill, bench_seed_rows, bench_session, bench_stock,
                                    bench_vllm, greedy_tokens, greedy_vs_ref, port_rollout_row, profile_on)
from terra_nb.bench.results import merge
from terra_nb.bench.timing import Progress
from terra_nb.bench.workload import PREFILL, SEED_ROWS, Workload, checkpoint, engine_groups, row_engine, tp_row


def run(rows: list[str], wl: Workload, ckpt_root: Path, engine_kwargs: dict | None = None,
        partial: Path | None = None, deadline_s: float | None = None, profile_spec=None,
        steps: StepSpec | None = None) -> dict:
    """Measure `rows` in this process; `engine_kwargs` go to every vLLM engine (e.g. max_num_seqs).

    With `partial`, the part is rewritten after every row; rows that would start after
    `deadline_s` seconds are skipped (listed in `errors`); with `profile_spec` (a
    `profiling.ProfileSpec`), each vLLM engine is also profiled before its rows (key `profile`);
    with `steps` (a `StepSpec`), the rows of its batches get a profile of their frame steps.
    """
    engines = {row_engine(r) for r in rows}  # raises on an unknown row
    ckpt = checkpoint(ckpt_root, wl)
    kw = dict(engine_kwargs or {})
    progress = Progress(partial, deadline_s, part_header(ckpt, wl, kw))
    groups = [
        ("hf", lambda: [progress.add(r) for r in bench_hf(ckpt, wl)] if not progress.out_of_time("hf") else []),
        ("vllm", lambda: bench_vllm(ckpt, wl, rows, progress, profile_spec, steps, **kw)),
        ("stock_llama", lambda: bench_stock(ckpt, wl, rows, progress, profile_spec, steps, **kw)),
        ("session", lambda: bench_session(ckpt, wl, rows, progress, steps, **kw)),
        ("seed", lambda: bench_seed_rows(ckpt, wl, rows, progress, steps)),
    ]
    for prefix, measure_group in groups:
        wanted = {prefix} & engines or (prefix == "vllm" and "vllm_eager" in engines) or (
            prefix == "seed" and engines & set(SEED_ROWS))
        if not wanted:
            continue
        try:  # a device lease is scarce: one broken group must not lose the others' figures
            measure_group()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            progress.errors.append(dict(group=prefix, error=f"{type(e).__name__}: {e}"))
    progress.flush()
    return dict(progress.header, rows=progress.rows, errors=progress.errors, **progress.extra)


def part_header(ckpt: Path, wl: Workload, engine_kwargs: dict) -> dict:
    """What a part says of itself beside its rows: device and versions, workload, the checkpoint's
    dtype, the engine settings asked for, and the command line."""
    from terra_nb.workbook.show import environment_info

    return dict(env=environment_info(), workload=dataclasses.asdict(wl),
                dtype=str(LlamaActionConfig.from_pretrained(str(ckpt)).dtype), engine_kwargs=engine_kwargs,
                command=" ".join(shlex.quote(a) for a in sys.argv))


def profile(engine: str, wl: Workload, ckpt_root: Path, spec, engine_kwargs: dict | None = None) -> dict:
    """Build one engine (port or stock) and profile it; the file records device and versions."""
    ckpt = checkpoint(ckpt_root, wl)
    kw = dict(engine_kwargs or {})
    if engine not in ("port", "stock"):
        raise ValueError(f"engine must be 'port' or 'stock', got {engine!r}")
    llm, start = port_engine(ckpt, **kw) if engine == "port" else stock_engine(ckpt, **kw)
    res = profile_on(llm, engine, wl, spec, FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt))))
    return dict(engine_start_s=round(start, 1), **part_header(ckpt, wl, kw), **res)


def tensor_parallel(wl: Workload, ckpt_root: Path, tp: int, ref: dict | None, batches=(1,), prefill_prompts: int = 0,
                    partial: Path | None = None, deadline_s: float | None = None, engine_kwargs: dict | None = None) -> dict:
    """Our default engine with `tensor_parallel_size=tp` (`bench tp`): its greedy tokens (against
    TP=1's in `ref`, a part or results file holding them), a row of the frame loop per batch of
    `batches` (`tp_row`: `vllm_tp2`, `vllm_tp2_b32`, ...) and, with `prefill_prompts`, a row of
    prefill alone (`vllm_tp2_prefill`, `bench_prefill`). Run TP=1 and TP=2 on one machine and each
    row has its like at the other size (`analysis.lease_ratios`: `tp2_vs_tp1_b<N>`).

    With `partial`, the part is rewritten after every row (a call cut short keeps what it
    measured); rows that would start after `deadline_s` seconds are skipped (listed in `errors`);
    `engine_kwargs` go to the engine at either size (e.g. `enforce_eager` on the CPU).
    """
    ckpt = checkpoint(ckpt_root, wl)
    # The no-multicast settings at TP=1 too (nothing to all-reduce there): the two sides of a
    # tp2_vs_tp1 ratio then differ in tensor_parallel_size alone.
    kw = dict(NO_MULTICAST_TP_KWARGS, **(engine_kwargs or {}), tensor_parallel_size=tp)
    progress = Progress(partial, deadline_s, part_header(ckpt, wl, kw))
    llm, start = port_engine(ckpt, **kw)
    try:
        greedy = greedy_vs_ref(greedy_tokens(llm, wl), ref)
        for batch in batches:
            name = tp_row(tp, batch)
            extra = dict(tp=tp, **(greedy if not progress.rows else {}))   # the tokens once, on the first row
            _row_into(progress, name, lambda: port_rollout_row(llm, ckpt, wl, name, batch, start, **extra))
        if prefill_prompts > 0:
            name = tp_row(tp, PREFILL)
            _row_into(progress, name, lambda: bench_prefill(llm, wl, name, prefill_prompts, tp=tp,
                                                            engine_start_s=round(start, 1)))
    finally:
        shutdown(llm)
    progress.flush()
    return dict(progress.header, rows=progress.rows, errors=progress.errors)


def _row_into(progress: Progress, name: str, measure: Callable[[], dict]) -> None:
    """`measure()`'s row into `progress` unless it would start past the deadline; a row that fails
    is listed in `errors` and the next one still runs (a device lease is scarce)."""
    if progress.out_of_time(name):
        return
    try:
        progress.add(measure())
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        progress.errors.append(dict(group=name, error=f"{type(e).__name__}: {e}"))
        progress.flush()


def measure(rows: list[str], wl: Workload, ckpt_root: Path | str, work_dir: Path | str,
            timeout: float | None = None) -> dict:
    """Run `rows` with `python -m terra_nb.bench run`, one fresh process per engine group
    (`engine_groups`), and merge the parts (see `merge`). Part files land in `work_dir`.

    A process that fails raises `RuntimeError` with the end of its output; a row group that fails
    inside a process is listed in the result's `errors` (as `run` records it).
    """
    import subprocess

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, group in enumerate(engine_groups(rows)):
        out = work_dir / f"part_{i}.json"
        out.unlink(missing_ok=True)  # a stale part must not pass for this run's
        cmd = [sys.executable, "-m", "terra_nb.bench", "run", "--rows", ",".join(group), "--preset", wl.preset,
               "--ckpt-root", str(ckpt_root), "--out", str(out)]
        for f in dataclasses.fields(Workload):
            if f.name != "preset":
                cmd += ["--" + f.name.replace("_", "-"), str(getattr(wl, f.name))]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"benchmark process for rows {group} failed (exit {proc.returncode}):\n{tail}")
        parts.append(json.loads(out.read_text()))
    return merge(parts)
