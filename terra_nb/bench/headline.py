"""The benchmark's answer, rendered from the committed result files (`results/pairs/`), never typed in.

- **The port against stock vLLM Llama**: the newest `headline_stock` run with every committed run of
  its setting and port code (`records.same_code_runs`), pooled round by round (`pooled`), said in
  words by one function, `stock_verdict`, wherever it appears (README, docs/benchmarks.md, notebook 07).
- **The port against HF**, in the seed's setting and with today's defaults (`headline_seed`).
- **Where the port's time over stock goes**: one run that timed both and profiled vLLM's multimodal
  calls in the port's engine steps (`*_headline_mm_path.json`, `gap_rows`).

Each `*_markdown` function is a generated section of the README or docs/ (`bench/docs.py`).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from terra_nb.bench.records import block, latest as latest_file, loaded, provenance, same_code_runs
from terra_nb.bench.stats import (MET, MISSED, and_text, beside_one, interval_text, rollouts_list_text, rollouts_text,
                                  rounds_speedup, runs_interval, verdict)
from terra_nb.bench.workload import SEED_FIGURES

STOCK_DOCS, SEED_DOCS = "docs/benchmarks.md#the-port-against-stock-vllm", "docs/benchmarks.md#the-port-against-hf"


def pairs_dir(results_dir: Path | None = None) -> Path:
    from terra_nb.workbook.paths import RESULTS

    return Path(results_dir or RESULTS / "pairs")


def latest(kind: str, results_dir: Path | None = None) -> tuple[Path, dict]:
    """The newest `*_headline_<kind>.json` (`stock`, `seed`, `mm_path`) under results/pairs/."""
    return latest_file(f"*_headline_{kind}.json", pairs_dir(results_dir), "run its plan on a GPU first")


def s_per_frame(res: dict, block_name: str, side: str) -> float:
    """A side's median seconds per frame in a block (each frame of all rollouts at once)."""
    b = block(res, block_name)
    return statistics.median(b["trials_s"][side]) / b["frames"]


# ------------------------------------------------------------------ the port against stock

def pooled(results_dir: Path | None = None) -> tuple[list[tuple[Path, dict]], list[dict]]:
    """The newest `headline_stock` run with every committed run of its setting and port code (oldest
    first), and per batch their rounds pooled (`across_runs`)."""
    f, newest = latest("stock", results_dir)
    runs = same_code_runs(newest, "*_headline_stock.json", f.parent)
    return runs, across_runs([r for _, r in runs])


def across_runs(runs: list[dict]) -> list[dict]:
    """Port-vs-stock runs of one setting, per batch: each run's and all rounds' median round ratio
    (`stats.rounds_speedup`), its interval over runs, then rounds (`stats.runs_interval`), and its
    verdict against the newest run's target."""
    out = []
    for i, b in enumerate(runs[-1]["blocks"]):
        per = []
        for r in runs:
            port, stock = r["blocks"][i]["trials_s"]["port"], r["blocks"][i]["trials_s"]["stock"]
            n = min(len(port), len(stock))   # a deadline may cut a round short
            per.append((port[:n], stock[:n]))
        target = next(c["target"] for c in runs[-1]["analysis"] if c["batch"] == b["batch"])
        interval = [round(x, 4) for x in runs_interval(per)]
        out.append(dict(batch=b["batch"], frames=b["frames"], trials=sum(len(a) for a, _ in per),
                        per_run=[round(rounds_speedup([p]), 4) for p in per], speedup=round(rounds_speedup(per), 4),
                        interval=interval, target=target, verdict=verdict(interval, target) if target else None))
    return out


def stock_verdict(rows: list[dict], runs: list[dict]) -> str:
    """The port against stock in words: about as fast where every interval holds 1; the batches
    measurably slower or faster (the interval clear of 1, `stats.beside_one`) and those possibly
    slower (the interval holds 1 but the median round misses the batch's target), each by how much."""
    side = {r["batch"]: beside_one(r["interval"]) for r in rows}
    slower, faster = [r for r in rows if side[r["batch"]] < 0], [r for r in rows if side[r["batch"]] > 0]
    possibly = [r for r in rows if not side[r["batch"]] and r["target"] and r["speedup"] < r["target"]]
    lead = ("about as fast" if not slower and not faster else "slower" if not faster else "faster" if not slower
            else "faster at some batches and slower at others")
    said = [f"{'only ' if len(rs) < len(rows) else ''}{rollouts_list_text([r['batch'] for r in rs])} "
            f"{'is' if len(rs) == 1 else 'are'} {what} ({and_text(['~' + format(abs(1 - r['speedup']), '.0%') for r in rs])})"
            for rs, what in ((slower, "measurably slower"), (faster, "measurably faster"), (possibly, "possibly slower"))
            if rs]
    device = and_text(sorted({r["device"].removeprefix("NVIDIA ") for r in runs}))
    return (f"{lead}. The port runs at {and_text([format(r['speedup'], '.2f') + 'x' for r in rows])} stock's speed "
            f"at {rollouts_list_text([r['batch'] for r in rows])} "
            f"({f'{len(runs)} {device} runs pooled' if len(runs) > 1 else f'1 {device} run'})"
            + "".join(f"; {s}" for s in said) + ".")


