"""The benchmark's results: merging parts into one file, the Markdown table, the README section.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from terra_nb.bench.workload import PREFILL, SEED_FIGURES, SEED_ROWS, row_batch, row_engine, tp_row, tp_row_parts


def merge(parts: list[dict]) -> dict:
    """One results file from the parts of one lease; each row says which call measured it."""
    env = parts[0]["env"]
    rows, errors = [], []
    for i, p in enumerate(parts):
        errors += [dict(e, part=i) for e in p.get("errors", [])]
        for r in p["rows"]:
            rows.append(dict(r, part=i, command=p["command"]))
    by = {r["name"]: r for r in rows}
    speedup = by["hf"]["s_per_frame"] / by["vllm"]["s_per_frame"] if {"hf", "vllm"} <= by.keys() else None
    hit = by["vllm"].get("prefix_cache_hit_rate") if "vllm" in by else None
    return dict(
        device=env["device"],
        versions={k: env[k] for k in ("vllm", "torch", "transformers", "python")},
        dtype=parts[0]["dtype"],
        workload=parts[0]["workload"],
        command=[p["command"] for p in parts],
        date=env["date"],
        env=env,
        rows=rows,
        errors=errors,
        speedup_vs_hf=speedup,
        prefix_cache_hit_rate=hit,
        # what each divides: RATIOS (the first, speedup_vs_hf, is the key above)
        ratios={r.name: r.value(by) for r in RATIOS[1:]},
        commit=env.get("git_commit"),   # the code that ran; a results file holds one commit and one lease
        lease=None,                      # set when committing: which machine lease measured the parts
        curve=with_floor(throughput_curve(rows), parts[0]["workload"], env["device"]),
        profile=profile_digest({p["profile"]["engine"]: p["profile"] for p in parts if "profile" in p}),
        step_profiles=step_digest(rows),
    )


@dataclasses.dataclass(frozen=True)
class Ratio:
    """One ratio of two rows of one lease: `numerator`'s `quantity` over `denominator`'s."""
    name: str
    numerator: str     # row names
    denominator: str
    quantity: str      # the row key divided: "s_per_frame", "frames_per_s" or "prefill_tokens_per_s"

    def value(self, by: dict[str, dict]) -> float | None:
        """The ratio among `by` (one lease's rows by name), or None unless both rows are there."""
        if {self.numerator, self.denominator} <= by.keys():
            return by[self.numerator][self.quantity] / by[self.denominator][self.quantity]
        return None

    def divides(self) -> str:
        """What is divided, in words: 's/frame of HF ÷ s/frame of the port (defaults)', or for two
        curve rows of one batch 'frames/s (all rollouts) of the port ÷ frames/s of stock vLLM Llama,
        8 rollouts at once each'."""
        unit, short = QUANTITY_WORDS[self.quantity], {"s_per_frame": "s/frame", "frames_per_s": "frames/s",
                                                      "prefill_tokens_per_s": "prompt tokens/s"}[self.quantity]
        a, b = self.numerator, self.denominator
        if _curve_engine(a) in CURVE_WHO and _curve_engine(b) in CURVE_WHO and row_batch(a) == row_batch(b) > 1:
            return (f"{unit} of {CURVE_WHO[_curve_engine(a)]} ÷ {short} of {CURVE_WHO[_curve_engine(b)]}, "
                    f"{row_batch(a)} rollouts at once each")
        return f"{unit} of {_who(a)} ÷ {short} of {_who(b)}"


QUANTITY_WORDS = {"s_per_frame": "s/frame", "frames_per_s": "frames/s (all rollouts)",
                  "prefill_tokens_per_s": "prompt tokens prefilled/s (all prompts)"}
CURVE_WHO = {"vllm": "the port", "session": "the port's sessions", "stock_llama": "stock vLLM Llama"}
WHO = {"hf": "HF", "hf_seed": "HF", "hf_seed_flash": "HF (cuDNN attention off)",
       "hf_static": "HF (static cache + torch.compile)", "vllm": "the port (defaults)",
       "vllm_eager": "the port (eager)", "vllm_seed": "the port as the seed ran it (eager, no prefix caching)",
       "vllm_seed_defaults": "the port (today's defaults)", "stock_llama": "stock vLLM Llama"}


def _who(name: str) -> str:
    """A row in a ratio's words: `WHO`, 'the port, 8 rollouts at once' for curve rows, or 'the port
    at TP=2, 32 rollouts at once' / 'the port at TP=2, prefill of long prompts' for `bench tp`'s."""
    return WHO.get(name) or _tp_who(name, "the port") or f"{CURVE_WHO[row_engine(name)]}, {_at_once(row_batch(name))}"


def _tp_who(name: str, port: str) -> str | None:
    """A `bench tp` row in words, `port` naming the port ('the port', 'our port'): '<port> at TP=2,
    32 rollouts at once' or '<port> at TP=2, prefill of long prompts'; None for any other row."""
    parts = tp_row_parts(name)
    if parts is None:
        return None
    tp, batch = parts
    return f"{port} at TP={tp}, " + ("prefill of long prompts" if batch == PREFILL else _at_once(batch))


def rollouts_text(n: int) -> str:
    """'1 rollout', '32 rollouts'."""
    return f"{n} rollout{'s' if n > 1 else ''}"


def _at_once(n: int) -> str:
    return f"{rollouts_text(n)} at once"


RATIOS = (
    Ratio("speedup_vs_hf", "hf", "vllm", "s_per_frame"),
    Ratio("vllm_vs_stock", "vllm", "stock_llama", "s_per_frame"),      # above 1: the port is slower
    Ratio("eager_vs_hf", "hf", "vllm_eager", "s_per_frame"),
    # the seed's setting (issue 25): HF's s/frame over the port's, as the seed's 11.03 / 4.25
    Ratio("seed_setting_vs_hf", "hf_seed", "vllm_seed", "s_per_frame"),
    Ratio("seed_defaults_vs_hf", "hf_seed", "vllm_seed_defaults", "s_per_frame"),
    # the same with HF's attention kept off cuDNN (no plan built per new key length)
    Ratio("seed_setting_vs_hf_flash", "hf_seed_flash", "vllm_seed", "s_per_frame"),
    Ratio("seed_defaults_vs_hf_flash", "hf_seed_flash", "vllm_seed_defaults", "s_per_frame"),
    # HF's fast path (static cache + torch.compile) over the port with today's defaults
    Ratio("seed_defaults_vs_hf_static", "hf_static", "vllm_seed_defaults", "s_per_frame"),
)
"""The fixed ratios a lease's rows can give; `lease_ratios` adds the curve's, batch by batch."""


def lease_ratios(rows: list[dict]) -> list[Ratio]:
    """The ratios one lease's rows give: each of `RATIOS` whose two rows are there, then per batch
    of the curve the port's and the sessions' frames/s over stock's (`port_vs_stock_b<N>`,
    `session_vs_stock_b<N>`), except where a fixed ratio already divides the same two rows, then
    TP=2 over TP=1 (`tp_ratios`)."""
    names = {r["name"] for r in rows}
    out = [r for r in RATIOS if {r.numerator, r.denominator} <= names]
    pairs = {frozenset((r.numerator, r.denominator)) for r in out}
    batches = sorted({row_batch(n) for n in names if _curve_engine(n) == "stock_llama"})
    for who, label in (("vllm", "port"), ("session", "session")):
        for b in batches:
            num, den = (e if b == 1 else f"{e}_b{b}" for e in (who, "stock_llama"))
            if num in names and frozenset((num, den)) not in pairs:
                out.append(Ratio(f"{label}_vs_stock_b{b}", num, den, "frames_per_s"))
    return out + tp_ratios(names)


def tp_ratios(names: set[str]) -> list[Ratio]:
    """`bench tp`'s rows at TP=2 over their like at TP=1, wherever a lease has both: frames/s at each
    batch (`tp2_vs_tp1_b<N>`; above 1, TP=2 makes more frames a second) and prompt tokens/s of
    prefill alone (`tp2_vs_tp1_prefill`)."""
    sides = {tp_row_parts(n) for n in names} - {None}
    both = {b for tp, b in sides if tp == 1 and (2, b) in sides}
    out = [Ratio(f"tp2_vs_tp1_b{b}", tp_row(2, b), tp_row(1, b), "frames_per_s")
           for b in sorted(b for b in both if b != PREFILL)]
    if PREFILL in both:
        out.append(Ratio("tp2_vs_tp1_prefill", tp_row(2, PREFILL), tp_row(1, PREFILL), "prefill_tokens_per_s"))
    return out


def _curve_engine(name: str) -> str | None:
    try:
        return row_engine(name)
    except ValueError:   # rows off the curve (e.g. `vllm_tp2`)
        return None


def _per_trial(row: dict, quantity: str) -> list[float] | None:
    """A row's `quantity` trial by trial (from `trials_s`), or None without trials."""
    trials = row.get("trials_s")
    if not trials:
        return None
    if quantity == "s_per_frame":
        return [t / row["frames"] for t in trials]
    if quantity == "prefill_tokens_per_s":
        return [row["prompts"] * row["prompt_tokens"] / t for t in trials]
    return [row["batch"] * row["frames"] / t for t in trials]


def ratio_entry(ratio: Ratio, by: dict[str, dict]) -> dict:
    """A ratio as a combined results file keeps it: its value, the two rows and what is divided, and
    (both rows with trials) `trials_spread`, the larger of the two rows' slowest over fastest trial,
    with `trials_range`, the lowest and highest ratio of one of that row's (`trials_of`) trials to
    the other row's median (as `seed_setting_lines` quotes HF's trials against the port's median)."""
    num, den = by[ratio.numerator], by[ratio.denominator]
    entry = dict(name=ratio.name, value=ratio.value(by), numerator=ratio.numerator, denominator=ratio.denominator,
                 quantity=ratio.quantity, divides=ratio.divides(),
                 frames=[num.get("frames"), den.get("frames")])
    a, b = _per_trial(num, ratio.quantity), _per_trial(den, ratio.quantity)
    if a and b:
        if _trial_spread(num) >= _trial_spread(den):
            ends, of = [t / den[ratio.quantity] for t in (min(a), max(a))], ratio.numerator
        else:
            ends, of = [num[ratio.quantity] / t for t in (max(b), min(b))], ratio.denominator
        entry.update(trials_range=ends, trials_of=of, trials_spread=max(_trial_spread(num), _trial_spread(den)))
    return entry


LEASE_OWN = ("commit", "lease", "date", "versions", "dtype", "workload", "command", "notes", "errors", "env",
             "speedup_vs_hf", "prefix_cache_hit_rate", "profile", "step_profiles")
"""What a combined file keeps of each lease file besides its rows (its `ratios` and `curve` are recomputed)."""


def combine(leases: dict[str, dict], files: dict[str, str] | None = None) -> dict:
    """One results file from several leases' (each as `merge` wrote it, keyed by lease id, e.g. the
    file's stem): `device` (the same for all, else ValueError), `leases` (id -> what the lease file
    said about itself, with its `curve` and memory floors), `rows` (every row, with its `lease` id
    and `commit`; a row name may recur in several leases) and `ratios` (`ratio_entry`s, each computed
    between two rows of one lease, which it names: a ratio whose rows are in different leases is not
    computed). `files`: lease id -> the file it came from, kept as the lease's `file`."""
    files = files or {}
    if not leases:
        raise ValueError("no leases to combine")
    devices = {lid: res["device"] for lid, res in leases.items()}
    if len(set(devices.values())) > 1:
        raise ValueError("leases measured on different devices cannot share one results file: "
                         + "; ".join(f"{files.get(lid, lid)}: {d}" for lid, d in devices.items()))
    device = next(iter(devices.values()))
    out_leases, rows, ratios = {}, [], []
    for lid, res in leases.items():
        commit = res.get("commit") or (res.get("env") or {}).get("git_commit")
        own = [dict(r, lease=lid, commit=commit) for r in res["rows"]]
        meta = {k: res[k] for k in LEASE_OWN if k in res}
        meta.update(commit=commit, curve=with_floor(throughput_curve(own), res["workload"], device))
        if lid in files:
            meta["file"] = str(files[lid])
        out_leases[lid] = meta
        by = {r["name"]: r for r in own}
        if len(by) < len(own):
            raise ValueError(f"lease {lid} ({files.get(lid, lid)}) has a row name twice: one lease, one row per name")
        rows += own
        ratios += [dict(ratio_entry(r, by), lease=lid, commit=commit) for r in lease_ratios(own)]
    return dict(device=device, leases=out_leases, rows=rows, ratios=ratios)


def lease_id(path: Path | str) -> str:
    """A lease file's id in a combined file: its stem (results/leases/h200_2026-11-25_seed.json ->
    h200_2026-11-25_seed), short and stable as long as the file keeps its name."""
    return Path(path).stem


def combine_files(paths: list[Path]) -> dict:
    """`combine` of lease files (as `merge` wrote them), each under its `lease_id`, recording its path
    relative to the repository (so `recombine` can rebuild the combined file from it)."""
    from terra_nb.workbook.paths import REPO

    def rel(p: Path) -> str:
        p = Path(p).resolve()
        return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)

    ids = [lease_id(p) for p in paths]
    if len(set(ids)) < len(ids):
        raise ValueError(f"two lease files share a stem (a lease id): {[str(p) for p in paths]}")
    leases = {lid: json.loads(Path(p).read_text()) for lid, p in zip(ids, paths)}
    files = {lid: rel(p) for lid, p in zip(ids, paths)}
    return dict(combine(leases, files), combined_by="python -m terra_nb.bench combine " + " ".join(files.values()))


