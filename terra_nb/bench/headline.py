"""The benchmark's headline, rendered from the interleaved result files (`pairs`), never typed in.

One table: the port against stock vLLM Llama at 1, 32 and 128 rollouts, the port against HF
Transformers in the seed's setting and with today's defaults; each row a speed-up of the first-named
side (above 1: it is faster) with its 95% interval, the target and the verdict, and a note under the
table with each row's setup. Then one sentence each on whether the seed's 2.6x is reproduced and
why, and the provenance (device, versions, commit, command).

Each file's `analysis` is what `pairs.analyse` computed from its trials when the run wrote it
(tests/test_bench_pairs.py recomputes it for every committed file). The newest
`results/pairs/*_headline_stock.json` and `*_headline_seed.json` are the headline's files
(`latest`); `headline_markdown()` is the README's headline block (between `README_START` and
`README_END`).
"""
from __future__ import annotations

import statistics
from pathlib import Path

from terra_nb.bench.plans import MM_PATH_PAIRS, SEED_SPEEDUP
from terra_nb.bench.records import block, latest as latest_file, loaded, provenance as provenance_line, same_code_runs
from terra_nb.bench.stats import (MET, MISSED, and_text, interval_text, rollouts_list_text, rollouts_text,
                                  rounds_speedup, runs_interval, speedup, verdict)
from terra_nb.bench.step_profile import TRIAL_FIGURES
from terra_nb.bench.workload import SEED_FIGURES

README_START, README_END = "<!-- headline:start -->", "<!-- headline:end -->"

WHO = {"port": "the port", "stock": "stock vLLM Llama", "hf": "HF Transformers",
       "port_seed": "the port as the seed ran vLLM", "port_defaults": "the port with today's defaults"}
"""How a side is named in sentences and tables."""


def latest(kind: str, results_dir: Path | None = None) -> tuple[Path, dict]:
    """The newest result file of a headline plan (`stock` or `seed`) under results/pairs/ (the
    interleaved comparisons' files), by the date it records, and its contents."""
    from terra_nb.workbook.paths import RESULTS

    return latest_file(f"*_headline_{kind}.json", results_dir or RESULTS / "pairs",
                       f"run `python -m terra_nb.bench pairs --plan headline_{kind}` on a GPU first")


def s_per_frame(res: dict, block_name: str, side: str) -> float:
    """A side's median seconds per frame in a block (each frame of all rollouts at once)."""
    b = block(res, block_name)
    return statistics.median(b["trials_s"][side]) / b["frames"]


def ms_per_code(res: dict, block_name: str, side: str) -> float:
    """A side's median milliseconds per generated code at batch 1 (codes per frame from the preset)."""
    from terra_nb.port.checkpoints import preset_config
    from terra_nb.port.layout import FrameLayout

    return 1000 * s_per_frame(res, block_name, side) / FrameLayout.from_config(preset_config(res["preset"])).image_tokens


def _verdict_text(c: dict) -> str:
    if c["target"] is None:
        return ""
    return f"at least {c['target']:.2f}x: {c['verdict']}"


def headline_rows(stock: dict, seed: dict) -> list[dict]:
    """The table's rows: one per compared pair of both files, in the plans' order; `note` is the
    number of the setup note under the table (1: the stock file's setup, 2: the seed file's)."""
    rows = []
    for note, res in ((1, stock), (2, seed)):
        for c in res["analysis"]:
            if res is seed and c["second"] != "hf":
                continue  # the seed plan's third ratio (defaults vs seed engine) is detail, not headline
            b = block(res, c["block"])
            lo, hi = c["interval"]
            rows.append(dict(
                comparison=f"{WHO[c['first']]} vs {WHO[c['second']]}", note=note,
                work=f"{rollouts_text(b['batch'])}, {res['n_ctx']} + {b['frames']} frames",
                s_per_frame=f"{s_per_frame(res, c['block'], c['first']):.3f} vs {s_per_frame(res, c['block'], c['second']):.3f}",
                trials=c["trials"], speedup=f"**{c['speedup']:.2f}x** [{lo:.2f}, {hi:.2f}]", verdict=_verdict_text(c)))
    return rows


def headline_table(stock: dict, seed: dict) -> str:
    """The headline as a Markdown table, with each row's setup in a numbered note under it."""
    lines = ["| comparison (speed-up of the first over the second) | work per trial | seconds per frame step, "
             "first vs second | trials a side | speed-up [95% interval] | target: verdict |",
             "|---|---|---|---|---|---|"]
    for r in headline_rows(stock, seed):
        lines.append(f"| {r['comparison']} ({r['note']}) | {r['work']} | {r['s_per_frame']} | {r['trials']} "
                     f"| {r['speedup']} | {r['verdict']} |")
    return "\n".join(lines) + "\n\n" + "\n\n".join(setup_notes(stock, seed))


def _asked(side: dict) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in side["asked"].items()) or "none (vLLM's defaults)"


def setup_notes(stock: dict, seed: dict) -> list[str]:
    """One note a file: what each side ran with, read from the file (its sides' engine arguments,
    the attention kernels HF could use, the sampling temperature and the checkpoint)."""
    temps = lambda res: " and ".join(sorted({str(b["temperature"]) for b in res["blocks"]}))  # noqa: E731
    hf = seed["sides"]["hf"]
    return [
        f"(1) Both engines on the same {stock['dtype']} Terra-shaped random weights, sampling at temperature "
        f"{temps(stock)}, each given the same engine arguments ({_asked(stock['sides']['port'])}); stock vLLM Llama is "
        f"the same backbone without the action inputs and the learned position table. A frame step is one frame "
        f"for every rollout at once.",
        f"(2) The seed's setting: one video, one `generate` call per frame, temperature {temps(seed)}, "
        f"{seed['n_ctx']} + {block(seed, 'seed')['frames']} frames (the seed's video had 22). HF Transformers' "
        f"attention limited to {', '.join(hf['sdpa'] or ['any kernel'])} (cuDNN's kernel rebuilds a plan at every new "
        f"length); the port as the seed ran vLLM 0.6: {_asked(seed['sides']['port_seed'])}; the port with today's "
        f"defaults: {_asked(seed['sides']['port_defaults'])}.",
    ]