def stock_markdown(results_dir: Path | None = None) -> str:
    """docs/benchmarks.md's port against stock: the verdict, every committed port-vs-stock run
    (speed-up [interval] (trials a side) at each batch), which are pooled, and the pooled row."""
    from terra_nb.workbook.results import markdown_table

    runs, rows = pooled(results_dir)
    every = sorted(loaded("*_headline_stock.json", pairs_dir(results_dir))
                   + loaded("*_port_vs_stock.json", pairs_dir(results_dir)), key=lambda fr: fr[1]["date"])
    table = [{"run": f"`{f.name}`", "machine": str(r["run"]).split(":")[0], "commit": r["commit"][:7],
              **{rollouts_text(c["batch"]): f"{interval_text(c['speedup'], c['interval'])} ({c['trials']})"
                 for c in r["analysis"]}, "pooled": "yes" if f in [g for g, _ in runs] else ""} for f, r in every]
    table.append({"run": "**pooled**", "machine": "", "commit": "", "pooled": "", **{
        rollouts_text(r["batch"]): f"**{interval_text(r['speedup'], r['interval'])}** ({r['trials']})" for r in rows}})
    return "\n\n".join([
        f"**The port against stock vLLM:** {stock_verdict(rows, [r for _, r in runs])}",
        "Every committed run, oldest first: the port's speed-up [95% interval] (trials a side). Pooled: the runs of "
        "the newest run's machine and work whose commits hold the same `terra_nb/port`; the others ran beside other "
        "plans or on another GPU.",
        markdown_table(table)])


# ------------------------------------------------------------------ the port against HF

def _seed_pairs(seed: dict) -> tuple[dict, dict]:
    by = {c["name"]: c for c in seed["analysis"]}
    return by["port_seed_vs_hf"], by["port_defaults_vs_hf"]


def _graphs_share(seed: dict) -> float:
    """The share of the eager port's time a frame that CUDA graphs remove (the seed block's medians)."""
    return 1 - s_per_frame(seed, "seed", "port_defaults") / s_per_frame(seed, "seed", "port_seed")


def seed_markdown(results_dir: Path | None = None) -> str:
    """docs/benchmarks.md's port against HF: each side's seconds a frame beside the seed's."""
    f, seed = latest("seed", results_dir)
    (eager, defaults), frame = _seed_pairs(seed), {s: s_per_frame(seed, "seed", s) for s in ("hf", "port_seed", "port_defaults")}
    return (f"`{f.name}` ({provenance(seed)}), {block(seed, 'seed')['frames']} frames after {seed['n_ctx']}, "
            f"{eager['trials']} trials a side: HF took {frame['hf']:.2f} s a frame (the seed's "
            f"{max(SEED_FIGURES.values()):.2f} s), the port run as the seed ran vLLM 0.6 {frame['port_seed']:.2f} s (the "
            f"seed's {min(SEED_FIGURES.values()):.2f} s): {interval_text(eager['speedup'], eager['interval'])}, against "
            f"the seed's {eager['target']:.1f}x. With CUDA graphs the same port took {frame['port_defaults']:.2f} s a "
            f"frame ({interval_text(defaults['speedup'], defaults['interval'])}): {_graphs_share(seed):.0%} of the eager "
            "port's time is launching kernels from Python, step by step. At one video the seed's ratio compares two "
            "loops bound by the host's CPU: it moves with the host and the library versions.")


# ------------------------------------------------------------------ the README