def recombine(res: dict) -> dict:
    """A combined file rebuilt from the lease files it names (each lease's `file`)."""
    from terra_nb.workbook.paths import REPO

    return combine_files([REPO / meta["file"] for meta in res["leases"].values()])


def is_combined(res: dict) -> bool:
    """True for a file of several leases (`combine`), False for one lease's (`merge`)."""
    return "leases" in res


def lease_results(res: dict, lid: str) -> dict:
    """One lease of a combined file in `merge`'s layout (so every one-lease renderer reads it): the
    lease's own keys, the device, its rows, and `ratios` {name: value} of its ratio entries."""
    rows = [r for r in res["rows"] if r["lease"] == lid]
    ratios = {e["name"]: e["value"] for e in res["ratios"] if e["lease"] == lid}
    return dict(res["leases"][lid], device=res["device"], rows=rows, ratios=ratios, lease_id=lid)


def by_lease(res: dict) -> list[tuple[str | None, dict]]:
    """[(lease id, that lease in `merge`'s layout)] for a combined file; [(None, res)] for one lease's."""
    if not is_combined(res):
        return [(None, res)]
    return [(lid, lease_results(res, lid)) for lid in res["leases"]]


def step_digest(rows: list[dict]) -> dict | None:
    """Per batch (a string key, as JSON has it): each engine's frame-step profile (rows measured
    with `--step-batches`), and the session's against stock's frame loop where both ran."""
    from terra_nb.bench.step_profile import compare_steps

    by_batch: dict[str, dict] = {}
    for r in rows:
        if "step_profile" in r:
            by_batch.setdefault(str(r["batch"]), {})[row_engine(r["name"])] = r["step_profile"]
    for profiles in by_batch.values():
        if {"stock_llama", "session"} <= profiles.keys():
            profiles["session_vs_stock"] = compare_steps(profiles["stock_llama"], profiles["session"])
    return by_batch or None