def _pair(res: dict, name: str) -> dict:
    return next(c for c in res["analysis"] if c["name"] == name)


def _ci(c: dict) -> str:
    return f"{c['speedup']:.2f}x (95% interval {c['interval'][0]:.2f} to {c['interval'][1]:.2f}, {c['trials']} trials a side)"


def seed_sentences(seed: dict) -> list[str]:
    """Whether the seed's 2.6x is reproduced, in the seed's setting and with today's defaults, and why."""
    eager, defaults = _pair(seed, "port_seed_vs_hf"), _pair(seed, "port_defaults_vs_hf")
    answer = {MET: "Yes", MISSED: "No"}.get(eager["verdict"], "The trials cannot tell")
    hf_s, eager_s = s_per_frame(seed, "seed", "hf"), s_per_frame(seed, "seed", "port_seed")
    seed_hf, seed_vllm = max(SEED_FIGURES.values()), min(SEED_FIGURES.values())
    lines = [
        f"**Is the seed's {SEED_SPEEDUP:.1f}x reproduced?** {answer}, in the seed's own setting: the port run as the "
        f"seed ran vLLM 0.6 (eager, no prefix caching, 5 sequences, one request per frame) is {_ci(eager)} "
        f"HF's speed on the same video.",
        f"Why: HF here took {hf_s:.2f} s per frame ({ms_per_code(seed, 'seed', 'hf'):.1f} ms per code) against the "
        f"seed's {seed_hf:.2f} s, while the eager port took {eager_s:.2f} s ({ms_per_code(seed, 'seed', 'port_seed'):.1f} ms "
        f"per code) against the seed's vLLM at {seed_vllm:.2f} s (over {block(seed, 'seed')['frames']} frames, not "
        f"the seed's 22: HF re-reads a prompt that grows by a frame per call, so its later frames cost more). "
        f"The same port with CUDA graphs took "
        f"{ms_per_code(seed, 'seed', 'port_defaults'):.1f} ms per code in the same rounds, so "
        f"{1 - ms_per_code(seed, 'seed', 'port_defaults') / ms_per_code(seed, 'seed', 'port_seed'):.0%} of the eager "
        f"port's time per code is the per-step work that graphs remove (launching each kernel from Python): at "
        f"batch 1 the seed's ratio compares two CPU-bound loops, and it moves with the host and the library "
        f"versions. Our HF is warmed up and runs with cuDNN's attention ruled out.",
    ]
    verdict = {MET: "exceeded", MISSED: "not reached"}.get(defaults["verdict"], "not resolved")
    lines.append(f"**With today's defaults** (CUDA graphs, prefix caching) the port is {_ci(defaults)} HF's "
                 f"speed: the seed's {SEED_SPEEDUP:.1f}x is {verdict}.")
    return lines


def stock_sentence(stock: dict) -> str:
    """The port against stock vLLM, batch by batch, in one sentence computed from the verdicts."""
    cs = stock["analysis"]
    parts = [f"{interval_text(c['speedup'], c['interval'])} at {rollouts_text(c['batch'])}" for c in cs]
    verdicts = {c["verdict"] for c in cs}
    if verdicts == {MET}:
        tail = "every target met"
    elif MISSED in verdicts:
        tail = "missed at " + and_text([rollouts_text(c["batch"]) for c in cs if c["verdict"] == MISSED])
    elif MET in verdicts:
        tail = (f"{sum(c['verdict'] == MET for c in cs)} of {len(cs)} targets met; the others are not resolved by "
                f"{min(c['trials'] for c in cs)} interleaved trials a side (their intervals straddle the target)")
    else:
        tail = (f"no target resolved by {min(c['trials'] for c in cs)} interleaved trials a side "
                f"(every interval straddles its target)")
    slower = [rollouts_text(c["batch"]) for c in cs if c["interval"][1] < 1]
    faster = [rollouts_text(c["batch"]) for c in cs if c["interval"][0] > 1]
    if slower:
        tail += f". The port is measurably slower than stock at {and_text(slower)} (the whole interval below 1)"
    if faster:
        tail += f". The port is measurably faster than stock at {and_text(faster)}"
    return f"**The port against stock vLLM** (speed-up of the port; 1.00x = stock's speed): {', '.join(parts)}: {tail}."


def across_runs(runs: list[dict]) -> list[dict]:
    """Port-vs-stock runs of one setting and the same port code (`records.same_code_runs`), pooled
    per block: each run's speed-up, and over all their rounds the median round's ratio
    (`stats.rounds_speedup`) with its interval over runs, then rounds (`stats.runs_interval`) and
    its verdict against the newest run's target; `disagree`: whether a run's speed-up lies outside
    another run's interval."""
    out = []
    for i, b in enumerate(runs[-1]["blocks"]):
        per = []
        for r in runs:
            port, stock = r["blocks"][i]["trials_s"]["port"], r["blocks"][i]["trials_s"]["stock"]
            n = min(len(port), len(stock))   # a deadline may cut a round short
            per.append((port[:n], stock[:n]))
        target = next(c.get("target") for c in runs[-1]["analysis"] if c["batch"] == b["batch"])
        interval = runs_interval(per)
        own = [next(c["interval"] for c in r["analysis"] if c["batch"] == b["batch"]) for r in runs]
        each = [speedup(a, s) for a, s in per]
        out.append(dict(batch=b["batch"], runs=len(per), rounds=sum(len(a) for a, _ in per),
                        disagree=any(not lo <= x <= hi for lo, hi in own for x in each),
                        per_run=[round(x, 4) for x in each], speedup=round(rounds_speedup(per), 4),
                        interval=[round(x, 4) for x in interval], target=target,
                        verdict=verdict(interval, target) if target else None))
    return out


