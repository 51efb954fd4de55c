"""Speed levers: notebook 12's figures, from the committed GPU files and the toy world.

Two levers beyond stock vLLM, each priced from files in `results/faster/` (interleaved pairs, a
quality run, the acceptance run) and, on the CPU, from the toy world:

- **Frame copy** (`terra_nb.port.frame_copy`): propose the previous frame's codes, let vLLM verify
  them. A verification step costs more than a plain step (`step_s`, `step_cost_ratio`) and yields
  `codes_per_step` codes; it pays when `codes_per_step` exceeds the cost ratio
  (`break_even_codes_per_step`, `predicted_speedup`). How many codes a step a video would give is
  simulated exactly for greedy decoding with the proposer's own pure rule (`simulate_frame_copy`
  on `frame_copy_draft`), on the toy world's tokenized clips (`still_share`: where the video stands
  still).
- **FP8** (KV cache, weights): fewer bytes a step. What share of a step's bytes each would halve
  comes from the memory floor (`step_bytes`, built on `roofline`), and what it costs in quality
  from the quality file.

Every function here is pure (files in, numbers out) except the loaders and the toy-world helpers,
which build clips on the CPU. The acceptance file (`*_spec_acceptance_toy.json`) comes from
`tools/spec_acceptance.py`, which counts frame copy's acceptance with vLLM on those clips.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from terra_nb.bench import roofline
from terra_nb.bench.records import block, latest
from terra_nb.bench.stats import interval_text
from terra_nb.port.frame_copy import frame_copy_draft

FILES = ("fp8kv", "fp8kv_long", "spec_terra", "spec_toy", "spec_toy_greedy", "quality_toy", "fp8_weights_terra",
         "fp8_weights_toy", "spec_acceptance_toy")
"""The kinds of file in `results/faster/`: `<machine>_<date>_<kind>.json`."""

KS = (1, 2, 4, 8, 16)
"""Draft lengths the simulation sweeps."""


# ------------------------------------------------------------------ the files

def faster_dir() -> Path:
    from terra_nb.workbook.paths import RESULTS

    return RESULTS / "faster"


def load(kind: str, folder: Path | None = None) -> tuple[Path, dict]:
    """The newest `results/faster/*_<kind>.json` (by its recorded date, then name) and its contents."""
    return latest(f"*_{kind}.json", Path(folder) if folder is not None else faster_dir())


def load_all(folder: Path | None = None) -> dict[str, dict]:
    """{kind: contents} of every kind in `FILES`, each file's path under the key `"path"`."""
    out = {}
    for kind in FILES:
        path, res = load(kind, folder)
        out[kind] = dict(res, path=path)
    return out


# ------------------------------------------------------------------ a step's cost, from a pairs file

def pair(res: Mapping, first: str, second: str, block_name: str) -> dict:
    """The file's `analysis` entry of `first` vs `second` in a block (speed-up of first over second)."""
    return next(c for c in res["analysis"] if (c["first"], c["second"], c["block"]) == (first, second, block_name))


def steps_per_rollout(res: Mapping, block_name: str, side: str) -> float:
    """Engine steps one rollout took in one trial, from vLLM's counters over the block's trials:
    every step yields one code of the model's own, so steps = codes generated - drafts accepted."""
    b = block(res, block_name)
    c = b["counters"][side]
    steps = c["generation_tokens"] - c.get("spec_decode_num_accepted_tokens", 0.0)
    return steps / len(b["trials_s"][side]) / b["batch"]


def step_s(res: Mapping, block_name: str, side: str) -> float:
    """Seconds per engine step of a side: its median trial over its steps per rollout (a step
    advances every rollout of the batch at once). Everything a trial did counts, per-frame
    prefills and scheduling included."""
    return statistics.median(block(res, block_name)["trials_s"][side]) / steps_per_rollout(res, block_name, side)