def profile_digest(profiles: dict[str, dict]) -> dict | None:
    """What a results file keeps of the parts' profiles: per engine, each section's wall time and
    phases and each decode's kernels per step; port vs stock section by section when both ran.
    (The full profiles go beside the results file, see `main`.)"""
    from terra_nb.bench.profiling import compare

    if not profiles:
        return None
    out = {e: dict(sections=[dict(label=s["label"], wall_s=s["wall_s"], phases=s["phases"]) for s in p["sections"]],
                   kernels=[{k: v for k, v in k_.items() if not k.startswith("top_")} for k_ in p.get("kernels", [])])
           for e, p in profiles.items()}
    if {"port", "stock"} <= profiles.keys():
        out["port_vs_stock"] = compare(profiles["port"], profiles["stock"])
    return out


def throughput_curve(rows: list[dict]) -> list[dict]:
    """Frames per second of the port and of stock at each batch both measured, and their ratio;
    with session rows (`session_b<N>`), also the sessions' frames per second and their ratio to
    stock's frame loop."""
    def fps(kind: str) -> dict:
        return {r["batch"]: r["frames_per_s"] for r in rows if _curve_engine(r["name"]) == kind and "tp" not in r}

    port, stock, session = fps("vllm"), fps("stock_llama"), fps("session")
    ratio = lambda a, b: round(a / b, 3) if a is not None and b else None  # noqa: E731
    out = []
    for b in sorted(port.keys() | stock.keys() | session.keys()):
        row = dict(batch=b, port_frames_per_s=port.get(b), stock_frames_per_s=stock.get(b),
                   port_vs_stock=ratio(port.get(b), stock.get(b)))
        if session:
            row.update(session_frames_per_s=session.get(b), session_vs_stock=ratio(session.get(b), stock.get(b)))
        out.append(row)
    return out


def with_floor(curve: list[dict], workload: dict, device: str) -> list[dict]:
    """The curve with each batch's memory floor (`terra_nb.bench.roofline`: the frames/s no engine
    can pass on this device, model and rollout length) and what share of it each engine reached.
    Unchanged when the workload names no preset or the device has no bandwidth on record."""
    from terra_nb.port.checkpoints import preset_config
    from terra_nb.bench.roofline import bandwidth_of, floor_frames_per_s

    try:
        config, frames = preset_config(workload["preset"]), workload["long_frames"]
        bandwidth_of(device)
    except (KeyError, ValueError):
        return curve
    out = []
    for row in curve:
        floor = floor_frames_per_s(config, row["batch"], workload["n_ctx"], frames, device)
        shares = {f"{who}_of_floor": round(row[f"{who}_frames_per_s"] / floor, 3)
                  for who in ("port", "stock", "session") if row.get(f"{who}_frames_per_s") is not None}
        out.append(dict(row, floor_frames_per_s=round(floor, 3), **shares))
    return out


ROW_LABELS = {
    "hf": "HF `generate` + KV cache (the seed's baseline)",
    "vllm_eager": "our port, `enforce_eager=True` (the seed's setting)",
    "vllm": "our port, CUDA graphs + prefix caching (default)",
    "stock_llama": "stock vLLM Llama, same shape (ceiling)",
    "session": "our port, one engine session per rollout",
    "hf_seed": "HF `generate`, the seed's setting (one call per frame, temperature 1.0)",
    "hf_seed_flash": "HF `generate`, the seed's setting, SDPA kept off cuDNN (`HF_FLASH_BACKENDS`)",
    "hf_static": "HF `generate`, static cache + `torch.compile`, the seed's setting",
    "vllm_seed": "our port as the seed ran vLLM (eager, no prefix caching, max_num_seqs 5)",
    "vllm_seed_defaults": "our port with today's defaults, the seed's setting",
}


def row_label(name: str) -> str:
    """A row's label in tables: `ROW_LABELS`, 'our port, 64 rollouts at once' for curve rows, or
    'our port at TP=2, 32 rollouts at once' for `bench tp`'s."""
    if name in ROW_LABELS:
        return ROW_LABELS[name]
    if tp_row_parts(name):
        return _tp_who(name, "our port")
    who = {"vllm": "our port", "session": "our port, one session per rollout"}.get(row_engine(name), "stock vLLM Llama")
    return f"{who}, {row_batch(name)} rollouts at once"


def load_results(results_dir: Path | None = None, pattern: str = "benchmark_*.json") -> dict[str, dict]:
    """Committed GPU results: {file stem: results}, from results/benchmark_*.json (or `pattern`)."""
    from terra_nb.workbook.paths import RESULTS

    folder = Path(results_dir) if results_dir is not None else RESULTS
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob(pattern))}


RATIO_LABEL = "frames/s ÷ HF's frames/s"
"""What `results_table`'s ratio column and `report_rows`' `x_hf` divide: a row's frames per second
(all its rollouts together) by the HF row's (batch 1), each over the frames its own trials ran."""


def _hf_basis(res: dict) -> str:
    hf = next((r for r in res["rows"] if r["name"] == "hf"), None)
    return f"HF: batch 1, {hf['frames']} frames per trial" if hf else "no HF row"


STEP_ENGINES = {"stock_llama": "stock, frame loop", "vllm": "our port, frame loop", "session": "our port, sessions"}


def overhead_ceiling(profile: dict) -> float:
    """The most an engine could gain on a frame step by removing all of its overhead: wall time over
    decode time (`step_profile`'s wall minus overhead)."""
    return profile["wall_ms"] / (profile["wall_ms"] - profile["overhead_ms"])


def decode_floor_share(res: dict, batch: int | str, engine: str = "stock_llama") -> dict:
    """How close an engine's profiled decode step came to its memory floor (`roofline.decode_step_floor_s`)
    at `batch` rollouts: the floor of a step at the profiled frames' median context (the window of
    `n_ctx` frames, plus a frame per earlier profiled step, plus half of the frame being decoded),
    in ms, beside the measured step and their ratio (`share`: 1 = at the floor)."""
    import statistics

    from terra_nb.port.checkpoints import preset_config
    from terra_nb.port.layout import FrameLayout
    from terra_nb.bench.roofline import bandwidth_of, decode_step_floor_s

    p = res["step_profiles"][str(batch)][engine]
    config, w = preset_config(res["workload"]["preset"]), res["workload"]
    layout = FrameLayout.from_config(config)
    index = statistics.median(f["index"] for f in p["by_frame"])   # frame k follows n_ctx + k frames
    context = (w["n_ctx"] + index) * layout.frame_len + layout.image_tokens / 2
    floor_ms = 1000 * decode_step_floor_s(config, int(batch), context, bandwidth_of(res["device"]))
    return dict(context_tokens=context, floor_ms=round(floor_ms, 3), decode_step_ms=p["decode_step_ms"],
                share=round(floor_ms / p["decode_step_ms"], 3))


def steps_table(res: dict) -> str:
    """Markdown: per batch with frame-step profiles (`step_profiles`), each engine's frame step split
    into decoding and overhead, and the most removing all the overhead could gain (`overhead_ceiling`)."""
    num = lambda x, f=".1f": "" if x is None else format(x, f)  # noqa: E731
    lines = ["| rollouts | engine | frame step (ms) | decode step (ms) | overhead (ms) | overhead share "
             "| session's gap before a frame (ms) | ceiling: wall ÷ decode |", "|---|---|---|---|---|---|---|---|"]
    for batch, profiles in (res.get("step_profiles") or {}).items():
        for engine, label in STEP_ENGINES.items():
            if engine in profiles:
                p = profiles[engine]
                lines.append(f"| {batch} | {label} | {num(p['wall_ms'])} | {num(p['decode_step_ms'], '.3f')} "
                             f"| {num(p['overhead_ms'])} | {p['overhead_share']:.1%} | {num(p.get('gap_ms'))} "
                             f"| {overhead_ceiling(p):.3f} |")
    return "\n".join(lines)