def pair_runs(res: dict) -> list[dict]:
    """A `plans.stock_twice_plan` result as two port-vs-stock runs, one per pair of processes
    (`port` with `stock`, `port_b` with `stock_b`), shaped as `across_runs` reads a run: pooled,
    the two pairs weigh the start orders alike."""
    out = []
    for port, stock in (("port", "stock"), ("port_b", "stock_b")):
        blocks = [dict(batch=b["batch"], frames=b["frames"],
                       trials_s=dict(port=b["trials_s"][port], stock=b["trials_s"][stock])) for b in res["blocks"]]
        analysis = [dict(c, first="port", second="stock") for c in res["analysis"] if (c["first"], c["second"]) == (port, stock)]
        out.append(dict(res, blocks=blocks, analysis=analysis))
    return out


def across_runs_sentence(runs: list[dict]) -> str | None:
    """`across_runs` in words, with the runs' commits; None for a single run."""
    if len(runs) < 2:
        return None
    rows = across_runs(runs)
    pooled = and_text([f"{interval_text(r['speedup'], r['interval'])} at {rollouts_text(r['batch'])}" for r in rows])
    each = "; ".join(f"{and_text([f'{x:.2f}x' for x in r['per_run']])} at {rollouts_text(r['batch'])}" for r in rows)
    met = [r for r in rows if r["verdict"] == MET]
    verdicts = (f"{len(met)} of {len(rows)} targets met" if met else "no target met") + "".join(
        f"; missed at {rollouts_text(r['batch'])}" for r in rows if r["verdict"] == MISSED)
    split = [r["batch"] for r in rows if r["disagree"]]
    return (f"**Across runs of the same port code** ({len(runs)} runs of this setting on {runs[-1]['device']}, "
            f"commits {and_text([r['commit'][:7] for r in runs])}; the median of every round's ratio, its interval "
            f"drawn over runs, then their rounds): {pooled}: {verdicts}. Run by run: {each}." + (
                f" At {rollouts_list_text(split)} a run's speed-up lies outside another run's interval: one run's interval "
                "covers the noise between its rounds, not between runs." if split else ""))


def _started(res: dict) -> dict[str, int]:
    """The place each side of a result started in (1 = first): its plan's order of sides."""
    return {side["name"]: place for place, side in enumerate(res["plan"]["sides"], start=1)}


def _twins(res: dict) -> list[tuple[dict, int, int]]:
    """A `headline_twice` result's A/A pairs (`plans.stock_twice_plan`): each side against its twin,
    with the place each started in (`_started`)."""
    place = _started(res)
    return [(c, place[c["first"]], place[c["second"]]) for c in res["analysis"] if c["second"] == c["first"] + "_b"]


def _apart(c: dict) -> bool:
    return not c["interval"][0] <= 1 <= c["interval"][1]


def twins_rows(runs: list[tuple[Path, dict]]) -> list[dict]:
    """One row per A/A pair of each `headline_twice` result: the file, the batch, the twins with
    the place each started in, the speed-up of the first over its twin and its interval."""
    return [{"run": f"`{f.name}`", "rollouts": c["batch"],
             "twins (started)": f"{c['first']} ({a}) over {c['second']} ({b})",
             "speed-up [95% interval]": interval_text(c["speedup"], c["interval"]), "excludes 1": "yes" if _apart(c) else ""}
            for f, res in runs for c, a, b in _twins(res)]


def twins_sentence(runs: list[tuple[Path, dict]]) -> str:
    """The A/A pairs of `headline_twice` results in one sentence: how many intervals exclude 1, and
    in how many of those the engine started earlier was the slower."""
    twins = [(c, a, b) for _, res in runs for c, a, b in _twins(res)]
    apart = [(c, a, b) for c, a, b in twins if _apart(c)]
    earlier_slower = sum((a < b) == (c["speedup"] < 1) for c, a, b in apart)
    device = and_text(sorted({res["device"] for _, res in runs}))
    model = and_text(sorted({res["preset"] for _, res in runs}))
    text = (f"**Each side against its twin** (the same code and settings in another process, {len(runs)} "
            f"run{'s' if len(runs) > 1 else ''} on {device}, the {model} model): {len(apart)} of {len(twins)} "
            f"intervals exclude 1")
    if not apart:
        return text + "."
    first = sum(1 in (a, b) for _, a, b in apart)
    return text + (f"; in {earlier_slower} of those {len(apart)} the engine started earlier was the slower, and "
                   f"{first} of them hold the engine started first. The process a side runs in, or its place in the "
                   f"start order, moves its speed by more than a pair's interval allows.{_start_order_clause(runs)}")


def _start_order_clause(runs: list[tuple[Path, dict]]) -> str:
    """The port-over-stock pairs of `headline_twice` results split by which of the two engines
    started first: the median speed-up of each group (a clause; empty unless both groups exist)."""
    groups: dict[str, list[float]] = {"the port's": [], "stock's": []}
    for _, res in runs:
        place = _started(res)
        for c in res["analysis"]:
            if c["first"].startswith("port") and c["second"].startswith("stock"):
                port_first = place[c["first"]] < place[c["second"]]
                groups["the port's" if port_first else "stock's"].append(c["speedup"])
    if not all(groups.values()):
        return ""
    return (" The port over stock: " + " and ".join(
        f"{statistics.median(v):.2f}x where {who} engine started first ({len(v)} pairs)" for who, v in groups.items())
        + " (medians).")