def step_cost_ratio(res: Mapping, block_name: str, side: str, base: str) -> float:
    """How many times a step of `side` (e.g. one verifying k + 1 codes) costs a step of `base`."""
    return step_s(res, block_name, side) / step_s(res, block_name, base)


def codes_per_step(res: Mapping, block_name: str, side: str) -> float:
    """Codes per engine step a side got (vLLM's spec-decode counters; 1.0 without speculation)."""
    return float(block(res, block_name)["counters"][side]["codes_per_step"])


def break_even_codes_per_step(verify_step_s: float, plain_step_s: float) -> float:
    """Codes a verification step must yield on average to match plain decoding: a rollout of N
    codes takes N plain steps or N / c verification steps, equal when c = verify / plain."""
    if verify_step_s <= 0 or plain_step_s <= 0:
        raise ValueError(f"step times must be > 0, got {verify_step_s}, {plain_step_s}")
    return verify_step_s / plain_step_s


def predicted_speedup(codes_per_step: float, verify_step_s: float, plain_step_s: float) -> float:
    """Speed-up of speculation over plain decoding when its steps yield `codes_per_step` codes and
    cost `verify_step_s` against `plain_step_s`: (N plain steps) / (N / c verification steps)."""
    if codes_per_step < 1:
        raise ValueError(f"a step yields at least its own code, got {codes_per_step} codes per step")
    return codes_per_step / break_even_codes_per_step(verify_step_s, plain_step_s)


def step_cost_rows(files: Mapping[str, Mapping]) -> list[dict]:
    """Per measured speculative side: its step cost against the sync and the async port (same
    block), codes per step, the break-even codes per step against the async port and the speed-up
    measured there."""
    rows = []
    for kind, model in (("spec_terra", "Terra (random weights)"), ("spec_toy", "toy"), ("spec_toy_greedy", "toy")):
        res = files[kind]
        temp = res["plan"]["blocks"][0].get("temperature") if res.get("plan") else None
        for b in res["blocks"]:
            sides = b["trials_s"]
            for side in sides:
                if "_fc" not in side or not side.startswith("port"):
                    continue
                k = int(side.rsplit("_fc", 1)[1])
                row = {"model": model, "temperature": block(res, b["name"]).get("temperature", temp),
                       "rollouts": b["batch"], "k": k, "trials": len(sides[side]),
                       "codes/step": round(codes_per_step(res, b["name"], side), 3)}
                if "port_sync" in sides:
                    row["step cost vs sync"] = round(step_cost_ratio(res, b["name"], side, "port_sync"), 3)
                row["break-even vs async"] = round(break_even_codes_per_step(step_s(res, b["name"], side),
                                                                             step_s(res, b["name"], "port")), 3)
                row["measured vs async"] = pair(res, side, "port", b["name"])["speedup"]
                rows.append(row)
    return rows


def inverted(c: Mapping) -> dict:
    """An `analysis` entry read the other way round: second over first, interval flipped."""
    lo, hi = c["interval"]
    return dict(c, first=c["second"], second=c["first"], speedup=1 / c["speedup"], interval=[1 / hi, 1 / lo])


def ratio_text(c: Mapping) -> str:
    """"0.96x [0.93, 1.05], 5 trials a side" (one trial: no interval, said so)."""
    if c["trials"] < 2:
        return f"{c['speedup']:.2f}x (1 trial a side: no interval)"
    return f"{interval_text(c['speedup'], c['interval'])}, {c['trials']} trials a side"


# ------------------------------------------------------------------ bytes a step reads (the floor)