TRIALS_DISAGREE = 1.5
"""Slowest over fastest trial above which a row's median hides more than it says (two trials: their mean)."""


def _trial_spread(row: dict | None) -> float:
    """A row's slowest trial over its fastest (1.0 for one trial or no row)."""
    trials = (row or {}).get("trials_s") or [1.0]
    return max(trials) / min(trials)


HF_SEED_ROWS = {"hf_seed": "HF", "hf_seed_flash": "HF with cuDNN attention off"}
"""HF's rows in the seed's setting and their words: `hf_seed` as torch chooses its attention kernel,
`hf_seed_flash` with cuDNN's left out (`bench_measure.HF_FLASH_BACKENDS`)."""


def seed_setting_lines(res: dict) -> list[str]:
    """Sentences on the seed's setting (issue 25), every figure from `res`'s seed rows: the ratio
    against the seed's 2.6x, what HF pays per frame as its context grows (`frame_s`; when HF's trials
    disagree by over `TRIALS_DISAGREE`, the range of ratios instead, since the per-frame medians then
    mix a slow and a fast video), what eager mode costs per code (the port's seed rows'
    `step_profile`), and why HF's static path has no row where it failed. Empty without seed rows.
    One lease at a time: a combined file's leases through `by_lease` (its rows of one name may come
    from several leases)."""
    if is_combined(res):
        raise ValueError("seed_setting_lines reads one lease: pass lease_results(res, lid), see by_lease")
    by = {r["name"]: r for r in res["rows"]}
    eager, defaults = by.get("vllm_seed"), by.get("vllm_seed_defaults")
    lines = []
    for name, who in HF_SEED_ROWS.items():
        if name in by:
            lines += _hf_seed_lines(by[name], who, eager, defaults)
    static = by.get("hf_static")
    if static and defaults:
        lines.append(f"HF's own fast path (a static cache of a round and torch.compile) takes {static['s_per_frame']:.2f} s "
                     f"per frame: the port with today's defaults is {static['s_per_frame'] / defaults['s_per_frame']:.2f}x it.")
    failed = [e for e in res.get("errors", []) if e.get("group") == "hf_static"]
    if failed and not static:
        lines.append("HF's static cache + torch.compile gave no row: "
                     + "; ".join(e["error"] for e in failed) + ".")
    hf = next((by[n] for n in HF_SEED_ROWS if n in by and _trial_spread(by[n]) <= TRIALS_DISAGREE), None)
    if hf and eager and defaults and all("tokens_per_call" in r for r in (hf, eager, defaults)):
        lines.append(_per_code_line(hf, eager, defaults))
    if eager and defaults and "step_profile" in eager and "step_profile" in defaults:
        e, d = eager["step_profile"], defaults["step_profile"]
        lines.append(f"Eager mode costs {e['decode_step_ms']:.2f} ms per code against {d['decode_step_ms']:.2f} ms with "
                     f"CUDA graphs ({e['decode_step_ms'] / d['decode_step_ms']:.2f}x); a frame's overhead (no prefix "
                     f"caching: the whole prompt prefilled again) is {e['overhead_ms']:.0f} ms against "
                     f"{d['overhead_ms']:.0f} ms.")
    return lines


CONTEXT_SHOWS = 1.1
"""Last frame over first above which HF's growing prompt and cache are what a frame's time shows."""


def _per_code_line(hf: dict, eager: dict, defaults: dict) -> str:
    """Why the seed's ratio is not today's: per code, HF and the eager port against the port with CUDA
    graphs, whose time per code bounds the GPU work a code needs (the same model, batch 1); the rest
    of a code's time in the other two is the CPU launching its kernels one by one."""
    ms = {n: r["s_per_frame"] / r["tokens_per_call"] * 1e3 for n, r in
          ((hf["name"], hf), ("vllm_seed", eager), ("vllm_seed_defaults", defaults))}
    gpu = ms["vllm_seed_defaults"]
    return (f"Per code, prefill included: {WHO[hf['name']]} {ms[hf['name']]:.1f} ms, the eager port "
            f"{ms['vllm_seed']:.1f} ms, the port with CUDA graphs {gpu:.2f} ms. The GPU work of a code is at most "
            f"the last, so at least {1 - gpu / ms[hf['name']]:.0%} of HF's time per code and "
            f"{1 - gpu / ms['vllm_seed']:.0%} of the eager port's is the CPU issuing kernels one at a time: "
            "the seed's ratio divides two CPU-bound loops, and it moves with the host's CPU and each "
            "framework's work per step, not with the GPU.")


def _hf_seed_lines(hf: dict, who: str, eager: dict | None, defaults: dict | None) -> list[str]:
    """`seed_setting_lines` for one of HF's seed rows (`HF_SEED_ROWS`), against the port's rows of its lease."""
    seed_hf, seed_vllm = SEED_FIGURES.values()
    lines = []
    if eager:
        lines.append(f"In the seed's setting (batch 1, {hf['frames']} frames, one call per frame, temperature "
                     f"{hf['temperature']}): {who} {hf['s_per_frame']:.2f} s per frame, the port as the seed ran it "
                     f"(eager, no prefix caching, max_num_seqs 5) {eager['s_per_frame']:.2f} s: "
                     f"{hf['s_per_frame'] / eager['s_per_frame']:.2f}x, against the seed's {seed_hf / seed_vllm:.2f}x.")
    if defaults:
        lines.append(f"With today's defaults (CUDA graphs, prefix caching) the port takes {defaults['s_per_frame']:.2f} s "
                     f"per frame: {hf['s_per_frame'] / defaults['s_per_frame']:.2f}x {who}.")
    spread = _trial_spread(hf)
    if eager and spread > TRIALS_DISAGREE:
        slow, fast = max(hf["trials_s"]) / hf["frames"], min(hf["trials_s"]) / hf["frames"]
        also = (f" (the default port: {fast / defaults['s_per_frame']:.2f}x to {slow / defaults['s_per_frame']:.2f}x)"
                if defaults else "")
        lines.append(f"{who}: its trials disagree, {slow:.2f} and {fast:.2f} s per frame ({spread:.2f}x), so against the "
                     f"eager port the ratio is {fast / eager['s_per_frame']:.2f}x to {slow / eager['s_per_frame']:.2f}x{also}, "
                     f"and the median's lies between; the file's notes say what is known of why.")
    elif len(hf.get("trials_s", [])) > 1:
        lines.append(f"{who}: its trials agree within {spread:.2f}x ("
                     + " and ".join(f"{t:.1f}" for t in hf["trials_s"]) + " s).")
    if hf.get("frame_s") and spread <= TRIALS_DISAGREE:
        first, last = hf["frame_s"][0], hf["frame_s"][-1]
        why = ("every call prefills the whole prompt again and decodes against a cache that grows with it"
               if last / first > CONTEXT_SHOWS else "the context's growth barely shows: the cost of a step is its own")
        lines.append(f"{who}: its first frame took {first:.2f} s and its last {last:.2f} s ({last / first:.2f}x): {why}.")
    return lines