def runs_markdown(results_dir: Path | None = None) -> str:
    """docs/benchmarks.md's table of the newest headline's runs of the same port code and setting
    (`records.same_code_runs`): per run its file, commit and speed-up with interval at each batch,
    then the pooled row (`across_runs`) and its sentence."""
    from terra_nb.workbook.results import markdown_table

    f, stock = latest("stock", results_dir)
    runs = same_code_runs(stock, "*_headline_stock.json", f.parent)
    rows = [{"run": f"`{g.name}`", "commit": r["commit"][:7],
             **{rollouts_text(c["batch"]): f"{interval_text(c['speedup'], c['interval'])} ({c['trials']})"
                for c in r["analysis"]}} for g, r in runs]
    pooled = across_runs([r for _, r in runs])
    rows.append({"run": "**pooled**", "commit": "",
                 **{rollouts_text(c["batch"]): f"**{interval_text(c['speedup'], c['interval'])}** ({c['rounds']})"
                    for c in pooled}})
    return "\n\n".join(["The port over stock, run by run (trials a side in brackets; pooled: rounds):",
                         markdown_table(rows), *([across_runs_sentence([r for _, r in runs])] if len(runs) > 1 else []),
                         twins_markdown(f.parent)]).strip()


def twins_markdown(pairs_dir: Path) -> str:
    """Every `*_twice.json` result in `pairs_dir`: one `twins_sentence` a device (a device's twins
    never pool with another's), then the table of every A/A pair (`twins_rows`); empty if none."""
    from terra_nb.workbook.results import markdown_table

    twice = loaded("*_twice.json", pairs_dir)
    devices = sorted({res["device"] for _, res in twice})
    return "\n\n".join([twins_sentence([(g, r) for g, r in twice if r["device"] == d]) for d in devices]
                         + ([markdown_table(twins_rows(twice))] if twice else []))


def provenance(stock: dict, seed: dict) -> str:
    """The measurement's provenance: both files' device, versions and commit (by the table's note
    where they differ), and the method."""
    a, b = provenance_line(stock), provenance_line(seed)
    where = a if a == b else f"{a} (1) and {b} (2)"
    return (f"Measured on {where}, transformers {stock['versions']['transformers']}. Each side "
            f"in its own process, all alive, trials alternated (A B, B A, ...); settings read back from each engine "
            f"and checked equal except what a pair tests (`python -m terra_nb.bench pairs --plan headline_stock` and "
            f"`--plan headline_seed`).")


def headline_markdown(results_dir: Path | None = None) -> str:
    """The README's headline block: the table with its setup notes, the sentences, the provenance,
    the files (linked relative to the repository)."""
    from terra_nb.workbook.paths import REPO

    (fs, stock), (fd, seed) = latest("stock", results_dir), latest("seed", results_dir)
    files = ", ".join(f"[{f.name}]({f.relative_to(REPO)})" for f in (fs, fd))
    runs = [r for _, r in same_code_runs(stock, "*_headline_stock.json", fs.parent)]
    pooled = "" if len(runs) < 2 else (
        f" This run is the newest of {len(runs)} of the same port code and setting; pooled, the port runs at "
        f"{and_text([interval_text(r['speedup'], r['interval']) for r in across_runs(runs)])} "
        f"(every run: [docs/benchmarks.md](docs/benchmarks.md#the-port-against-stock-request-by-request)).")
    return "\n\n".join([headline_table(stock, seed), stock_sentence(stock) + pooled, *seed_sentences(seed),
                        provenance(stock, seed) + f" Files: {files}."])


MM_CALL_COLUMNS = {"encoder_inputs_search": "item search (ms)",
                   "encoder_inputs_release": "item release (ms)",
                   "model_inputs": "model input (ms)"}
"""The calls of vLLM's multimodal path (`step_profile.MM_PATH_CALLS`) the side table shows, in ms a
decode step: the scheduler's search and release of items, the runner's eager model input (its
gather runs inside, so it is not shown again)."""
MM_CALL_WORDS = {"encoder_inputs_search": "the scheduler's search of the action items",
                 "encoder_inputs_release": "its release of them",
                 "model_inputs": "the runner's eager model input"}


def mm_calls_ms(profile: dict) -> float | None:
    """The milliseconds an engine step of a profiled rollout spent in the calls of `MM_CALL_COLUMNS`
    that the profile clocked; None where it clocked none."""
    mm = {k: v for k, v in (profile.get("mm_path_ms") or {}).items() if k in MM_CALL_COLUMNS}
    return round(sum(mm.values()), 4) if mm else None


def mm_path_rows(res: dict) -> tuple[list[dict], list[dict]]:
    """An `mm_path` result (`plans.mm_path_plan`) as two tables: per block and side, the median trial,
    the median decode step, the milliseconds of vLLM's multimodal calls a step (`MM_CALL_COLUMNS`) and
    the overhead a frame of the side's profiled rollout; per block, each pair's speed-up with its interval
    and what it measures (`plans.MM_PATH_PAIRS`)."""
    sides, pairs = [], []
    what = {(a, c): label for a, c, _, label in MM_PATH_PAIRS}
    for b in res["blocks"]:
        for side, trials in b["trials_s"].items():
            prof = (b.get("step_profiles") or {}).get(side, {})
            sides.append({"rollouts": b["batch"], "side": side, "trials": len(trials),
                          "median trial (s)": round(statistics.median(trials), 2) if trials else "none",
                          "decode step (ms)": prof.get("decode_step_ms", "not profiled"),
                          **{col: (prof.get("mm_path_ms") or {}).get(call, "not clocked")
                             for call, col in MM_CALL_COLUMNS.items()},
                          "overhead a frame (ms)": prof.get("overhead_ms", "not profiled")})
    for c in res["analysis"]:
        pairs.append({"rollouts": c["batch"], "measures": what.get((c["first"], c["second"]), ""),
                      "pair": f"{c['first']} over {c['second']}", "trials a side": c["trials"],
                      "speed-up [95% interval]": interval_text(c["speedup"], c["interval"])})
    return sides, pairs