def answer_markdown(results_dir: Path | None = None) -> str:
    """The README's answer: three bullets, the details one link away."""
    runs, rows = pooled(results_dir)
    eager, defaults = _seed_pairs(seed := latest("seed", results_dir)[1])
    above = {MET: "above", MISSED: "below"}.get(defaults["verdict"], "not resolved against")
    reproduced = {MET: "reproduced", MISSED: "not reproduced"}.get(eager["verdict"], "not resolved")
    return "\n".join([
        f"- **Against stock vLLM** (its own Llama, same shape): {stock_verdict(rows, [r for _, r in runs])} "
        f"[Run by run]({STOCK_DOCS}).",
        f"- **Against HF Transformers**, with vLLM's defaults (CUDA graphs, prefix caching): "
        f"{defaults['speedup']:.2f}x HF's speed on one video, {above} the seed's {eager['target']:.1f}x.",
        f"- **The seed's {eager['target']:.1f}x** in its own setting (vLLM run eagerly, no prefix caching): "
        f"{eager['speedup']:.2f}x here, {reproduced}. At one video both sides wait on Python, not the GPU "
        f"({_graphs_share(seed):.0%} of the eager port's time is what CUDA graphs remove), so this ratio moves with "
        f"the host. [Why]({SEED_DOCS})."])


def _asked(side: dict) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in side["asked"].items()) or "none (vLLM's defaults)"


def headline_rows(results_dir: Path | None = None) -> list[dict]:
    """The headline table's rows: the port against stock pooled at each batch (note 1), then the
    port against HF in the seed's setting and with today's defaults (note 2)."""
    runs, rows = pooled(results_dir)
    seed = latest("seed", results_dir)[1]
    out = [dict(r, comparison="the port vs stock vLLM Llama (1)",
                work=f"{rollouts_text(r['batch'])}, {runs[-1][1]['n_ctx']} + {r['frames']} frames") for r in rows]
    return out + [dict(c, comparison=f"{who} vs HF Transformers (2)",
                       work=f"1 rollout, {seed['n_ctx']} + {c['frames']} frames")
                  for c, who in zip(_seed_pairs(seed), ("the port as the seed ran vLLM", "the port with today's defaults"))]


def headline_markdown(results_dir: Path | None = None) -> str:
    """The README's headline block: the table, each row's setup in a note under it, the files."""
    from terra_nb.workbook.paths import REPO

    runs, _ = pooled(results_dir)
    fd, seed = latest("seed", results_dir)
    stock, hf = runs[-1][1], seed["sides"]["hf"]
    temps = lambda res: " and ".join(sorted({str(b["temperature"]) for b in res["blocks"]}))  # noqa: E731
    table = ["| comparison (speed-up of the first over the second) | work per trial | trials a side | speed-up [95% "
             "interval] | target: verdict |", "|---|---|---|---|---|"] + [
        f"| {r['comparison']} | {r['work']} | {r['trials']} | **{r['speedup']:.2f}x** [{r['interval'][0]:.2f}, "
        f"{r['interval'][1]:.2f}] | at least {r['target']:.2f}x: {r['verdict']} |" for r in headline_rows(results_dir)]
    return "\n\n".join(["\n".join(table),
        f"(1) {len(runs)} runs pooled ({stock['device']}, vLLM {stock['versions']['vllm']}, commits "
        f"{and_text([r['commit'][:7] for _, r in runs])}, the same port code; [run by run]({STOCK_DOCS})): the median "
        f"ratio of two trials run back to back, its interval drawn over runs, then trials. Both engines on the same {stock['dtype']} "
        f"Terra-shaped random weights, temperature {temps(stock)}, the same engine arguments "
        f"({_asked(stock['sides']['port'])}); stock vLLM Llama is the same backbone without the action inputs and the "
        "learned position table. A frame step is one frame of every rollout at once.",
        f"(2) The seed's setting ({provenance(seed)}): one video, one `generate` call per frame, temperature "
        f"{temps(seed)}, {seed['n_ctx']} + {block(seed, 'seed')['frames']} frames (the seed's video had 22). HF "
        f"Transformers' attention limited to {', '.join(hf['sdpa'] or ['any kernel'])} (cuDNN's kernel rebuilds a "
        f"plan at every new length); the port as the seed ran vLLM 0.6: {_asked(seed['sides']['port_seed'])}; the "
        f"port with today's defaults: {_asked(seed['sides']['port_defaults'])}.",
        "Each side in its own process, all alive, trials alternating (A B, B A, ...); settings read back "
        "from each engine and checked equal except what a pair tests (`python -m terra_nb.bench pairs --plan "
        "headline_stock` and `--plan headline_seed`). Files: "
        + ", ".join(f"[{f.name}]({f.relative_to(REPO)})" for f in [f for f, _ in runs] + [fd]) + "."])


