"""A drafter for the toy world model, for vLLM's own speculative decoding (`method="draft_model"`).

    python -m terra_nb.toyworld.drafter        # the toy model's rollouts -> a tiny Llama -> data/toy/drafter/

At one rollout a decode step costs about the same whatever the model, so only more codes a step
can make a frame faster. A drafter is a small language model over the same ids as the target: it
proposes the next `k` codes, the target verifies them in one step, and vLLM's rejection sampler
keeps the output exact (greedy: the same codes; sampling: the same distribution).

The drafter is a stock `LlamaForCausalLM` (vocab 513, one layer), so vLLM loads it with no code of
ours: `speculative_config={"method": "draft_model", "model": "data/toy/drafter",
"num_speculative_tokens": k}`. It is text-only: it sees the token ids as vLLM's engine holds them,
64 codes then six action-slot ids a frame, positions restarting at 0 with every round, and never
the actions' values. What it is trained on is exactly that:

1. **Rollouts of the target** (`rollout_sequences`): seeded toy clips give 3 context frames and
   their actions; the toy model (HF, on the CPU) generates a full round (22 more frames), half of
   the rollouts greedy, half sampled at the public generator's temperature.
2. **The target's choices as labels** (`teacher_labels`): one teacher-forced pass of the target
   over each rollout gives its argmax at every position whose next token is a code. vLLM drafts
   greedily and accepts a draft with the target's probability of it, so matching the target's
   argmax is what acceptance rewards, greedy or sampled.
3. **Training** (`train_drafter`): cross-entropy on those labels, AdamW, cosine schedule, seeded.

`record` (saved as `drafter_training.json` beside the weights) holds the settings, the loss
curve, the device, the seconds, and, on held-out rollouts, how often the drafter's argmax is the
target's and the codes a greedy step would then keep (`simulated_acceptance`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .tokenizer import ToyTokenizer, toy_data_dir

DRAFTER_SEED = 50_000_000
"""Clip seeds of the drafter's rollouts: apart from the tokenizer's, the training's and the evaluation's."""

IGNORE = -100

DEFAULTS = dict(
    n_rollouts=96,        # rollouts of one round each (3 context + 22 generated frames)
    rollout_batch=24,     # greedy and sampled batches in turn
    n_context=3,
    temperature=0.9,      # the sampled half's (the public generator's default)
    hidden=128,
    layers=1,
    heads=4,              # head size 32: one that vLLM's attention takes on the CPU and the GPU
    intermediate=256,
    steps=400,
    batch=8,
    window=1750,          # ids a training window holds: a whole round (shorter windows never see
                          # the longer distances the engine's drafter attends over, and agree less)
    lr=3e-3,
    warmup=30,
    held_out=8,           # rollouts kept out of training for the record's agreement figures
    seed=0,
    threads=1,            # tiny matrices: more threads only wait at OpenMP barriers on a shared CPU
)
"""Measured on held-out rollouts (300 steps): one layer of hidden 64 agreed with the target on 70%
of codes, one of 128 (4 heads) on 74%, two of 128 on 76% at three times the training time."""

def drafter_dir() -> Path:
    """data/toy/drafter: the shipped drafter (config.json + model.safetensors + its training record)."""
    return toy_data_dir() / "drafter"


def speculative_config(k: int = 4, model: str | Path | None = None) -> dict:
    """vLLM's `speculative_config` for a draft model (default: the shipped toy drafter) proposing
    at most `k` codes a step; `ValueError` for a bad `k` or a folder without a drafter."""
    return checked_speculative_config("draft_model", k, Path(model) if model is not None else drafter_dir(),
                                      "drafter", "terra_nb.toyworld.drafter")


def checked_speculative_config(method: str, k, path: Path, what: str, module: str) -> dict:
    """`speculative_config` for vLLM's `method` with the drafter in `path`, after checking `k` and
    that `path` holds a `what` (`module` is the command that makes one)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1 (draft codes per step), got {k!r}")
    if not (path / "config.json").exists():
        raise ValueError(f"no {what} in {path} (config.json missing): run `python -m {module}`")
    return {"method": method, "model": str(path), "num_speculative_tokens": int(k)}