MIN_SENTENCE_TRIALS = 3
"""The fewest trials a side for a pair's interval to be put in a sentence (the tables show every pair)."""


def mm_path_text(name: str, res: dict) -> str:
    """An `mm_path` result file as text: its provenance (with whether its engines had the port's
    scheduler fast path, `scheduler_fast_path`), then both tables of `mm_path_rows`."""
    from terra_nb.workbook.show import text_table

    fast = {s["settings"].get("scheduler_fast_path", False) for s in res["sides"].values()}
    sides, pairs = mm_path_rows(res)
    return (f"{name}: {provenance_line(res)}; {res['preset']} shape; {res['run']}; "
            f"scheduler fast path: {'on' if fast == {True} else 'off'}\n{text_table(sides)}\n{text_table(pairs)}\n")


def mm_path_sentences(res: dict) -> list[str]:
    """An `mm_path` result in one sentence per block of at least `MIN_SENTENCE_TRIALS` trials a side:
    each part of the port's time over stock (`plans.MM_PATH_PAIRS`) with its speed-up and interval,
    on the file's device."""
    by = {(c["batch"], c["first"], c["second"]): interval_text(c["speedup"], c["interval"]) for c in res["analysis"]}
    return [f"- **{res['device']}, {rollouts_text(b)}:** the port's model against stock {by[(b, 'port_text', 'stock')]}; "
            f"vLLM's multimodal path {by[(b, 'port_tokens', 'port_text')]}; the action items "
            f"{by[(b, 'port', 'port_tokens')]}; all together {by[(b, 'port', 'stock')]}."
            for b in sorted({c["batch"] for c in res["analysis"] if c["trials"] >= MIN_SENTENCE_TRIALS})]


def mm_calls_sentences(res: dict) -> list[str]:
    """One sentence per profiled block of an `mm_path` result whose port side clocked vLLM's
    multimodal calls: what each clocked call of `MM_CALL_WORDS` took of the port's decode step,
    beside the step of stock."""
    out = []
    for b in res["blocks"]:
        prof = b.get("step_profiles") or {}
        port, stock = prof.get("port", {}), prof.get("stock", {})
        mm = port.get("mm_path_ms") or {}
        if "encoder_inputs_search" not in mm or not stock:
            continue
        step = port["decode_step_ms"]
        parts = [f"{words} {mm[call]:.3f} ms ({mm[call] / step:.1%})" for call, words in MM_CALL_WORDS.items()
                 if call in mm]
        out.append(f"- **{res['device']}, {rollouts_text(b['batch'])}:** of the port's {step:.2f} ms decode step "
                   f"(stock's: {stock['decode_step_ms']:.2f} ms), {', '.join(parts)}.")
    return out


def profiled_frames_sentences(res: dict) -> list[str]:
    """One sentence per profiled block with a port and a stock side: each side's median frame in the
    profiled rollout with the range of its frames, beside its timed trials' median seconds a frame,
    so a reader sees whether the trials' gap shows frame by frame."""
    out = []
    for b in res["blocks"]:
        prof = b.get("step_profiles") or {}
        if not {"port", "stock"} <= prof.keys():
            continue
        parts = []
        for side in ("port", "stock"):
            walls = [f["wall_ms"] for f in prof[side]["by_frame"]]
            trial = statistics.median(b["trials_s"][side]) / b["frames"] * 1000
            parts.append(f"{WHO[side]}'s {statistics.median(walls):.0f} ms ({min(walls):.0f} to {max(walls):.0f}; "
                         f"{trial:.0f} ms a frame in its timed trials)")
        out.append(f"- **{res['device']}, {rollouts_text(b['batch'])}, {res['n_ctx']} + {b['frames']} frames:** "
                   f"median frame of the profiled rollout: {parts[0]} against {parts[1]}.")
    return out


def trial_medians(block: dict, first: str, second: str) -> tuple[dict, dict, int] | None:
    """The median of each of `step_profile.TRIAL_FIGURES` that every trial holds, over the trials of
    each of two sides of a block whose trials were clocked frame by frame (`trial_steps`), with `decoding_ms`, a
    frame's decode steps at the median step (`codes - 1` of them, as every trial's overhead counts
    them), and the fewer trials of the two; None where either side has none. Medians do not add
    up: a frame's median is not its median decode steps plus its median overhead."""
    steps = block.get("trial_steps") or {}
    runs = {s: [t for t in steps.get(s, []) if t] for s in (first, second)}
    if not all(runs.values()):
        return None
    one = runs[first][0]
    per_frame = round((one["wall_ms"] - one["overhead_ms"]) / one["decode_step_ms"])
    med = {s: {k: statistics.median(t[k] for t in ts) for k in TRIAL_FIGURES if all(k in t for t in ts)}
           for s, ts in runs.items()}
    for m in med.values():
        m["decoding_ms"] = per_frame * m["decode_step_ms"]
    return med[first], med[second], min(len(ts) for ts in runs.values())