# ------------------------------------------------------------------ where the port's time over stock goes

MM_CALLS = ("encoder_inputs_search", "encoder_inputs_release", "model_inputs")
"""vLLM's multimodal calls in an engine step (of the profile's `mm_path_ms`) that stock's engine never
makes: the scheduler's search and release of a request's items, the runner's eager model input (its
gather of the items' embeddings runs inside it, so it is not added again)."""


def gap_rows(res: dict) -> list[dict]:
    """Per batch of a `headline_mm_path` result: the port's speed-up over stock and its interval, the
    port's milliseconds a frame over stock (`gap_ms`: stock's median frame times 1/speed-up - 1;
    `gap_range_ms`: the same at the interval's ends), and vLLM's multimodal calls a frame in the
    port's profiled rollout (`calls_ms`: `MM_CALLS`' ms a step times its engine steps a frame)."""
    by = {(c["batch"], c["first"], c["second"]): c for c in res["analysis"]}
    out = []
    for b in res["blocks"]:
        c, prof = by[(b["batch"], "port", "stock")], b["step_profiles"]["port"]
        gap = lambda s: 1000 * statistics.median(b["trials_s"]["stock"]) / b["frames"] * (1 / s - 1)  # noqa: E731
        out.append(dict(rollouts=b["batch"], trials=c["trials"], speedup=c["speedup"], interval=c["interval"],
                        gap_ms=gap(c["speedup"]), gap_range_ms=(gap(c["interval"][1]), gap(c["interval"][0])),
                        calls_ms=sum(v for k, v in prof["mm_path_ms"].items() if k in MM_CALLS) * prof["engine_steps"]))
    return out


def gap_markdown(results_dir: Path | None = None) -> str:
    """docs/benchmarks.md's (and notebook 07's) account of the gap: the file and its machine, the
    table of `gap_rows`, and at which batches vLLM's multimodal calls took at least all of it."""
    from terra_nb.workbook.results import markdown_table

    f, res = latest("mm_path", results_dir)
    rows = gap_rows(res)
    whole = [r["rollouts"] for r in rows if r["calls_ms"] >= r["gap_ms"]]
    said = ([f"at {rollouts_list_text(whole)} they took at least all of it"] if whole else []) + [
        f"at {rollouts_text(r['rollouts'])} {r['calls_ms']:.0f} of its {r['gap_ms']:.0f} ms" for r in rows
        if r["rollouts"] not in whole]
    return "\n\n".join([
        f"`{f.name}` ({provenance(res)}; {res['n_ctx']} context frames, then "
        f"{and_text([str(b['frames']) for b in res['blocks']])} frames at "
        f"{rollouts_list_text([b['batch'] for b in res['blocks']])}):",
        markdown_table([{"rollouts": r["rollouts"], "trials a side": r["trials"],
                         "port over stock": interval_text(r["speedup"], r["interval"]),
                         "port - stock (ms a frame)": "{:+.0f} [{:+.0f}, {:+.0f}]".format(r["gap_ms"], *r["gap_range_ms"]),
                         "vLLM's multimodal calls (ms a frame)": round(r["calls_ms"])} for r in rows]),
        "vLLM's multimodal calls in the port's engine steps, which stock's engine never makes and every multimodal "
        f"model's does, against the port's time over stock: {'; '.join(said)}."])


def hf_probe_markdown(path: Path | None = None) -> str:
    """HF's one-off cost per new key length under cuDNN's attention, with the machine it was seen on."""
    from terra_nb.workbook.paths import RESULTS

    p = json.loads(Path(path or RESULTS / "hf_probe_h200.json").read_text())["probe"]
    s = p["settings"]["default"]
    return (f"On {p['device']} (torch {p['torch']}, cuDNN {p['cudnn']}), with SDPA free to choose cuDNN's attention "
            f"(torch's default there), HF's decode step at a key length new to the process took "
            f"{s['cold_ms_median']:.1f} ms and at a length seen before {s['warm_ms_median']:.1f} ms "
            f"({s['cold_over_warm']:.1f}x, medians of {p['steps']} steps; `results/hf_probe_h200.json`, "
            "`python3 tools/hf_probe.py`). A first video pays that at every step: a cold HF run looks "
            "slower than a warm one. The headline's HF side therefore runs with cuDNN's attention ruled out.")