def seed_lease_notes(res: dict, earlier: dict | None = None, probe: dict | None = None) -> list[str]:
    """Notes for a seed lease's file, computed (`bench merge --seed-notes`): each HF seed row's trials,
    their spread and the allocator's driver calls; against an `earlier` seed lease, its HF row's
    trials and how the port's rows of both leases compare (a slower host shows in both sides, so
    ratios hold only within a lease); and a `probe` result's findings (`hf_probe.finding_lines`)."""
    from terra_nb.bench.hf_probe import finding_lines

    by = {r["name"]: r for r in res["rows"]}
    old = {r["name"]: r for r in (earlier or {}).get("rows", [])}
    temps = sorted({r["temperature"] for r in res["rows"] if r["name"] in SEED_ROWS})
    lines = [f"The seed rows sample at temperature {' and '.join(map(str, temps))}, as each row records "
             "(the workload's own temperature is the curve rows')."] if temps else []
    for name, who in HF_SEED_ROWS.items():
        for where, rows in (("this lease", by), (_lease_name(earlier), old)):
            r = rows.get(name)
            if r:
                allocs = r.get("device_allocs")
                lines.append(f"{who} ({where}): trials " + " and ".join(f"{t:.1f}" for t in r["trials_s"])
                             + f" s, slowest ÷ fastest {_trial_spread(r):.2f}x"
                             + (f"; the CUDA allocator asked the driver for memory {', '.join(map(str, allocs))} "
                                "times per trial" if allocs and None not in allocs else "") + ".")
    for name in ("vllm_seed", "vllm_seed_defaults"):
        if name in by and name in old:
            now, then = by[name]["s_per_frame"], old[name]["s_per_frame"]
            lines.append(f"{WHO[name][0].upper() + WHO[name][1:]}: {now:.2f} s per frame here, {then:.2f} in "
                         f"{_lease_name(earlier)} ({now / then:.2f}x); hosts differ, so ratios hold within a lease only.")
    return lines + (finding_lines(probe["probe"]) if probe else [])


def _lease_name(res: dict | None) -> str:
    """A lease in a sentence: its id where it has one, else its date."""
    res = res or {}
    return f"lease {res.get('lease_id') or res.get('date', 'earlier')}"


def _provenance(res: dict) -> str:
    """Which commit's code and which lease measured a results file (every row of it)."""
    commit = res.get("commit") or (res.get("env") or {}).get("git_commit") or "unknown"
    return f"Commit {commit}; {res.get('lease') or 'lease not recorded'}."


def _software(res: dict) -> str:
    """The device and the versions that measured a results file."""
    v = res["versions"]
    return f"{res['device']}, vLLM {v['vllm']}, torch {v['torch']}, transformers {v['transformers']}"


def seed_section(stem: str, res: dict) -> str:
    """Markdown for a results file's seed-setting rows, lease by lease (`by_lease`; or one lease,
    `lease_results`): where and what measured them (each lease headed by its id, commit and lease),
    the `seed_setting_lines` of that lease's rows, and the lease's notes (what its figures leave
    out). Empty without seed rows."""
    blocks = []
    for lid, view in by_lease(res):
        lines = seed_setting_lines(view)
        lid = lid or view.get("lease_id")   # `lease_results`' view of one lease names it too
        if lines:
            where = f"results/{stem}.json" + (f", lease `{lid}`" if lid else "")
            head = f"**{where}**: {_software(view)}. {_provenance(view)}"
            blocks.append("\n\n".join([head, " ".join(lines)] + ["\n".join(f"- {n}" for n in view.get("notes", []))]))
    return "\n\n".join(blocks)


def ratio_entries(res: dict, lid: str | None = None) -> list[dict]:
    """A lease's ratio entries (`ratio_entry`): a combined file's own, those of lease `lid`; for one
    lease's file (`merge`), computed from its rows."""
    if is_combined(res):
        return [e for e in res["ratios"] if e["lease"] == lid]
    by = {r["name"]: r for r in res["rows"]}
    return [ratio_entry(r, by) for r in lease_ratios(res["rows"])]


def ratio_line(entry: dict) -> str:
    """One ratio in words: its name and value, what it divides, which rows (and their frames per
    trial); where the rows' trials disagree by over `TRIALS_DISAGREE`, the trial-by-trial range."""
    frames = entry.get("frames") or [None, None]
    per = "" if None in frames else (f", {frames[0]} frames per trial each" if frames[0] == frames[1]
                                     else f", {frames[0]} and {frames[1]} frames per trial")
    line = (f"`{entry['name']}` = **{entry['value']:.3f}x**: {entry['divides']} "
            f"(rows `{entry['numerator']}` ÷ `{entry['denominator']}`{per})")
    if entry.get("trials_spread", 1.0) > TRIALS_DISAGREE:
        lo, hi = entry["trials_range"]
        other = entry["denominator"] if entry["trials_of"] == entry["numerator"] else entry["numerator"]
        line += (f"; `{entry['trials_of']}`'s trials disagree ({entry['trials_spread']:.2f}x slowest ÷ fastest): "
                 f"{lo:.3f}x to {hi:.3f}x from each of its trials against `{other}`'s median")
    return line


CURVE_TARGETS = {1: 1.03, 32: 0.95, 128: 0.95}
"""Issue 25's targets for the port against stock vLLM Llama (H200, both rows of one lease), by batch:
the bound on the port's ÷ stock's `curve_quantity`. At 1 rollout s/frame, so at most 1.03x; at 32
and 128 rollouts frames/s, so at least 0.95x."""

TRIALS_NOTE = 1.05
"""Slowest over fastest trial above which `curve_target_lines` gives the ratio trial by trial."""


def curve_quantity(batch: int) -> str:
    """What a curve ratio divides at `batch` (as `lease_ratios` and `RATIOS` do): s/frame at 1
    rollout (`vllm_vs_stock`), frames/s above (`port_vs_stock_b<N>`)."""
    return "s_per_frame" if batch == 1 else "frames_per_s"


def _curve_pairs(rows: list[dict]) -> list[tuple[int, dict, dict]]:
    """[(batch, the port's row, stock's row)] for every batch where one lease measured both."""
    by = {r["name"]: r for r in rows if "tp" not in r}
    stock = {row_batch(n): r for n, r in by.items() if _curve_engine(n) == "stock_llama"}
    port = {row_batch(n): r for n, r in by.items() if _curve_engine(n) == "vllm"}
    return [(b, port[b], stock[b]) for b in sorted(stock.keys() & port.keys())]


def _verdict(ratio: float, batch: int) -> bool | None:
    """Whether `ratio` (the port's ÷ stock's `curve_quantity`) meets `CURVE_TARGETS` at `batch`."""
    bound = CURVE_TARGETS.get(batch)
    if bound is None:
        return None
    return ratio <= bound if curve_quantity(batch) == "s_per_frame" else ratio >= bound


def _target_words(ratio: float, batch: int) -> str:
    """'target at most 1.03x: met, 0.159 under', 'target at least 0.95x: missed, 0.007 short', or
    'no target at this batch'."""
    bound, ok = CURVE_TARGETS.get(batch), _verdict(ratio, batch)
    if ok is None:
        return "no target at this batch"
    if curve_quantity(batch) == "s_per_frame":
        return f"target at most {bound:.2f}x: " + (f"met, {bound - ratio:.3f} under" if ok else f"missed, {ratio - bound:.3f} over")
    return f"target at least {bound:.2f}x: " + (f"met, {ratio - bound:.3f} over" if ok else f"missed, {bound - ratio:.3f} short")


def _trial_ratios(port: dict, stock: dict, quantity: str, vary) -> list[float]:
    """The port's ÷ stock's `quantity` trial by trial: each trial of a side named in `vary` ('the
    port', 'stock'), the median of the other; both named: every pair of trials."""
    a = (_per_trial(port, quantity) or [port[quantity]]) if "the port" in vary else [port[quantity]]
    d = (_per_trial(stock, quantity) or [stock[quantity]]) if "stock" in vary else [stock[quantity]]
    return [x / y for x in a for y in d]