def trial_steps_sentences(res: dict, first: str = "port", second: str = "stock") -> list[str]:
    """One sentence per block whose trials were clocked frame by frame (`trial_steps`) on both
    sides: the two sides' median frame over their trials, split into its decode steps (`codes - 1`
    of them) and the rest of the frame (its overhead), so a gap reads as per step or per frame."""
    out = []
    for b in res["blocks"]:
        got = trial_medians(b, first, second)
        if got is None:
            continue
        a, c, n = got
        decoding = a["decoding_ms"] - c["decoding_ms"]
        out.append(f"- **{rollouts_text(b['batch'])}** ({n} trials a side, medians): a frame took {a['wall_ms']:.0f} ms "
                   f"against {c['wall_ms']:.0f} ({a['wall_ms'] - c['wall_ms']:+.0f} ms); its decode steps "
                   f"{a['decode_step_ms']:.3f} against {c['decode_step_ms']:.3f} ms "
                   f"({decoding:+.0f} ms a frame), the rest of the frame "
                   f"{a['overhead_ms']:.0f} against {c['overhead_ms']:.0f} ms ({a['overhead_ms'] - c['overhead_ms']:+.0f} ms).")
    return out


def gap_rows(stock: dict, steps: dict) -> list[dict]:
    """The headline's gap (`stock`: a port-vs-stock result whose trials were clocked frame by frame)
    beside what a profiled rollout of the same commit on the same device (`steps`: an `mm_path_steps`
    result) clocked, per batch both hold, in milliseconds a frame:

    * the port's median frame over stock's, split into its decode steps and the rest (`trial_medians`);
    * vLLM's multimodal calls in the port's decode steps (`mm_calls_ms` times `codes - 1`), which
      stock's steps do not make;
    * the profiled front end (`wall - engine` of a frame: the requests processed and added), the
      port's less stock's;
    * where the trials clocked them (`step_profile.TRIAL_FIGURES`), the rest split into the front
      end and the engine's other steps (the frame's prefill steps and the decode steps' spread),
      beside vLLM's multimodal calls in the port's prefill steps (`mm_path_prefill_ms`), which
      stock's do not make either; "not clocked" where a file predates these clocks.
    """
    if (stock.get("commit"), stock.get("device")) != (steps.get("commit"), steps.get("device")):
        raise ValueError(f"not one run: the headline ran commit {str(stock.get('commit'))[:7]} on {stock.get('device')}, "
                         f"the profile {str(steps.get('commit'))[:7]} on {steps.get('device')}")
    profiles = {b["batch"]: b.get("step_profiles") or {} for b in steps["blocks"]}
    rows = []
    for b in stock["blocks"]:
        got, prof = trial_medians(b, "port", "stock"), profiles.get(b["batch"], {})
        calls = mm_calls_ms(prof.get("port", {}))
        if got is None or calls is None or "stock" not in prof:
            continue
        a, c, n = got
        rest = {part: round(a[k] - c[k]) if k in a and k in c else NOT_CLOCKED for part, k in REST_PARTS.items()}
        prefill = {k: v for k, v in (prof["port"].get("mm_path_prefill_ms") or {}).items() if k in MM_CALL_COLUMNS}
        rows.append({"rollouts": b["batch"], "trials a side": n,
                     "port - stock, a frame": round(a["wall_ms"] - c["wall_ms"]),
                     "in decode steps": round(a["decoding_ms"] - c["decoding_ms"]),
                     "in the rest": round(a["overhead_ms"] - c["overhead_ms"]), **rest,
                     "vLLM's multimodal calls (port's steps)": round(calls * (prof["port"]["codes_per_frame"] - 1)),
                     PREFILL_CALLS: round(sum(prefill.values())) if prefill else NOT_CLOCKED,
                     "front end, port - stock (profiled)": round(prof["port"]["front_end_ms"] - prof["stock"]["front_end_ms"])})
    return rows


NOT_CLOCKED = "not clocked"
REST_PARTS = {"rest: front end": "front_end_ms", "rest: other steps": "other_steps_ms"}
"""`gap_rows`' split of the rest of a frame: its column -> the trial figure it compares."""
PREFILL_CALLS = "vLLM's multimodal calls (port's prefill steps)"


def gap_clause(rows: list[dict]) -> str | None:
    """`gap_rows` in one clause for the README's answer: where the port's decode steps were slower
    than stock's, whether the extra lies within vLLM's multimodal calls in them; None where they
    were nowhere slower."""
    slower = [r for r in rows if r["in decode steps"] > 0]
    if not slower:
        return None
    within = all(r["in decode steps"] <= r["vLLM's multimodal calls (port's steps)"] for r in slower)
    extra = and_text([str(r["in decode steps"]) for r in slower])
    calls = and_text([str(r["vLLM's multimodal calls (port's steps)"]) for r in slower])
    return (f"at {rollouts_list_text([r['rollouts'] for r in slower])} its decode steps took {extra} ms a frame more "
            f"than stock's, {'within' if within else 'not all within'} the {calls} ms of the multimodal calls vLLM "
            f"makes in them (a profile of the same run)")


def gap_sentences(stock: dict, steps: dict) -> list[str]:
    """`gap_rows` in one sentence per batch: whether the port's extra time in its decode steps lies
    within the multimodal calls vLLM makes in them, and what the rest of the frame adds."""
    out = []
    for r in gap_rows(stock, steps):
        steps_ms, calls, rest = r["in decode steps"], r["vLLM's multimodal calls (port's steps)"], r["in the rest"]
        if steps_ms <= 0:
            verdict = f"the port's decode steps took {-steps_ms} ms a frame less than stock's"
        elif steps_ms <= calls:
            verdict = (f"the port's decode steps took {steps_ms} ms a frame more than stock's, within the "
                       f"{calls} ms of vLLM's multimodal calls in them")
        else:
            verdict = (f"the port's decode steps took {steps_ms} ms a frame more than stock's, "
                       f"{steps_ms - calls} ms beyond the {calls} ms of vLLM's multimodal calls in them")
        out.append(f"- **{rollouts_text(r['rollouts'])}:** {verdict}; the rest of the frame {rest:+d} ms"
                   f"{_rest_split(r)} (the profiled front end {r['front end, port - stock (profiled)']:+d} ms).")
    return out


