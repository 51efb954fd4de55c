"""The benchmark's analysis: pure functions over rows and results files, no I/O, no Markdown.

Ratios between two rows of one lease (`Ratio`, `RATIOS`, `lease_ratios`, `tp_ratios`,
`ratio_entry`, each saying in words what it divides), trials (`trial_spread`), the batch curve and
its memory floors (`throughput_curve`, `with_floor`, `decode_floor_share`), digests of profiles
(`profile_digest`, `step_digest`, `overhead_ceiling`) and the curve's targets (`CURVE_TARGETS`,
`target_met`). `results` stores what these compute; `render` turns it into tables and sentences.
"""
from __future__ import annotations

import dataclasses

from terra_nb.bench.workload import PREFILL, row_batch, row_engine, tp_row, tp_row_parts


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
    return WHO.get(name) or tp_who(name, "the port") or f"{CURVE_WHO[row_engine(name)]}, {_at_once(row_batch(name))}"


def tp_who(name: str, port: str) -> str | None:
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
        if curve_engine(a) in CURVE_WHO and curve_engine(b) in CURVE_WHO and row_batch(a) == row_batch(b) > 1:
            return (f"{unit} of {CURVE_WHO[curve_engine(a)]} ÷ {short} of {CURVE_WHO[curve_engine(b)]}, "
                    f"{row_batch(a)} rollouts at once each")
        return f"{unit} of {_who(a)} ÷ {short} of {_who(b)}"


RATIOS = (
    Ratio("speedup_vs_hf", "hf", "vllm", "s_per_frame"),
    Ratio("vllm_vs_stock", "stock_llama", "vllm", "s_per_frame"),      # the port's speed-up: above 1, the port is faster
    Ratio("eager_vs_hf", "hf", "vllm_eager", "s_per_frame"),
    # the seed's setting: HF's s/frame over the port's, as the seed's 11.03 / 4.25
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
    batches = sorted({row_batch(n) for n in names if curve_engine(n) == "stock_llama"})
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


def curve_engine(name: str) -> str | None:
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


TRIALS_DISAGREE = 1.5
"""Slowest over fastest trial above which a row's median hides more than it says (two trials: their mean)."""


def trial_spread(row: dict | None) -> float:
    """A row's slowest trial over its fastest (1.0 for one trial or no row)."""
    trials = (row or {}).get("trials_s") or [1.0]
    return max(trials) / min(trials)


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
        if trial_spread(num) >= trial_spread(den):
            ends, of = [t / den[ratio.quantity] for t in (min(a), max(a))], ratio.numerator
        else:
            ends, of = [num[ratio.quantity] / t for t in (max(b), min(b))], ratio.denominator
        entry.update(trials_range=ends, trials_of=of, trials_spread=max(trial_spread(num), trial_spread(den)))
    return entry


def throughput_curve(rows: list[dict]) -> list[dict]:
    """Frames per second of the port and of stock at each batch both measured, and their ratio;
    with session rows (`session_b<N>`), also the sessions' frames per second and their ratio to
    stock's frame loop."""
    def fps(kind: str) -> dict:
        return {r["batch"]: r["frames_per_s"] for r in rows if curve_engine(r["name"]) == kind and "tp" not in r}

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
    (`bench merge` writes the full profiles beside the results file.)"""
    from terra_nb.bench.profiling import compare

    if not profiles:
        return None
    out = {e: dict(sections=[dict(label=s["label"], wall_s=s["wall_s"], phases=s["phases"]) for s in p["sections"]],
                   kernels=[{k: v for k, v in k_.items() if not k.startswith("top_")} for k_ in p.get("kernels", [])])
           for e, p in profiles.items()}
    if {"port", "stock"} <= profiles.keys():
        out["port_vs_stock"] = compare(profiles["port"], profiles["stock"])
    return out


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


CURVE_TARGETS = {1: 0.97, 32: 0.95, 128: 0.95}
"""The targets for the port against stock vLLM Llama (both rows of one lease), by batch: the least
speed-up of the port over stock (its frames/s ÷ stock's, the same as stock's s/frame ÷ the port's):
at most 3% slower at 1 rollout, 5% at 32 and 128."""


def curve_quantity(batch: int) -> str:
    """What a curve ratio divides at `batch`: frames/s (all rollouts) at every batch, so that every
    ratio is a speed-up of the port (at 1 rollout the inverse of s/frame)."""
    return "frames_per_s"


def curve_pairs(rows: list[dict]) -> list[tuple[int, dict, dict]]:
    """[(batch, the port's row, stock's row)] for every batch where one lease measured both."""
    by = {r["name"]: r for r in rows if "tp" not in r}
    stock = {row_batch(n): r for n, r in by.items() if curve_engine(n) == "stock_llama"}
    port = {row_batch(n): r for n, r in by.items() if curve_engine(n) == "vllm"}
    return [(b, port[b], stock[b]) for b in sorted(stock.keys() & port.keys())]


def target_met(ratio: float, batch: int) -> bool | None:
    """Whether `ratio` (the port's ÷ stock's `curve_quantity`) meets `CURVE_TARGETS` at `batch`."""
    bound = CURVE_TARGETS.get(batch)
    if bound is None:
        return None
    return ratio >= bound


def trial_ratios(port: dict, stock: dict, quantity: str, vary) -> list[float]:
    """The port's ÷ stock's `quantity` trial by trial: each trial of a side named in `vary` ('the
    port', 'stock'), the median of the other; both named: every pair of trials."""
    a = (_per_trial(port, quantity) or [port[quantity]]) if "the port" in vary else [port[quantity]]
    d = (_per_trial(stock, quantity) or [stock[quantity]]) if "stock" in vary else [stock[quantity]]
    return [x / y for x in a for y in d]