def weight_bytes_split(config, linear_bytes: int = 2, other_bytes: int = 2) -> dict[str, int]:
    """The weights one decode step reads (`roofline.streamed_weight_bytes`: all but the embedding
    tables), split into the output layer (`head`), the decoder layers' linear projections
    (`linears`, what vLLM's FP8 quantizes: its `Fp8Config` quantizes linear layers, not the LM head)
    and the rest (norms, the action projection), with the linears at `linear_bytes` a weight."""
    from terra_nb.port.checkpoints import weight_shapes

    out = {"head": 0, "linears": 0, "other": 0}
    for name, shape in weight_shapes(config).items():
        if "embed" in name:
            continue
        n = int(np.prod(shape))
        if name == "lm_head.weight":
            out["head"] += n * other_bytes
        elif name.startswith("model.layers.") and name.endswith("_proj.weight"):
            out["linears"] += n * linear_bytes
        else:
            out["other"] += n * other_bytes
    if linear_bytes == other_bytes == 2:
        assert sum(out.values()) == roofline.streamed_weight_bytes(config, 2)
    return out


def step_bytes(config, batch: int, n_ctx: int, n_frames: int, linear_bytes: int = 2, kv_bytes: int = 2) -> dict:
    """Bytes one decode step reads at the memory floor, averaged over a rollout of `n_frames` after
    `n_ctx`: the weights (`weight_bytes_split`) and `batch` rollouts' KV caches; `kv_share` is the
    KV's part of the total."""
    w = weight_bytes_split(config, linear_bytes)
    kv = batch * roofline.mean_context_tokens(config, n_ctx, n_frames) * roofline.kv_bytes_per_token(config, kv_bytes)
    total = sum(w.values()) + kv
    return dict(w, weights=sum(w.values()), kv=kv, total=total, kv_share=kv / total)


def fp8_predictions(config, batch: int, n_ctx: int, n_frames: int, measured_step_s: float, device: str) -> dict:
    """What FP8 could give at the memory floor, as two predictions per lever (not measurements):

    - `*_floor`: the floor's own ratio (bf16 bytes over FP8 bytes): the speed-up if the whole step
      scaled with its bytes;
    - `*_bytes_only`: only the bytes' time at the data-sheet bandwidth comes off the measured step
      (`measured_step_s`), everything else (launches, sampling, scheduling) stays.

    Levers: `kv` (FP8 KV cache: KV bytes halved) and `weights` (vLLM's FP8: the decoder's linear
    weights halved, the LM head left in bf16)."""
    bw = roofline.bandwidth_of(device)
    base = step_bytes(config, batch, n_ctx, n_frames)
    out = {"bf16": base, "floor_s": base["total"] / bw, "measured_step_s": measured_step_s,
           "of_floor": base["total"] / bw / measured_step_s}
    for lever, kw in (("kv", dict(kv_bytes=1)), ("weights", dict(linear_bytes=1))):
        fp8 = step_bytes(config, batch, n_ctx, n_frames, **kw)
        saved_s = (base["total"] - fp8["total"]) / bw
        out[lever] = fp8
        out[f"{lever}_floor"] = base["total"] / fp8["total"]
        out[f"{lever}_bytes_only"] = measured_step_s / (measured_step_s - saved_s)
    return out


# ------------------------------------------------------------------ the toy world: where the video stands still

def still(codes: np.ndarray, n_context: int) -> np.ndarray:
    """Whether each generated code equals the code at the same position of the frame before:
    codes [..., n_frames, P] (context first) -> bool [..., n_frames - n_context, P]."""
    codes = np.asarray(codes)
    if codes.shape[-2] <= n_context:
        raise ValueError(f"need frames after the {n_context} context frames, got {codes.shape[-2]} frames")
    return codes[..., n_context:, :] == codes[..., n_context - 1:-1, :]


def still_share(codes: np.ndarray, n_context: int) -> np.ndarray:
    """Per grid position, the share of generated codes equal to the previous frame's: [P]."""
    s = still(codes, n_context)
    return s.reshape(-1, s.shape[-1]).mean(0)


def simulate_frame_copy(frames: Sequence[Sequence[int]] | np.ndarray, k: int, n_context: int,
                        action_tokens: int) -> tuple[int, int]:
    """(codes, engine steps) frame copy takes to generate `frames[n_context:]` of one rollout in
    greedy decoding, with the proposer's own rule (`frame_copy_draft`, at most `k` drafts): the
    first two counts of `frame_copy_acceptance`."""
    r = frame_copy_acceptance(frames, k, n_context, action_tokens)
    return r["codes"], r["steps"]