def _range_words(ratios: list[float], batch: int) -> str:
    """'0.805x to 0.950x, met with each' (or 'missed with each', 'met with some and missed with
    others'; no verdict where `batch` has no target)."""
    ok = {_verdict(r, batch) for r in ratios}
    verdict = ("" if None in ok else ", met with each" if ok == {True} else ", missed with each" if ok == {False}
               else ", met with some and missed with others")
    return f"{min(ratios):.3f}x to {max(ratios):.3f}x{verdict}"


def _trials_text(row: dict) -> str:
    """A row's trials in seconds, as the lease notes quote them: '43.50, 45.09'."""
    return ", ".join(f"{t:.2f}" for t in row["trials_s"])


def curve_target_lines(res: dict) -> list[str]:
    """Sentences on one lease's batch curve, every figure from its rows (issue 25): which of
    `CURVE_TARGETS` the port ÷ stock ratio meets; per batch both rows' figures, their ratio against
    the target (met or missed, by how much), each side's trials in seconds, and where a side's
    slowest trial is over `TRIALS_NOTE` times its fastest, the ratio from each of its trials (against
    the other side's median; both sides: every pair) and whether each meets the target; each
    engine's batch of most frames/s; the batch-1 rows' decode probes. Empty without a curve pair.
    One lease at a time (a combined file's leases through `by_lease`)."""
    if is_combined(res):
        raise ValueError("curve_target_lines reads one lease: pass lease_results(res, lid), see by_lease")
    pairs = _curve_pairs(res["rows"])
    if not pairs:
        return []
    ratios = {b: port[curve_quantity(b)] / stock[curve_quantity(b)] for b, port, stock in pairs}
    verdicts = [f"{rollouts_text(b)} " + ("not measured" if b not in ratios else "met" if _verdict(ratios[b], b) else "missed")
                for b in CURVE_TARGETS]
    met = sum(b in ratios and _verdict(ratios[b], b) for b in CURVE_TARGETS)
    lines = [f"Issue 25's targets, the port ÷ stock vLLM Llama in this lease: {met} of {len(CURVE_TARGETS)} met ("
             + ", ".join(verdicts) + ")."]
    for b, port, stock in pairs:
        q, ratio = curve_quantity(b), ratios[b]
        fig = (lambda r: f"{r[q]:.3f} s/frame") if q == "s_per_frame" else (lambda r: f"{r[q]:.2f} frames/s")  # noqa: E731
        line = (f"{rollouts_text(b)}: the port {fig(port)}, stock {fig(stock)}: {ratio:.3f}x "
                f"({QUANTITY_WORDS[q].split(' (')[0]} of the port ÷ stock's; {_target_words(ratio, b)}). "
                + ("One trial each, in" if len(port["trials_s"]) == len(stock["trials_s"]) == 1 else "Trials in")
                + f" seconds (a trial: {rollouts_text(b)} x {port['frames']} frames): the port {_trials_text(port)}; stock {_trials_text(stock)}")
        sides = (("the port", port), ("stock", stock))
        wide = [who for who, r in sides if _trial_spread(r) > TRIALS_NOTE]
        if wide:   # a side's trials disagree: the ratio from each of them against the other side's median
            each = _trial_ratios(port, stock, q, vary=wide)
            spread = "; ".join(f"{who}'s slowest {_trial_spread(r) - 1:.1%} over its fastest" for who, r in sides if who in wide)
            whose = " and ".join(f"{w}'s" for w in wide)
            against = "against the other's median" if len(wide) == 1 else "against each other"
            line += f" ({spread}: from each of {whose} trials {against} the ratio is {_range_words(each, b)})"
        elif b in CURVE_TARGETS and len({_verdict(r, b) for r in _trial_ratios(port, stock, q, ("the port", "stock"))}) > 1:
            # trials that agree within TRIALS_NOTE, but the verdict still turns on which trial is taken
            line += (" (trial by trial, every trial of the port's against every one of stock's, the ratio is "
                     f"{_range_words(_trial_ratios(port, stock, q, ('the port', 'stock')), b)})")
        lines.append(line + ".")
    best = {who: max((r for r in res["rows"] if _curve_engine(r["name"]) == engine and "tp" not in r),
                     key=lambda r: r["frames_per_s"]) for who, engine in (("the port", "vllm"), ("stock", "stock_llama"))}
    lines.append("Most frames/s of each engine: " + ", ".join(
        f"{who} {r['frames_per_s']:.2f} at {rollouts_text(r['batch'])}" for who, r in best.items())
        + f" (batches measured: {', '.join(str(b) for b, _, _ in pairs)}).")
    probed = next(((b, port["probe"], stock["probe"]) for b, port, stock in pairs if port.get("probe") and stock.get("probe")), None)
    if probed:   # each engine probes once, on the first row it measured (`bench_vllm`, `bench_stock`)
        b, p, s = probed
        lines.append(f"Decode probe of the {b}-rollout rows (`bench_measure.decode_probe`: one frame on a cached prompt, "
                     f"medians): the port {p['decode_ms_per_token']:.3f} ms per code, stock {s['decode_ms_per_token']:.3f} "
                     f"({p['decode_ms_per_token'] / s['decode_ms_per_token']:.2f}x); a frame {p['frame_s']:.3f} s vs "
                     f"{s['frame_s']:.3f} s ({p['frame_s'] / s['frame_s']:.2f}x), where the rollouts' "
                     f"{QUANTITY_WORDS[curve_quantity(b)].split(' (')[0]} gave {ratios[b]:.3f}x.")
    return lines


def tp_lease_notes(res: dict) -> list[str]:
    """Sentences on one lease's `bench tp` rows (issue 25), every figure from the rows: TP=2 ÷ TP=1
    per batch and for prefill (`tp_ratios`), with each side's trials; whether prefill was served from
    the prefix cache; TP=2's greedy codes against TP=1's; and at 1 rollout, what TP=2 adds per code
    spread over the all-reduces of a decode step (two a layer: attention's output and the MLP's).
    Empty without a TP pair. One lease at a time."""
    if is_combined(res):
        raise ValueError("tp_lease_notes reads one lease: pass lease_results(res, lid), see by_lease")
    by = {r["name"]: r for r in res["rows"]}
    ratios = tp_ratios(set(by))
    if not ratios:
        return []
    lines = []
    for ratio in ratios:
        two, one = by[ratio.numerator], by[ratio.denominator]
        if ratio.quantity == "prefill_tokens_per_s":
            cached = sum(sum(r.get("cached_prompt_tokens", [])) for r in (two, one))
            lines.append(f"Prefill alone, {one['prompts']} random prompts of {one['prompt_tokens']:,} tokens "
                         f"({one['prompt_frames']} frames) at once, one token each: TP=2 {two[ratio.quantity]:,.0f} "
                         f"prompt tokens/s, TP=1 {one[ratio.quantity]:,.0f}: {ratio.value(by):.3f}x (TP=2 ÷ TP=1). "
                         f"Trials in seconds: TP=2 {_trials_text(two)}; TP=1 {_trials_text(one)}; prompt tokens served by the "
                         f"prefix cache: {cached}.")
            continue
        rollouts = rollouts_text(one["batch"])
        lines.append(f"{rollouts}: TP=2 {two['frames_per_s']:.2f} frames/s, TP=1 "
                     f"{one['frames_per_s']:.2f}: {ratio.value(by):.3f}x (frames/s at TP=2 ÷ TP=1's; "
                     f"{'TP=2 pays' if ratio.value(by) > 1 else 'TP=2 costs'}). Trials in seconds (a trial: "
                     f"{rollouts} x {one['frames']} frames): TP=2 {_trials_text(two)}; TP=1 {_trials_text(one)}.")
    lines += _tp_greedy_lines(res["rows"], res["dtype"].replace("torch.", "")) + _tp_batch1_lines(by, res)
    return lines