def _rest_split(row: dict) -> str:
    """The clause of `gap_sentences` that splits a row's rest of the frame, where it was clocked."""
    front, other, calls = row["rest: front end"], row["rest: other steps"], row[PREFILL_CALLS]
    if NOT_CLOCKED in (front, other):
        return ""
    text = f": its front end {front:+d} ms, the engine's other steps {other:+d} ms"
    if calls == NOT_CLOCKED or other <= 0:
        return text
    return text + (f", within the {calls} ms of vLLM's multimodal calls in the port's prefill steps" if other <= calls
                   else f", {other - calls} ms beyond the {calls} ms of vLLM's multimodal calls in the port's prefill steps")


def clocked_columns(rows: list[dict]) -> list[dict]:
    """`rows` without the columns no row clocked (`NOT_CLOCKED` in every row)."""
    drop = {k for k in (rows[0] if rows else {}) if all(r[k] == NOT_CLOCKED for r in rows)}
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


def gap_markdown(results_dir: Path | None = None) -> str:
    """docs/benchmarks.md's account of the port's time over stock: the newest headline that a
    profile of the same run accompanies, its gap per frame split by `gap_rows` (a Markdown table and
    `gap_sentences`), and the newest front-end record that clocked the port's own code
    (`profiling.port_code_sentence`)."""
    from terra_nb.bench.profiling import port_code_sentence
    from terra_nb.bench.records import newest, of_same_run
    from terra_nb.workbook.paths import RESULTS
    from terra_nb.workbook.results import markdown_table

    pairs_dir, out = Path(results_dir or RESULTS) / "pairs", []
    runs = loaded("*_headline_stock.json", pairs_dir)
    runs = [(f, r, of_same_run("*_mm_path_steps.json", r, pairs_dir)) for f, r in runs]
    runs = [run for run in runs if run[2]]
    if runs:
        f, stock, (pf, profile) = newest(runs)
        out += [f"`{f.name}` and, right after it on the same machine, `{pf.name}` ({provenance_line(stock)}); "
                "milliseconds a frame, port minus stock (medians of each part, so the parts need not add up):",
                markdown_table(clocked_columns(gap_rows(stock, profile))), "\n".join(gap_sentences(stock, profile))]
    fronts = loaded("*_front_end.json", Path(results_dir or RESULTS) / "frontend")
    said = [(f, r, port_code_sentence(r, "port")) for f, r in fronts if {"port", "stock"} <= r["sides"].keys()]
    said = [(f, r, s) for f, r, s in said if s]
    if said:
        f, record, sentence = newest(said)
        out.append(f"{sentence} (`{f.name}`: {provenance_line(record)})")
    return "\n\n".join(out) or "No headline with a profile of its run, and no front-end record of the port's own code, yet."


# ------------------------------------------------------------------ the headline and its split, one run

SPLIT_PARTS = tuple((a, c, label.split(" (")[0]) for a, c, _, label in MM_PATH_PAIRS if (a, c) != ("port", "stock"))
"""The three parts of the port's time over stock (`plans.MM_PATH_PAIRS` less the whole): (first,
second, what the pair measures), from stock up to the port."""


def _pairs_by(res: dict) -> dict[tuple[int, str, str], dict]:
    """A result's pairs by (batch, first side, second side)."""
    return {(c["batch"], c["first"], c["second"]): c for c in res["analysis"]}


def _frame_ms(block: dict) -> dict[str, float]:
    """Each side's median frame over its trials in a block, in milliseconds."""
    return {s: 1000 * statistics.median(t) / block["frames"] for s, t in block["trials_s"].items()}


def _parts_ms(block: dict) -> tuple[float, dict[str, float]]:
    """A block's port-minus-stock milliseconds a frame and each part's of `SPLIT_PARTS` (differences of
    the sides' median frames, `_frame_ms`: the parts add up to the whole)."""
    frame = _frame_ms(block)
    return frame["port"] - frame["stock"], {label: frame[a] - frame[c] for a, c, label in SPLIT_PARTS}


def split_rows(res: dict) -> list[dict]:
    """A `headline_mm_path` result per batch: the port over stock with its verdict, then each part of
    `SPLIT_PARTS` with its speed-up and its milliseconds a frame (differences of the two sides'
    median frames over their trials, so the parts add up to the port's milliseconds over stock)."""
    by = _pairs_by(res)
    rows = []
    for b in res["blocks"]:
        gap, ms = _parts_ms(b)
        whole = by[(b["batch"], "port", "stock")]
        row = {"rollouts": b["batch"], "trials a side": whole["trials"],
               "port over stock": f"{interval_text(whole['speedup'], whole['interval'])}, {whole['verdict']}",
               "port - stock (ms a frame)": f"{gap:+.0f}"}
        for a, c, label in SPLIT_PARTS:
            part = by[(b["batch"], a, c)]
            row[label] = f"{interval_text(part['speedup'], part['interval'])}, {ms[label]:+.0f} ms"
        rows.append(row)
    return rows


def split_step_rows(res: dict) -> list[dict]:
    """Per batch of a `headline_mm_path` result: each side's median decode step over its trials
    (`trial_steps`), and what the runner's eager model input took of a step in the port's profiled
    rollout (vLLM's multimodal path: a text-only engine does not make that call)."""
    rows = []
    for b in res["blocks"]:
        steps = b.get("trial_steps") or {}
        row = {"rollouts": b["batch"]}
        for side in b["trials_s"]:
            row[f"{side} (ms)"] = f"{statistics.median(t['decode_step_ms'] for t in steps[side]):.3f}" if steps.get(side) else NOT_CLOCKED
        mm = ((b.get("step_profiles") or {}).get("port") or {}).get("mm_path_ms") or {}
        row["vLLM's eager model input, port (ms, profiled)"] = f"{mm['model_inputs']:.3f}" if "model_inputs" in mm else NOT_CLOCKED
        rows.append(row)
    return rows