# ---------------------------------------------------------------------------- the model
def drafter_config(target_config, hidden: int, layers: int, heads: int, intermediate: int):
    """A `LlamaConfig` over the target's ids and one round's positions (the target's `max_model_len`)."""
    from transformers import LlamaConfig

    special = target_config.vocab_size - 1  # bos/eos/pad and the action-slot id
    rounds = target_config.num_temporal_embeddings * (target_config.num_image_patches + target_config.num_action_embeddings)
    return LlamaConfig(architectures=["LlamaForCausalLM"], vocab_size=target_config.vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                       head_dim=hidden // heads, max_position_embeddings=rounds, rms_norm_eps=1e-6,
                       bos_token_id=special, eos_token_id=special, pad_token_id=special,
                       tie_word_embeddings=False, torch_dtype="float32")


def new_drafter(config, seed: int):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def save_drafter(model, out: str | Path, record: dict | None = None) -> Path:
    """config.json + model.safetensors (vLLM's draft-model format, bfloat16: half the bytes in git; the
    engine casts them to its dtype) + drafter_training.json."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.to_json_file(str(out / "config.json"))
    if record is not None:
        (out / "drafter_training.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


def rounded(model):
    """`model` with its weights rounded to bfloat16 (what `save_drafter` keeps), in float32."""
    return model.to(torch.bfloat16).float()


def load_drafter(path: str | Path | None = None):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(path or drafter_dir()), dtype=torch.float32).eval()


# ---------------------------------------------------------------------------- the data
def clip_inputs(n: int, n_frames: int, n_context: int, seed0: int = DRAFTER_SEED):
    """Context codes [n, n_context, 64] and actions [n, n_frames, 6, 3] of `n` seeded toy clips."""
    from .scene import generate_clip

    tok = ToyTokenizer.load()
    clips = [generate_clip(seed0 + i, n_frames=n_frames) for i in range(n)]
    context = torch.from_numpy(np.stack([tok.encode(c.frames[:n_context]) for c in clips]).astype(np.int64))
    return context, torch.from_numpy(np.stack([c.actions for c in clips]).astype(np.float32))


def engine_ids(frames: torch.Tensor, layout) -> torch.Tensor:
    """Frames [B, F, P] -> the ids vLLM's engine holds for them [B, F * (P + A)] (codes, then slots)."""
    from terra_nb.port.layout import build_prompt

    return torch.tensor([build_prompt(f, layout) for f in frames], dtype=torch.long)


def rollout_sequences(target, n: int, n_context: int, temperature: float, batch: int, seed: int, bar=None):
    """`n` one-round rollouts of the target: frames [n, F, P] (context then generated) and actions.

    Even batches greedy, odd ones sampled at `temperature` (seeded)."""
    from terra_nb.port.layout import FrameLayout
    from terra_nb.port.rollout import SamplingConfig, hf_rollout

    layout = FrameLayout.from_config(target.config)
    context, actions = clip_inputs(n, layout.max_frames, n_context, DRAFTER_SEED + 1000 * seed)
    out = []
    for i, s in enumerate(range(0, n, batch)):
        sampling = SamplingConfig(temperature=0.0 if i % 2 == 0 else temperature, seed=seed + i)
        new = hf_rollout(target, context[s:s + batch], actions[s:s + batch], layout.max_frames - n_context,
                         sampling, progress=False)
        out.append(torch.cat([context[s:s + batch], new], dim=1))
        if bar is not None:
            bar.update(len(new))
    return torch.cat(out), actions