def frame_copy_acceptance(frames: Sequence[Sequence[int]] | np.ndarray, k: int, n_context: int,
                          action_tokens: int) -> dict:
    """What frame copy does on one rollout, step by step, in greedy decoding: codes, engine steps,
    and vLLM's spec-decode counts (`drafts`: steps that verified at least one drafted code;
    `draft_codes`; `accepted`; `accepted_per_pos[i]`: drafts accepted through position i, as
    vLLM's `spec_decode_num_accepted_tokens_per_pos` counts; `drafted_per_pos[i]`: drafts that
    reached position i).

    Greedy verification keeps the longest prefix of the draft equal to the codes the model
    generates, plus one code of its own: so with `frames` the model's greedy output (or a video
    it would reproduce), this is the count vLLM makes. A frame's first code comes from the
    prefill step of its request (the frame loop asks for each frame in a request of its own)."""
    frames = np.asarray(frames)
    n, P = frames.shape
    if not 0 < n_context < n:
        raise ValueError(f"n_context must be in 1..{n - 1} for {n} frames, got {n_context}")
    slots = [-1] * action_tokens  # the action slots: never drafted, their ids do not matter
    history: list[int] = []
    for f in range(n_context):
        history += [int(t) for t in frames[f]] + slots
    out = dict(codes=P * (n - n_context), steps=0, drafts=0, draft_codes=0, accepted=0,
               accepted_per_pos=[0] * k, drafted_per_pos=[0] * k)
    for f in range(n_context, n):
        true = [int(t) for t in frames[f]]
        history.append(true[0])  # the prefill step samples the first code
        out["steps"], j = out["steps"] + 1, 1
        while j < P:
            draft = frame_copy_draft(history, P, action_tokens, k)
            accepted = next((i for i, d in enumerate(draft) if d != true[j + i]), len(draft))
            if draft:
                out["drafts"], out["draft_codes"], out["accepted"] = (out["drafts"] + 1, out["draft_codes"] + len(draft),
                                                                      out["accepted"] + accepted)
                for i in range(len(draft)):
                    out["drafted_per_pos"][i] += 1
                    out["accepted_per_pos"][i] += i < accepted
            history += true[j:j + accepted + 1]
            out["steps"], j = out["steps"] + 1, j + accepted + 1
        history += slots
    return out


def codes_per_step_curve(clips: np.ndarray, n_context: int, action_tokens: int, ks: Sequence[int] = KS) -> dict[int, float]:
    """{k: codes per step} of `simulate_frame_copy` over clips [n_clips, n_frames, P] together."""
    out = {}
    for k in ks:
        codes = steps = 0
        for clip in np.asarray(clips):
            c, s = simulate_frame_copy(clip, k, n_context, action_tokens)
            codes, steps = codes + c, steps + s
        out[int(k)] = codes / steps
    return out


def eval_clip_codes(n_clips: int = 8, n_context: int = 3, n_frames: int = 12) -> tuple[np.ndarray, list[str]]:
    """The toy world's held-out clips (`score.eval_clips`: one per manoeuvre kind), tokenized:
    (codes [n_clips, n_context + n_frames, 64], kinds)."""
    from terra_nb.toyworld.score import eval_clips
    from terra_nb.toyworld.tokenizer import ToyTokenizer

    tok = ToyTokenizer.load()
    clips = eval_clips(n_clips, n_context, n_frames)
    return np.stack([tok.encode(c.frames) for c in clips]), [c.kind for c in clips]