def gap_and_mm_calls(res: dict) -> list[dict]:
    """Per batch of a `headline_mm_path` result: the port's milliseconds a frame over stock, from its
    speed-up and interval (`gap_ms`, `gap_range_ms`: stock's median frame times 1/speed-up - 1), beside
    what vLLM's multimodal calls (`mm_calls_ms`) took a frame in the port's profiled rollout
    (`mm_calls_frame_ms`: calls stock's engine does not make, and every multimodal model's does)."""
    by = _pairs_by(res)
    out = []
    for b in res["blocks"]:
        stock = _frame_ms(b)["stock"]
        c = by[(b["batch"], "port", "stock")]
        gap = lambda s: stock * (1 / s - 1)   # noqa: E731  (speed-up = stock's time / the port's)
        prof = (b.get("step_profiles") or {}).get("port") or {}
        per_step = mm_calls_ms(prof)
        out.append(dict(batch=b["batch"], gap_ms=gap(c["speedup"]),
                        gap_range_ms=(gap(c["interval"][1]), gap(c["interval"][0])),
                        mm_calls_frame_ms=None if per_step is None else per_step * prof["engine_steps"]))
    return out


def gap_and_mm_calls_sentences(res: dict) -> list[str]:
    """`gap_and_mm_calls` in one sentence a batch."""
    out = []
    for g in gap_and_mm_calls(res):
        lo, hi = g["gap_range_ms"]
        mm = g["mm_calls_frame_ms"]
        tail = ("; vLLM's multimodal calls were not clocked" if mm is None else
                f"; vLLM's multimodal calls in the port's engine steps took {mm:.0f} ms a frame "
                f"({'at least' if mm >= g['gap_ms'] else 'less than'} the gap)")
        out.append(f"- **{rollouts_text(g['batch'])}:** the port's frame took {g['gap_ms']:+.0f} ms against stock's "
                   f"({lo:+.0f} to {hi:+.0f} by the interval){tail}.")
    return out


def split_sentences(res: dict) -> list[str]:
    """What one `headline_mm_path` run says, per batch: the parts whose interval lies wholly below
    or above 1 (the rest are within the trials' noise), and the largest part in milliseconds."""
    by = _pairs_by(res)
    out = []
    for b in res["blocks"]:
        gap, ms = _parts_ms(b)
        slower = [label for a, c, label in SPLIT_PARTS if by[(b["batch"], a, c)]["interval"][1] < 1]
        faster = [label for a, c, label in SPLIT_PARTS if by[(b["batch"], a, c)]["interval"][0] > 1]
        resolved = (f"{and_text(slower)} measurably slower" if slower else "no part measurably slower")
        if faster:
            resolved += f", {and_text(faster)} measurably faster"
        largest = max(ms, key=lambda k: ms[k])
        out.append(f"- **{rollouts_text(b['batch'])}:** {resolved}; the largest part, {largest}, "
                   f"{ms[largest]:+.0f} ms of the port's {gap:+.0f} ms a frame over stock.")
    return out


def split_clause(res: dict) -> str:
    """One `headline_mm_path` run in a clause for the README's answer: the port over stock at each
    batch, and its milliseconds a frame over stock beside those of vLLM's multimodal calls in its
    engine steps (`gap_and_mm_calls`)."""
    by = _pairs_by(res)
    rows = gap_and_mm_calls(res)
    wholes = [by[(r["batch"], "port", "stock")] for r in rows]
    whole = and_text([interval_text(c["speedup"], c["interval"]) for c in wholes])
    calls = ("" if any(r["mm_calls_frame_ms"] is None for r in rows) else
             f"; there vLLM's multimodal calls, which stock's engine never makes, took "
             f"{and_text([format(r['mm_calls_frame_ms'], '.0f') for r in rows])} ms a frame of the port's engine steps, "
             f"against its {and_text([format(r['gap_ms'], '+.0f') for r in rows])} ms a frame over stock")
    return (f"one run that also splits the port's time ({res['device']}, commit {res['commit'][:7]}, shorter videos) "
            f"gave {whole}{calls} ([the split](docs/benchmarks.md#the-port-against-stock-request-by-request))")


def split_markdown(results_dir: Path | None = None) -> str:
    """docs/benchmarks.md's section on the newest `headline_mm_path` result: the port against stock
    and where its time goes, from one run (`split_rows`, `split_step_rows`, `split_sentences`)."""
    from terra_nb.workbook.paths import RESULTS
    from terra_nb.workbook.results import markdown_table

    f, res = latest_file("*_headline_mm_path.json", results_dir or RESULTS / "pairs",
                         "run `python -m terra_nb.bench pairs --plan headline_mm_path` on a GPU first")
    b = res["blocks"][0]
    return "\n\n".join([
        f"`{f.name}` ({provenance_line(res)}; {res['preset'].capitalize()}'s shape, {res['n_ctx']} context frames, "
        f"then {and_text([str(x['frames']) for x in res['blocks']])} frames at "
        f"{rollouts_list_text([x['batch'] for x in res['blocks']])}; sides started in the order "
        f"{', '.join(s['name'] for s in res['plan']['sides'])}). Speed-ups [95% intervals], and each part's "
        f"milliseconds a frame:",
        markdown_table(split_rows(res)), "\n".join(split_sentences(res)),
        f"Decode steps, the median over each side's trials ({b['trials']} a side):",
        markdown_table(split_step_rows(res)),
        "The port's time a frame over stock's, beside the time of vLLM's multimodal calls a frame in the port's "
        "profiled rollout (the scheduler's search and release of items, the runner's eager model input):",
        "\n".join(gap_and_mm_calls_sentences(res))])
