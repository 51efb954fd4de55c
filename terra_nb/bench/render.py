"""The benchmark in words: Markdown tables, the sentences and notes of a lease (computed from its
rows, as `bench merge --curve-notes / --seed-notes / --tp-notes` write them), and the README's
benchmark section and profile findings. Figures come from `analysis`, files from `results`.
"""
from __future__ import annotations

import json
from pathlib import Path

from terra_nb.bench.analysis import (CURVE_TARGETS, QUANTITY_WORDS, TRIALS_DISAGREE, WHO, curve_engine, curve_pairs,
                                     curve_quantity, overhead_ceiling, rollouts_text, target_met, tp_ratios, tp_who,
                                     trial_ratios, trial_spread)
from terra_nb.bench.results import by_lease, is_combined, load_results, ratio_entries
from terra_nb.bench.workload import SEED_FIGURES, SEED_ROWS, row_batch, row_engine, tp_row, tp_row_parts


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
        return tp_who(name, "our port")
    who = {"vllm": "our port", "session": "our port, one session per rollout"}.get(row_engine(name), "stock vLLM Llama")
    return f"{who}, {row_batch(name)} rollouts at once"


RATIO_LABEL = "frames/s ÷ HF's frames/s"
"""What `results_table`'s ratio column and `report_rows`' `x_hf` divide: a row's frames per second
(all its rollouts together) by the HF row's (batch 1), each over the frames its own trials ran."""


def _hf_basis(res: dict) -> str:
    hf = next((r for r in res["rows"] if r["name"] == "hf"), None)
    return f"HF: batch 1, {hf['frames']} frames per trial" if hf else "no HF row"


STEP_ENGINES = {"stock_llama": "stock, frame loop", "vllm": "our port, frame loop", "session": "our port, sessions"}


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


HF_SEED_ROWS = {"hf_seed": "HF", "hf_seed_flash": "HF with cuDNN attention off"}
"""HF's rows in the seed's setting and their words: `hf_seed` as torch chooses its attention kernel,
`hf_seed_flash` with cuDNN's left out (`measure.HF_FLASH_BACKENDS`)."""