def workload_inputs(n_context: int = 3):
    """The GPU plans' toy workload: `workload.sample_for("toy")`'s inputs (the demo clip, "turn left"
    after a straight road, `TOY_FRAMES` frames of actions after the context), with its true frames
    (`.clip.frames`) and the tokenizer (`.tokenizer`): a `toyworld.workbook.WorkbookInputs`."""
    from terra_nb.bench.workload import TOY_FRAMES
    from terra_nb.toyworld.workbook import workbook_inputs

    return workbook_inputs("tiny", "toy", n_frames=TOY_FRAMES, n_context=n_context)


def acceptance_rows(res: Mapping, groups: Mapping[str, Sequence[str]]) -> list[dict]:
    """Per group of clips (name -> clip names): codes per step and acceptance at each draft
    position (accepted through it / drafts), as vLLM counted and as simulated."""
    rows = []
    for group, names in groups.items():
        clips = [c for c in res["clips"] if c["clip"] in names]
        for source in ("vllm", "simulated"):
            n = lambda key: sum(c[source][key] for c in clips)  # noqa: E731
            gen = n("generation_tokens") if source == "vllm" else n("codes")
            steps = gen - n("spec_decode_num_accepted_tokens") if source == "vllm" else n("steps")
            drafts = n("spec_decode_num_drafts") if source == "vllm" else n("drafts")
            pos = np.sum([c[source]["accepted_per_pos"] for c in clips], axis=0)
            rows.append({"clips": group, "counted by": "vLLM" if source == "vllm" else "simulation",
                         "codes/step": round(gen / steps, 3), "drafts": int(drafts),
                         **{f"pos {i + 1}": f"{v / drafts:.0%}" for i, v in enumerate(pos)}})
    return rows


# ------------------------------------------------------------------ figures