@torch.inference_mode()
def teacher_labels(target, frames: torch.Tensor, actions: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """The target's argmax over image codes at every engine position whose next id is a code
    (`IGNORE` elsewhere and at the last position): [B, F * (P + A)]."""
    from terra_nb.port.layout import FrameLayout

    layout = FrameLayout.from_config(target.config)
    ids = engine_ids(frames, layout)
    labels = []
    for s in range(0, len(frames), batch):
        codes = frames[s:s + batch].reshape(len(frames[s:s + batch]), -1)
        logits = target(input_ids=codes, actions=actions[s:s + batch, :frames.shape[1]]).logits
        labels.append(logits[..., : layout.num_codes].argmax(-1))
    return torch.where(next_is_code(ids, layout), torch.cat(labels), IGNORE)


def next_is_code(ids: torch.Tensor, layout) -> torch.Tensor:
    """Where the next id is an image code (not an action slot; False at the last position)."""
    out = torch.zeros_like(ids, dtype=torch.bool)
    out[:, :-1] = ids[:, 1:] != layout.placeholder_id
    return out


def code_labels(ids: torch.Tensor, layout) -> torch.Tensor:
    """The next code wherever one follows (`IGNORE` elsewhere): the labels a greedy rollout gives,
    whose codes are the target's argmax."""
    return torch.where(next_is_code(ids, layout), torch.roll(ids, -1, 1), IGNORE)


# ---------------------------------------------------------------------------- training
def drafter_loss(drafter, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = drafter(input_ids=ids).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def crops(ids: torch.Tensor, labels: torch.Tensor, batch: int, window: int, g: torch.Generator):
    """`batch` random windows of `window` ids (and their labels) from random sequences. The
    drafter's rotary positions are relative, so a window trains what a whole round would, at a
    fraction of the attention's cost; the rollouts' first frames are as likely as any."""
    rows = torch.randint(len(ids), (batch,), generator=g)
    starts = torch.randint(ids.shape[1] - window + 1, (batch,), generator=g)
    take = starts[:, None] + torch.arange(window)[None]
    return ids[rows[:, None], take], labels[rows[:, None], take]


def train_drafter(drafter, ids: torch.Tensor, labels: torch.Tensor, steps: int, batch: int, window: int,
                  lr: float, warmup: int, seed: int, bar=None) -> list[float]:
    """Train in place on windows of (engine ids, teacher labels); returns the loss of every step."""
    return train_in_place(drafter, lambda g: drafter_loss(drafter, *crops(ids, labels, batch, window, g)),
                          steps, lr, warmup, seed, bar)


def train_in_place(model, batch_loss, steps: int, lr: float, warmup: int, seed: int, bar=None) -> list[float]:
    """`steps` of AdamW on `batch_loss(g)` (one seeded batch's loss, `g` the run's generator),
    warm-up then cosine, gradients clipped at 1; returns the loss of every step."""
    from .train import warmup_cosine

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = warmup_cosine(opt, warmup, steps)
    g = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(steps):
        loss = batch_loss(g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    model.eval()
    return losses


# ---------------------------------------------------------------------------- how good it is
@torch.inference_mode()
def agreement(drafter, ids: torch.Tensor, labels: torch.Tensor, layout) -> torch.Tensor:
    """Per image code [B, F, P]: does the drafter's argmax at the position before it equal the
    target's (frame 0's first code, which nothing precedes, counts as a disagreement)."""
    agree = drafter(input_ids=ids).logits.argmax(-1) == labels
    B, L = ids.shape
    frames = L // layout.frame_len
    before = (torch.arange(frames)[:, None] * layout.frame_len + torch.arange(layout.image_tokens)[None] - 1).flatten()
    out = agree[:, before.clamp(min=0)].reshape(B, frames, layout.image_tokens)
    out[:, 0, 0] = False
    return out


def acceptance_by_position(agree: torch.Tensor, n_context: int) -> list[float]:
    """How often the drafter's argmax is the target's code, by the code's position in its frame,
    over the generated frames (`agree` from `agreement`)."""
    return [round(float(x), 4) for x in agree[:, n_context:].float().mean((0, 1))]


def simulated_steps(agree: torch.Tensor, image_tokens: int, k: int, n_context: int) -> tuple[int, int]:
    """(codes, request steps) of greedy decoding with `k` drafts over the generated frames of `agree`
    (from `agreement`): vLLM samples a frame's first code at the prefill, then each step keeps the
    drafts up to the first disagreement and one code of the target's own."""
    codes = steps = 0
    for row in agree[:, n_context:].reshape(-1, image_tokens).tolist():
        i = 1  # code 0 came with the prefill
        while i < image_tokens:
            n = min(k, image_tokens - 1 - i)
            run = 0
            while run < n and row[i + run]:
                run += 1
            i += run + 1
            codes += run + 1
            steps += 1
    return codes, steps


def simulated_acceptance(agree: torch.Tensor, image_tokens: int, k: int, n_context: int) -> float:
    """Mean codes a greedy step keeps with `k` drafts (`simulated_steps`): what vLLM's spec-decode
    counters give as generated / (generated - accepted), but for the prefill's code."""
    codes, steps = simulated_steps(agree, image_tokens, k, n_context)
    return codes / steps


def greedy_parity(engines: dict, rollouts: int, frames: int, k: int, seed0: int = DRAFTER_SEED + 999_000) -> dict:
    """Greedy rollouts of `frames` frames after 3 context frames (more than 22 cross a round) on each
    engine of `engines` (name -> a function building it; built one at a time, each shut down before
    the next): the codes of the first two compared, and the shipped drafter's agreement with the
    first engine's first round by a code's position in its frame (greedy: where a draft is accepted)."""
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import engine_layout, vllm_rollout

    context, actions = clip_inputs(rollouts, 3 + frames, 3, seed0)
    codes = {}
    for name, build in engines.items():
        llm = build()
        try:
            layout, _ = engine_layout(llm)
            codes[name] = vllm_rollout(llm, context, actions, frames, SamplingConfig(temperature=0), progress=False)
        finally:
            shutdown_llm(llm)
    first, second = list(codes.values())[:2]
    ids = engine_ids(torch.cat([context, first[:, : layout.max_frames - 3]], 1), layout)
    agree = agreement(load_drafter(), ids, code_labels(ids, layout), layout)
    return dict(rollouts=rollouts, frames=frames, codes=first.numel(), equal=int((first == second).sum()),
                first_difference=None if torch.equal(first, second) else (first != second).nonzero()[0].tolist(),
                acceptance_by_position=acceptance_by_position(agree, 3),
                simulated_codes_per_step=simulated_acceptance(agree, layout.image_tokens, k, 3))


# ---------------------------------------------------------------------------- the command
def check_settings(overrides: dict, defaults: dict, what: str) -> dict:
    """`defaults` updated by `overrides`; `ValueError` naming an unknown setting or a bad `held_out`."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"unknown {what} setting(s) {unknown}; the settings are {sorted(defaults)}")
    hp = {**defaults, **overrides}
    if not 0 < hp["held_out"] < hp["n_rollouts"]:
        raise ValueError(f"held_out must lie in 1..n_rollouts-1, got {hp['held_out']} of {hp['n_rollouts']}")
    return hp


def target_and_rollouts(hp: dict, progress: bool):
    """The toy model, its layout and its seeded rollouts (`rollout_sequences`) for a drafter's data."""
    from tqdm.auto import tqdm

    from terra_nb.port.layout import FrameLayout

    from .score import load_toy_model

    torch.set_num_threads(int(hp["threads"]))
    torch.manual_seed(hp["seed"])
    target = load_toy_model()
    with tqdm(total=hp["n_rollouts"], unit="rollout", desc="target rollouts", disable=not progress) as bar:
        frames, actions = rollout_sequences(target, hp["n_rollouts"], hp["n_context"], hp["temperature"],
                                            hp["rollout_batch"], hp["seed"], bar)
    return target, FrameLayout.from_config(target.config), frames, actions


def held_out_rows(hp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(held, greedy): the rollouts kept out of training (every n-th, greedy and sampled alike), and
    which of the held-out ones are greedy (batches alternate greedy and sampled)."""
    every = hp["n_rollouts"] // hp["held_out"]
    held = torch.arange(hp["n_rollouts"]) % every == every - 1
    return held, (torch.arange(hp["n_rollouts"]) // hp["rollout_batch"] % 2 == 0)[held]


def training_record(hp: dict, t_data: float, t_train: float, losses: list[float], model, module: str) -> dict:
    """What every drafter's record holds: settings, loss curve, size, seconds, device, and the
    command (`python -m module ...`) when `module` runs as the program."""
    from .train import cpu_info

    return {
        "settings": hp, "data_seconds": round(t_data, 1), "train_seconds": round(t_train, 1),
        "final_loss": round(float(np.mean(losses[-20:])), 4), "losses": [round(x, 4) for x in losses[::10]],
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__, **cpu_info(),
        "command": " ".join([f"python -m {module}", *sys.argv[1:]]) if sys.modules["__main__"].__spec__ is not None
        and sys.modules["__main__"].__spec__.name == module else None,
    }


def command_line(build_fn, defaults: dict, doc: str, default_out: str, argv=None):
    """`python -m ...`: one `--setting` option for each of `defaults`, then `build_fn(out=..., **settings)`."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=f"output folder (default {default_out})")
    for k, v in defaults.items():
        ap.add_argument(f"--{k.replace('_', '-')}", dest=k, type=type(v), default=v)
    a = ap.parse_args(argv)
    build_fn(out=a.out, **{k: getattr(a, k) for k in defaults})


def build(out=None, log=print, progress: bool = True, save: bool = True, **overrides):
    """Rollouts -> labels -> training -> (drafter, record); saved to `out` (default data/toy/drafter)."""
    from tqdm.auto import tqdm

    hp = check_settings(overrides, DEFAULTS, "drafter")
    t0 = time.time()
    target, layout, frames, actions = target_and_rollouts(hp, progress)
    labels = teacher_labels(target, frames, actions)
    ids = engine_ids(frames, layout)
    t_data = time.time() - t0
    log(f"data: {len(ids)} rollouts x {ids.shape[1]} ids ({t_data:.0f} s)")

    held, greedy = held_out_rows(hp)
    train = ~held
    drafter = new_drafter(drafter_config(target.config, hp["hidden"], hp["layers"], hp["heads"], hp["intermediate"]),
                          hp["seed"])
    t0 = time.time()
    with tqdm(total=hp["steps"], unit="step", desc="drafter", disable=not progress) as bar:
        losses = train_drafter(drafter, ids[train], labels[train], hp["steps"], hp["batch"], hp["window"],
                               hp["lr"], hp["warmup"], hp["seed"], bar)
    t_train = time.time() - t0
    drafter = rounded(drafter)  # judged as it is saved
    agree = agreement(drafter, ids[held], labels[held], layout)
    record = {
        **training_record(hp, t_data, t_train, losses, drafter, "terra_nb.toyworld.drafter"),
        "held_out_agreement": round(float(agree[:, hp["n_context"]:].float().mean()), 4),
        "simulated_acceptance": {kind: {str(k): round(simulated_acceptance(agree[rows], layout.image_tokens, k,
                                                                           hp["n_context"]), 3) for k in (2, 4, 8)}
                                 for kind, rows in (("greedy", greedy), ("sampled", ~greedy)) if bool(rows.any())},
        "acceptance_by_position": acceptance_by_position(agree, hp["n_context"]),
    }
    log(f"drafter: loss {record['final_loss']}, held-out agreement {record['held_out_agreement']}, "
        f"simulated codes/step {record['simulated_acceptance']} ({t_train:.0f} s)")
    if save:
        path = save_drafter(drafter, out or drafter_dir(), record)
        log(f"saved {path}")
    return drafter, record


if __name__ == "__main__":
    command_line(build, DEFAULTS, __doc__, "data/toy/drafter")