def seed_setting_lines(res: dict) -> list[str]:
    """Sentences on the seed's setting, every figure from `res`'s seed rows: the ratio
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
    hf = next((by[n] for n in HF_SEED_ROWS if n in by and trial_spread(by[n]) <= TRIALS_DISAGREE), None)
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
    spread = trial_spread(hf)
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
                             + f" s, slowest ÷ fastest {trial_spread(r):.2f}x"
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


TRIALS_NOTE = 1.05
"""Slowest over fastest trial above which `curve_target_lines` gives the ratio trial by trial."""


def _target_words(ratio: float, batch: int) -> str:
    """'target at least 0.95x: met, 0.043 over', '... missed, 0.007 short', or 'no target at this batch'."""
    bound, ok = CURVE_TARGETS.get(batch), target_met(ratio, batch)
    if ok is None:
        return "no target at this batch"
    return f"target at least {bound:.2f}x: " + (f"met, {ratio - bound:.3f} over" if ok else f"missed, {bound - ratio:.3f} short")


def _range_words(ratios: list[float], batch: int) -> str:
    """'0.805x to 0.950x, met with each' (or 'missed with each', 'met with some and missed with
    others'; no verdict where `batch` has no target)."""
    ok = {target_met(r, batch) for r in ratios}
    verdict = ("" if None in ok else ", met with each" if ok == {True} else ", missed with each" if ok == {False}
               else ", met with some and missed with others")
    return f"{min(ratios):.3f}x to {max(ratios):.3f}x{verdict}"


def _trials_text(row: dict) -> str:
    """A row's trials in seconds, as the lease notes quote them: '43.50, 45.09'."""
    return ", ".join(f"{t:.2f}" for t in row["trials_s"])


def curve_target_lines(res: dict) -> list[str]:
    """Sentences on one lease's batch curve, every figure from its rows: which of
    `CURVE_TARGETS` the port ÷ stock ratio meets; per batch both rows' figures, their ratio against
    the target (met or missed, by how much), each side's trials in seconds, and where a side's
    slowest trial is over `TRIALS_NOTE` times its fastest, the ratio from each of its trials (against
    the other side's median; both sides: every pair) and whether each meets the target; each
    engine's batch of most frames/s; the batch-1 rows' decode probes. Empty without a curve pair.
    One lease at a time (a combined file's leases through `by_lease`)."""
    if is_combined(res):
        raise ValueError("curve_target_lines reads one lease: pass lease_results(res, lid), see by_lease")
    pairs = curve_pairs(res["rows"])
    if not pairs:
        return []
    ratios = {b: port[curve_quantity(b)] / stock[curve_quantity(b)] for b, port, stock in pairs}
    verdicts = [f"{rollouts_text(b)} " + ("not measured" if b not in ratios else "met" if target_met(ratios[b], b) else "missed")
                for b in CURVE_TARGETS]
    met = sum(b in ratios and target_met(ratios[b], b) for b in CURVE_TARGETS)
    lines = [f"The targets, the port's speed-up over stock vLLM Llama in this lease: {met} of {len(CURVE_TARGETS)} met ("
             + ", ".join(verdicts) + ")."]
    for b, port, stock in pairs:
        q, ratio = curve_quantity(b), ratios[b]
        line = (f"{rollouts_text(b)}: the port {port[q]:.3f} frames/s, stock {stock[q]:.3f} frames/s: {ratio:.3f}x "
                f"(the port's speed-up, frames/s of the port ÷ stock's; {_target_words(ratio, b)}). "
                + ("One trial each, in" if len(port["trials_s"]) == len(stock["trials_s"]) == 1 else "Trials in")
                + f" seconds (a trial: {rollouts_text(b)} x {port['frames']} frames): the port {_trials_text(port)}; stock {_trials_text(stock)}")
        sides = (("the port", port), ("stock", stock))
        wide = [who for who, r in sides if trial_spread(r) > TRIALS_NOTE]
        if wide:   # a side's trials disagree: the ratio from each of them against the other side's median
            each = trial_ratios(port, stock, q, vary=wide)
            spread = "; ".join(f"{who}'s slowest {trial_spread(r) - 1:.1%} over its fastest" for who, r in sides if who in wide)
            whose = " and ".join(f"{w}'s" for w in wide)
            against = "against the other's median" if len(wide) == 1 else "against each other"
            line += f" ({spread}: from each of {whose} trials {against} the ratio is {_range_words(each, b)})"
        elif b in CURVE_TARGETS and len({target_met(r, b) for r in trial_ratios(port, stock, q, ("the port", "stock"))}) > 1:
            # trials that agree within TRIALS_NOTE, but the verdict still turns on which trial is taken
            line += (" (trial by trial, every trial of the port's against every one of stock's, the ratio is "
                     f"{_range_words(trial_ratios(port, stock, q, ('the port', 'stock')), b)})")
        lines.append(line + ".")
    best = {who: max((r for r in res["rows"] if curve_engine(r["name"]) == engine and "tp" not in r),
                     key=lambda r: r["frames_per_s"]) for who, engine in (("the port", "vllm"), ("stock", "stock_llama"))}
    lines.append("Most frames/s of each engine: " + ", ".join(
        f"{who} {r['frames_per_s']:.2f} at {rollouts_text(r['batch'])}" for who, r in best.items())
        + f" (batches measured: {', '.join(str(b) for b, _, _ in pairs)}).")
    probed = next(((b, port["probe"], stock["probe"]) for b, port, stock in pairs if port.get("probe") and stock.get("probe")), None)
    if probed:   # each engine probes once, on the first row it measured (`bench_vllm`, `bench_stock`)
        b, p, s = probed
        lines.append(f"Decode probe of the {b}-rollout rows (`measure.decode_probe`: one frame on a cached prompt, "
                     f"medians): the port {p['decode_ms_per_token']:.3f} ms per code, stock {s['decode_ms_per_token']:.3f} "
                     f"(the port's speed-up {s['decode_ms_per_token'] / p['decode_ms_per_token']:.2f}x); a frame "
                     f"{p['frame_s']:.3f} s vs {s['frame_s']:.3f} s ({s['frame_s'] / p['frame_s']:.2f}x), where the "
                     f"rollouts' frames/s gave {ratios[b]:.3f}x.")
    return lines


def tp_lease_notes(res: dict) -> list[str]:
    """Sentences on one lease's `bench tp` rows, every figure from the rows: TP=2 ÷ TP=1
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
    lines = ["| row | batch | frames per trial | s / frame (per rollout) | frames / s (all rollouts) |"
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
"""The committed profiles `profile_findings` quotes: the port's and stock's, before and after the port's
decode step became one embedding gather."""


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
    `terra_nb.workbook.results.record_result` (the report renders them as one table). `x_hf` is `RATIO_LABEL`: a
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