def still_maps_plot(maps: Mapping[str, np.ndarray], grid: tuple[int, int] = (8, 8), save=None):
    """One 8x8 heat map a panel: per grid position, the share of codes equal to the previous frame's
    (`still_share`), titled with the panel's mean."""
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import save_figure

    n = len(maps)
    cols = min(n, 5)
    rows = -(-n // cols)
    fig = Figure(figsize=(1.9 * cols + 0.8, 2.1 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    im = None
    for ax, (name, share) in zip(axes, maps.items()):
        im = ax.imshow(np.asarray(share).reshape(grid), vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"{name}\n{np.mean(share):.0%} still", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[n:]:
        ax.set_axis_off()
    fig.colorbar(im, ax=list(axes[:n]), shrink=0.8, label="share equal to previous frame")
    return save_figure(fig, save)


def speculation_plot(curves: Mapping[str, Mapping[int, float]], break_even: Mapping[str, float],
                     measured: Sequence[Mapping] = (), save=None):
    """Left: simulated codes per step against k per workload, the break-even lines of each engine
    and the codes per step the GPU measured. Right: the predicted speed-up (codes per step over
    break-even) against k, workload x engine, with the measured speed-ups as points."""
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import save_figure

    fig = Figure(figsize=(10, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    styles = ["-", "--", ":", "-."]
    for i, (name, curve) in enumerate(curves.items()):
        ks = sorted(curve)
        left.plot(ks, [curve[k] for k in ks], "o" + styles[i % len(styles)], color="k", label=name)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for j, (engine, be) in enumerate(break_even.items()):
        c = colors[j % len(colors)]
        left.axhline(be, color=c, lw=1, label=f"break-even: {engine}")
        for i, (name, curve) in enumerate(curves.items()):
            ks = sorted(curve)
            right.plot(ks, [curve[k] / be for k in ks], styles[i % len(styles)], color=c, marker="o", ms=3,
                       label=f"{engine}, {name}")
    for m in measured:
        left.plot(m["k"], m["codes_per_step"], "x", color="tab:purple", ms=8)
        right.plot(m["k"], m["speedup"], "x", color="tab:purple", ms=8)
    if measured:
        left.plot([], [], "x", color="tab:purple", label="measured on the GPU (toy)")
        right.plot([], [], "x", color="tab:purple", label="measured on the GPU (toy)")
    right.axhline(1.0, color="grey", lw=0.8)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(KS), [str(k) for k in KS])
        ax.set_xlabel("k (draft codes a step, at most)")
    left.set_ylabel("codes per engine step (simulated, greedy)")
    right.set_ylabel("speed-up over the async port (predicted)")
    left.legend(fontsize=6.5)
    right.legend(fontsize=6)
    left.set_title("what frame copy would verify per step", fontsize=9)
    right.set_title("prediction: codes per step / break-even", fontsize=9)
    return save_figure(fig, save)


# ------------------------------------------------------------------ FP8: quality

def why_not_run(error: str) -> str:
    """A variant's failure in a few words for a table: what stopped it, not the whole message (the
    file keeps that)."""
    if "memory" in error.lower():
        return "did not run: too little free GPU memory when its engine started"
    kind = error.split(":", 1)[0]
    return f"did not run: {kind} (the file's `error` says where)"


def quality_rows(q: Mapping) -> list[dict]:
    """The quality file's variants against HF float32: teacher-forced top-1 agreement, largest
    logprob gap, path error of greedy rollouts (held-out and counterfactual clips), or why it did not run."""
    rows = []
    for name, v in q["variants"].items():
        settings = ", ".join(f"{k}={val}" for k, val in v["settings"].items())
        if "error" in v:
            rows.append({"variant": name, "settings": settings, "top-1 agreement": why_not_run(v["error"])})
            continue
        rows.append({"variant": name, "settings": settings, "top-1 agreement": f"{100 * v['top1_agreement']:.2f}%",
                     "largest logprob gap": v["max_logprob_gap"], "path error (m)": v["ade_m"],
                     "counterfactual path error (m)": v["counterfactual_ade_m"]})
    return rows


def acceptance_plot(rows: Sequence[Mapping], save=None):
    """Acceptance at each draft position (accepted through it / drafts) per group of clips: vLLM's
    counters as bars, the simulation as crosses."""
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import save_figure

    fig = Figure(figsize=(6.4, 3.2), layout="constrained")
    ax = fig.subplots()
    groups = list(dict.fromkeys(r["clips"] for r in rows))
    width = 0.8 / len(groups)
    for g, group in enumerate(groups):
        for r in rows:
            if r["clips"] != group:
                continue
            pos = [int(k.split()[1]) for k in r if k.startswith("pos ")]
            vals = [float(r[f"pos {i}"].rstrip("%")) / 100 for i in pos]
            x = np.array(pos) + (g - (len(groups) - 1) / 2) * width
            if r["counted by"] == "vLLM":
                ax.bar(x, vals, width, label=f"{group}: vLLM, {r['codes/step']:.2f} codes/step")
            else:
                ax.plot(x, vals, "kx", ms=6, label="simulation" if g == 0 else None)
    ax.set_xlabel("draft position")
    ax.set_ylabel("drafts accepted through it")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    return save_figure(fig, save)


def break_even_rows(spec: Mapping, got: Mapping[str, float]) -> list[dict]:
    """Per batch of the Terra-shape speculation file: what async scheduling off costs, what a
    verification step costs against a plain one (both sync), and the codes a step a drafter must
    average to pay against the port as it ships (the product), i.e. drafts accepted a step;
    `got`: codes per step some drafter reached (name -> value), each read against it."""
    rows = []
    for b in spec["blocks"]:
        sync = pair(spec, "port_sync", "port", b["name"])
        verify = step_cost_ratio(spec, b["name"], "port_fc8", "port_sync")
        be = break_even_codes_per_step(step_s(spec, b["name"], "port_fc8"), step_s(spec, b["name"], "port"))
        rows.append({"rollouts": b["batch"], "async off (speed-up)": ratio_text(sync),
                     "a verification step (k = 8) costs, vs sync": f"{verify:.2f}x",
                     "break-even codes/step": f"{be:.2f}", "accepted drafts a step needed": f"{be - 1:.2f}",
                     **{name: f"{cps / be:.2f}x" for name, cps in got.items()}})
    return rows