def _tp_greedy_lines(rows: list[dict], dtype: str) -> list[str]:
    """TP=2's greedy codes against TP=1's, as the TP=2 row recorded them (`greedy_vs_ref`)."""
    out = []
    for r in (r for r in rows if r.get("greedy_vs_tp1")):
        cmp, n = r["greedy_vs_tp1"], sum(len(f) for f in r["greedy_tokens"])
        verdict = f"all {n} equal" if cmp["equal"] else (
            f"{cmp['agreement']:.1%} of {n} equal, the first difference at code {cmp['first_mismatch']} (TP=2 adds each "
            "layer's partial sums in another order; one flipped near-tie changes the context of every later code)")
        out.append(f"Greedy codes at TP=2 against TP=1 ({len(r['greedy_tokens'])} frames of one rollout, {dtype}): {verdict}.")
    return out


def _tp_batch1_lines(by: dict[str, dict], res: dict) -> list[str]:
    """At 1 rollout, TP=2's extra time per code over the all-reduces of one decode step."""
    two, one = by.get(tp_row(2, 1)), by.get(tp_row(1, 1))
    if not (two and one) or two["s_per_frame"] <= one["s_per_frame"]:
        return []
    from terra_nb.port.checkpoints import PRESETS

    preset = PRESETS[res["workload"]["preset"]]
    layers, codes = preset["num_hidden_layers"], preset["num_image_patches"]
    extra_ms = (two["s_per_frame"] - one["s_per_frame"]) / codes * 1e3
    return [f"Why not at 1 rollout: TP=2 takes {extra_ms:.2f} ms more per code ({two['s_per_frame'] / codes * 1e3:.2f} vs "
            f"{one['s_per_frame'] / codes * 1e3:.2f} ms). Every decode step at TP=2 pays costs that do not shrink with "
            f"its work: at least {2 * layers} all-reduces ({layers} layers, two each: attention's output and the MLP's) "
            "and the hand-off of each step to two worker processes (TP=1 runs the model in the engine's own process). "
            "One rollout's step has too little work for each GPU's half of the weights to pay that back; a step of "
            "many rollouts (or a long prompt) has enough."]


PARTS_SHARE = ("preset", "n_ctx", "long_frames", "temperature", "seed")
"""The workload keys every part of a curve lease must share (repeats may differ: each row keeps its trials)."""


def parts_workload_line(parts: list[dict], may_differ: tuple[str, ...] = ()) -> str:
    """One sentence on the workload the parts of a lease share, read from the parts; ValueError where
    they differ in device, vLLM, dtype, `engine_kwargs` (but its keys in `may_differ`, e.g. a TP
    lease's `tensor_parallel_size`, named in the sentence with each part's value) or any of
    `PARTS_SHARE` (so a lease's rows compare like with like)."""
    def shared(p: dict) -> dict:
        return {k: v for k, v in (p.get("engine_kwargs") or {}).items() if k not in may_differ}

    def key(p: dict) -> tuple:
        return (p["env"]["device"], p["env"]["vllm"], p["dtype"], json.dumps(shared(p), sort_keys=True),
                tuple(p["workload"].get(k) for k in PARTS_SHARE))

    if len({key(p) for p in parts}) > 1:
        raise ValueError("the parts ran different settings: " + "; ".join(
            f"{p['command']}: {key(p)}" for p in parts))
    p, w = parts[0], parts[0]["workload"]
    cores = sorted({str(r.get("engine_core")) for q in parts for r in q["rows"] if "engine_core" in r})
    varied = "".join(f"; {k} by part: {', '.join(str((q.get('engine_kwargs') or {}).get(k)) for q in parts)}"
                     for k in may_differ)
    return (f"Every part ran one workload: {w['preset']} shape, {p['dtype']}, {w['n_ctx']} context + "
            f"{w['long_frames']} frames, temperature {w['temperature']}, seed {w['seed']}, vLLM {p['env']['vllm']} with "
            f"engine_kwargs {json.dumps(shared(p))}{varied} (the benchmark's engine settings, vLLM's defaults "
            f"otherwise); engine core: {', '.join(cores)} (every row).")


def seed_figures_table() -> str:
    """The seed's two figures as a table (context, not measured here)."""
    return "\n".join([
        "| the seed's figures (not measured here) | batch | frames per trial | s / frame | s/frame of seed HF ÷ this row's |",
        "|---|---:|---:|---:|---:|",
        f"| seed: HF (GPU not stated) | 1 | 22 | {SEED_FIGURES['seed HF (11.03 s)']:.2f} | 1.0x |",
        f"| seed: vLLM 0.6, eager | 1 | 22 | {SEED_FIGURES['seed vLLM 0.6 eager (4.25 s)']:.2f} | 2.6x |"])


def _rows_table(res: dict, seed: bool) -> list[str]:
    """The lines of one lease's table; `seed`: the seed's two figures as its last rows."""
    hf = next((r["frames_per_s"] for r in res["rows"] if r["name"] == "hf"), None)
    ratio_col = seed or hf is not None   # a lease without an `hf` row: its ratios are listed under the table
    lines = [f"| row | batch | frames per trial | s / frame (per rollout) | frames / s (all rollouts) |"
             + (f" {RATIO_LABEL} ({_hf_basis(res)}) |" if ratio_col else ""),
             "|---|---:|---:|---:|---:|" + ("---:|" if ratio_col else "")]
    for r in res["rows"]:
        ratio = (f" {r['frames_per_s'] / hf:.1f}x |" if hf and "frames_per_s" in r else " |") if ratio_col else ""
        if "frames_per_s" not in r:   # `bench tp`'s prefill row: prompt tokens, not frames
            lines.append(f"| {row_label(r['name'])}: {r['prompts']} prompts of {r['prompt_tokens']} tokens, "
                         f"{r['prefill_tokens_per_s']:.0f} prompt tokens/s | | | | |{ratio}")
            continue
        lines.append(f"| {row_label(r['name'])} | {r['batch']} | {r['frames']} | "
                     f"{r['s_per_frame']:.3f} | {r['frames_per_s']:.2f} |{ratio}")
    if seed:
        lines.append(f"| seed: HF (GPU not stated) | 1 | 22 | {SEED_FIGURES['seed HF (11.03 s)']:.2f} | | 1.0x (÷ seed HF) |")
        lines.append(f"| seed: vLLM 0.6, eager | 1 | 22 | {SEED_FIGURES['seed vLLM 0.6 eager (4.25 s)']:.2f} | | 2.6x (÷ seed HF) |")
    return lines


def _temperatures(res: dict) -> str:
    """'temperature 0.9', or each row's own where rows name theirs (the seed's rows: 1.0)."""
    temps = sorted({r.get("temperature", res["workload"]["temperature"]) for r in res["rows"]})
    return f"temperature {temps[0]}" if len(temps) == 1 else "temperatures " + ", ".join(map(str, temps)) + " (per row)"


def _lease_foot(res: dict, entries: list[dict], provenance: bool) -> str:
    """Under a lease's table: what measured it (`provenance`: commit and lease too), the workload,
    the prefix-cache hits, the lease's ratios, each with what it divides, its notes and what it
    failed to measure (its `errors`)."""
    where = f"{_provenance(res)} " if provenance else ""
    foot = (f"{where}{_software(res)}, {res['dtype']}, {res['date']}. Medians of repeated trials, "
            f"warm-up excluded; {_temperatures(res)}, {res['workload']['n_ctx']} context frames.")
    if res.get("prefix_cache_hit_rate") is not None:
        foot += f" Prefix-cache hits after the first frame: {100 * res['prefix_cache_hit_rate']:.1f}% of prompt tokens."
    if entries:
        foot += "\n\nRatios, each between two rows of this lease:\n" + "\n".join(f"- {ratio_line(e)}" for e in entries)
    if res.get("notes"):
        foot += "\n\nNotes:\n" + "\n".join(f"- {n}" for n in res["notes"])
    if res.get("errors"):
        foot += "\n\nNot measured (the lease's errors):\n" + "\n".join(f"- `{e['group']}`: {e['error']}" for e in res["errors"])
    return foot


def results_table(res: dict) -> str:
    """Markdown tables of a results file. One lease's (`merge`): its rows with the seed's figures
    beside them, what measured them, its ratios (each saying what it divides) and notes. A combined
    file (`combine`): the seed's figures, then lease by lease, each headed by its id, commit and
    lease, the same."""
    if not is_combined(res):
        return "\n".join(_rows_table(res, seed=True)) + "\n\n" + _lease_foot(res, ratio_entries(res), True)
    blocks = [seed_figures_table()]
    for lid, view in by_lease(res):
        blocks.append(f"**Lease `{lid}`**: {_provenance(view)}\n\n" + "\n".join(_rows_table(view, seed=False))
                      + "\n\n" + _lease_foot(view, ratio_entries(res, lid), False))
    return "\n\n".join(blocks)


README_START, README_END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"


def readme_section(results: dict[str, dict]) -> str:
    if not results:
        return "No GPU results are committed yet (`results/benchmark_<gpu>.json`)."

    def head(stem: str, res: dict) -> str:
        if not is_combined(res):
            return f"`results/{stem}.json`:"
        return (f"`results/{stem}.json` ({res['device']}; {len(res['leases'])} leases, each ratio between two rows "
                f"of one lease; `python -m terra_nb.bench combine` builds it from the lease files):")
    return "\n\n".join(f"{head(stem, res)}\n\n{results_table(res)}" for stem, res in results.items())


PROFILE_START, PROFILE_END = "<!-- profile-findings:start -->", "<!-- profile-findings:end -->"
PROFILE_FILES = ("profile_h200_port", "profile_h200_stock", "profile_h200_lean_port", "profile_h200_lean_stock")


def _section_s(profile: dict, label: str, phase: str | None = None) -> float:
    """A profile section's wall seconds, or one phase's seconds inside it."""
    sec = next(s for s in profile["sections"] if s["label"] == label)
    return sec["phases"][phase] if phase else sec["wall_s"]


def profile_findings(profiles: dict[str, dict] | None = None) -> str:
    """The README's two profile findings, with their figures read from the committed profiles
    (`bench profile` on the H200 hosts; PROFILE_FILES)."""
    from terra_nb.workbook.paths import RESULTS

    p = profiles or {stem: json.loads((RESULTS / f"{stem}.json").read_text()) for stem in PROFILE_FILES}
    ms = lambda x: f"{1000 * x:.1f} ms"  # noqa: E731
    front, decode1 = "front end: 32 requests, 1 token", "decode: 1 x 64 tokens"
    port, stock, lean, lean_stock = (p[k] for k in PROFILE_FILES)
    return "\n".join([
        "- the multimodal processor runs for every request of every frame step, so ours builds the engine",
        "  input from the frame layout (O(frames): slot ranges computed, items identified by a hash of their",
        f"  floats) instead of vLLM's generic path: {ms(_section_s(port, front, 'our_processor'))} for 32 requests "
        "on the H200 host",
        "  (`results/profile_h200_port.json`, phase `our_processor`: commit 12aaa6e, the 2026-11-23 curve lease);",
        "- vLLM calls `embed_input_ids` eagerly on every decode step of a multimodal model; a `torch.where`",
        f"  there made the port's decode step wait on the GPU (64 tokens on 1 request: {ms(_section_s(port, decode1))} "
        f"vs stock's {ms(_section_s(stock, decode1))},",
        "  with the same CPU work under cProfile; commit 12aaa6e, the 2026-11-23 curve lease). It is one",
        "  embedding gather now (commit b829047, measured on a second H200 lease of the same day against",
        f"  stock on that machine: {ms(_section_s(lean, decode1))} vs {ms(_section_s(lean_stock, decode1))}, "
        "`results/profile_h200_lean_*.json`), since the front",
        "  door refuses the ids it used to remap. (The profile files' `env.git_commit`, "
        f"{port['env']['git_commit']}, is",
        "  the device copy's stale .git.)",
    ])


def update_readme(readme: Path | None = None, results: dict[str, dict] | None = None) -> bool:
    """Rewrite the README's benchmark section and profile findings from the committed JSON;
    True if either changed."""
    from terra_nb.workbook.paths import REPO

    from terra_nb.workbook.results import rewrite_readme_section

    readme = Path(readme) if readme is not None else REPO / "README.md"
    body = readme_section(load_results() if results is None else results)
    changed = rewrite_readme_section(readme, README_START, README_END, body)
    if PROFILE_START in readme.read_text():
        changed |= rewrite_readme_section(readme, PROFILE_START, PROFILE_END, profile_findings())
    return changed


def report_rows(res: dict) -> list[dict]:
    """The seed's two figures followed by a results file's rows, as plain dicts for
    `results.record_result` (the report renders them as one table). `x_hf` is `RATIO_LABEL`: a
    row's frames/s ÷ its lease's HF row's (the seed's rows: ÷ the seed's HF). A combined file's rows
    also say their `lease`. Rows without frames (`bench tp`'s prefill rows) are left out."""
    s_hf = SEED_FIGURES["seed HF (11.03 s)"]
    out = [{"row": name, "batch": 1, "frames": 22, "s_per_frame": s, "frames_per_s": round(1 / s, 4),
            "x_hf": round(s_hf / s, 2)} for name, s in SEED_FIGURES.items()]
    for lid, view in by_lease(dict(res, rows=res.get("rows", []))):
        hf = next((r for r in view["rows"] if r["name"] == "hf"), None)
        for r in (r for r in view["rows"] if "frames_per_s" in r):
            out.append({"row": r["name"], "batch": r.get("batch", 1), "frames": r.get("frames"),
                        "s_per_frame": round(r["s_per_frame"], 4), "frames_per_s": round(r["frames_per_s"], 3),
                        "x_hf": round(r["frames_per_s"] / hf["frames_per_s"], 2) if hf else None,
                        **({"lease": lid} if lid else {})})
    return out


def load_sessions(results_dir: Path | None = None) -> dict[str, dict]:
    """Committed session-vs-frame-loop results (issue 24): {file stem: results}, results/sessions_*.json."""
    return load_results(results_dir, "sessions_*.json")


def sessions_table(res: dict) -> str:
    """Markdown: per batch, stock's frame loop and the sessions in frames/s, their ratio, and the
    memory floor (`with_floor`) with the share of it each reached; under it, what measured them."""
    pct = lambda x: "" if x is None else f"{x:.0%}"  # noqa: E731
    num = lambda x, f=".2f": "" if x is None else format(x, f)  # noqa: E731
    lines = ["| rollouts | stock frame loop (frames/s) | sessions (frames/s) | sessions ÷ stock | memory floor (frames/s) "
             "| stock, share of floor | sessions, share of floor |", "|---|---|---|---|---|---|---|"]
    for c in res["curve"]:
        lines.append(f"| {c['batch']} | {num(c['stock_frames_per_s'])} | {num(c.get('session_frames_per_s'))} "
                     f"| {num(c.get('session_vs_stock'), '.3f')} | {num(c.get('floor_frames_per_s'))} "
                     f"| {pct(c.get('stock_of_floor'))} | {pct(c.get('session_of_floor'))} |")
    w = res["workload"]
    lines += ["", f"{res['device']}, vLLM {res['versions']['vllm']}, {res['dtype'].replace('torch.', '')}, "
              f"{w['preset']} shape, {w['n_ctx']} context + {w['long_frames']} frames, temperature {w['temperature']}. "
              + _provenance(res)]
    return "\n".join(lines)
