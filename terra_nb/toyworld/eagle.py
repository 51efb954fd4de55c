"""An EAGLE head for the toy world model, for vLLM's own speculative decoding (`method="eagle"`).

    python -m terra_nb.toyworld.eagle        # the toy model's rollouts -> an EAGLE head -> data/toy/eagle/

A draft model (`toyworld.drafter`) guesses the next codes from the ids alone. An EAGLE head also
reads the target's last hidden state, the vector its output layer turns into the next code's
logits, so it starts from what the target already knows. vLLM runs it beside the target with no
code of ours: `speculative_config={"method": "eagle", "model": "data/toy/eagle",
"num_speculative_tokens": k}`, and, unlike a draft model, in 0.26's fast (V2) model runner.

**What vLLM runs** (`EagleLlamaForCausalLM`, the same on 0.26 and 0.32). At a position `t` whose
target hidden state is `h_t` (the output of the backbone's final norm: what the port's `forward`
returns and the output layer reads) and whose next id is `x_{t+1}`:

    z = fc([embed(x_{t+1}); h_t])                  # fc: 2H -> H, no bias
    a = z + attn(z)                                # one Llama layer without its input norm, RoPE at t
    g = a + mlp(post_attention_layernorm(a))       # no final norm
    logits = lm_head(g)                            # the draft of x_{t+2}

`embed` and `lm_head` are the target's own (vLLM shares them when the checkpoint has none; the
port's `get_language_model()` shows them where vLLM looks). For the next draft vLLM feeds the head
its own `g` as the hidden state, the draft as the id, one position on, attending over the target-fed
entries before it and its own earlier drafts (`llm_base_proposer.propose`, 0.26's
`AutoRegressiveSpeculator`). The next target step rewrites the head's cache over the accepted codes.

**Training** mimics exactly that, on the toy target's own rollouts (`drafter.rollout_sequences`):
the target's hidden states and, as labels, its argmax (`drafter.teacher_labels`); the head unrolled
`depth` drafts deep at every position at once (`EagleHead.unroll`, EAGLE-3's "training-time test"),
draft `s` attending over the target-fed entries up to its base and the earlier drafts of that base.
`record` (saved as `eagle_training.json`) holds the settings, the loss curve, the device, the
seconds and, on held-out rollouts, each draft's agreement with the target and the codes a greedy
step keeps (`simulated_codes_per_step`, counted as vLLM's spec-decode counters count them).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .drafter import (IGNORE, check_settings, checked_speculative_config, command_line, engine_ids, held_out_rows,
                      target_and_rollouts, teacher_labels, train_in_place, training_record)
from .tokenizer import toy_data_dir

DEFAULTS = dict(
    n_rollouts=96,        # rollouts of one round each (3 context + 22 generated frames)
    rollout_batch=12,     # greedy and sampled batches in turn
    n_context=3,
    temperature=0.9,      # the sampled half's (the public generator's default)
    heads=4,              # head size 32: one that vLLM's attention takes on the CPU and the GPU
    intermediate=256,
    depth=3,              # drafts unrolled in training (vLLM's later drafts reuse what they learn)
    steps=600,
    batch=4,
    window=350,           # bases a training window holds (5 frames); the head reads the target's
                          # hidden state, which already sums up the whole context
    lr=6e-3,
    warmup=20,
    held_out=8,           # rollouts kept out of training for the record's figures
    seed=1,               # the drafter's rollouts are seed 0: these are other clips
    threads=1,            # small matrices: more threads only wait at OpenMP barriers on a shared CPU
)
"""Measured on held-out rollouts (first-draft agreement; greedy codes a step with 4 drafts): 48
rollouts and 300 steps 71%, 2.56; 48 and 600 steps 77%, 2.88 (a window of 700 at 300 steps: 74%);
96 and 600 steps 83%, 3.08; 96 and 1000 steps 82%, 3.07 (it starts to learn the rollouts by heart)."""


def eagle_dir() -> Path:
    """data/toy/eagle: the shipped head (config.json + model.safetensors + its training record)."""
    return toy_data_dir() / "eagle"


def speculative_config(k: int = 4, model: str | Path | None = None) -> dict:
    """vLLM's `speculative_config` for an EAGLE head (default: the shipped toy head) proposing at most
    `k` codes a step; `ValueError` for a bad `k` or a folder without a head."""
    return checked_speculative_config("eagle", k, Path(model) if model is not None else eagle_dir(),
                                      "EAGLE head", "terra_nb.toyworld.eagle")


# ---------------------------------------------------------------------------- the head
def eagle_config(target_config, heads: int, intermediate: int):
    """The head's `LlamaConfig`: the target's width, vocabulary and round (vLLM's `EAGLEConfig`
    turns `LlamaForCausalLM` into `EagleLlamaForCausalLM`); one layer."""
    from transformers import LlamaConfig

    H = target_config.hidden_size
    special = target_config.vocab_size - 1
    rounds = target_config.num_temporal_embeddings * (target_config.num_image_patches + target_config.num_action_embeddings)
    return LlamaConfig(architectures=["LlamaForCausalLM"], vocab_size=target_config.vocab_size, hidden_size=H,
                       intermediate_size=intermediate, num_hidden_layers=1, num_attention_heads=heads,
                       num_key_value_heads=heads, head_dim=H // heads, max_position_embeddings=rounds,
                       rms_norm_eps=target_config.rms_norm_eps, rope_parameters=dict(target_config.rope_parameters),
                       bos_token_id=special, eos_token_id=special, pad_token_id=special,
                       tie_word_embeddings=False, torch_dtype="float32")


class EagleLayer(nn.Module):
    """vLLM's EAGLE decoder layer: a Llama layer whose input norm is the identity."""

    def __init__(self, config):
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        H, d = config.hidden_size, config.head_dim
        self.heads, self.head_dim = config.num_attention_heads, d
        self.self_attn = nn.Module()
        for name, (i, o) in dict(q_proj=(H, self.heads * d), k_proj=(H, self.heads * d), v_proj=(H, self.heads * d),
                                 o_proj=(self.heads * d, H)).items():
            setattr(self.self_attn, name, nn.Linear(i, o, bias=False))
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        theta = config.rope_parameters["rope_theta"]
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d), persistent=False)

    def qkv(self, z: torch.Tensor, positions: torch.Tensor):
        """q, k, v [B, heads, T, d] of `z` [B, T, H], q and k rotated at `positions` [T] (neox style, as vLLM's)."""
        B, T, _ = z.shape
        split = lambda x: x.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = (split(p(z)) for p in (self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj))
        freqs = positions.float()[:, None] * self.inv_freq[None]
        cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
        rot = lambda x: x * cos + torch.cat([-x[..., self.head_dim // 2:], x[..., : self.head_dim // 2]], -1) * sin  # noqa: E731
        return rot(q), rot(k), v

    def finish(self, z: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input `z` and the attention's heads [B, heads, T, d]."""
        B, _, T, _ = attended.shape
        a = z + self.self_attn.o_proj(attended.transpose(1, 2).reshape(B, T, -1))
        return a + self.mlp(self.post_attention_layernorm(a))


def tree_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Draft `len(keys)` of every base at once: the query of base `t` attends to the first pass's
    entries up to `t` (the target-fed ones) and to the entries its own earlier drafts wrote (one each,
    the same base): what vLLM's cache holds when it runs that draft."""
    T = q.shape[2]
    scale = q.shape[-1] ** -0.5
    first = (q @ keys[0].transpose(-1, -2)) * scale
    first = first.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    own = [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]
    w = torch.softmax(torch.cat([first, *own], -1), -1)
    out = w[..., :T] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + w[..., T + i: T + i + 1] * v
    return out


class EagleHead(nn.Module):
    """The weights vLLM's `EagleLlamaForCausalLM` loads (`fc`, `layers.0.*`), under the checkpoint's
    names; the token embedding and output layer are the target's, passed in."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([EagleLayer(config)])

    def unroll(self, embed: nn.Module, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
               depth: int) -> list[torch.Tensor]:
        """The head's output `g` of drafts 1..`depth` at every base `t` of a window: draft `s` reads
        the id `tokens[:, t + s - 1]` (`tokens` [B, T + depth - 1]), the target's `hidden[:, t]` (draft
        1) or draft `s - 1`'s output, at position `positions[t] + s - 1`."""
        layer, T = self.layers[0], hidden.shape[1]
        keys, values, outs, g = [], [], [], hidden
        for s in range(depth):
            z = self.fc(torch.cat([embed(tokens[:, s: s + T]), g], -1))
            q, k, v = layer.qkv(z, positions + s)
            keys.append(k)
            values.append(v)
            g = layer.finish(z, tree_attention(q, keys, values))
            outs.append(g)
        return outs


def new_head(config, seed: int) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(config).float()
    for m in head.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=config.initializer_range)
    return head


def save_head(head: EagleHead, out: str | Path, record: dict | None = None) -> Path:
    """config.json + model.safetensors (bfloat16: the engine casts them to its dtype) + eagle_training.json."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    head.config.to_json_file(str(out / "config.json"))
    if record is not None:
        (out / "eagle_training.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


def load_head(path: str | Path | None = None) -> EagleHead:
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    path = Path(path or eagle_dir())
    head = EagleHead(LlamaConfig.from_pretrained(str(path)))
    head.load_state_dict({k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()})
    return head.eval()


def rounded(head: EagleHead) -> EagleHead:
    """`head` with its weights rounded to bfloat16 (what `save_head` keeps), in float32."""
    return head.to(torch.bfloat16).float()


# ---------------------------------------------------------------------------- the data
@torch.inference_mode()
def target_hidden(target, frames: torch.Tensor, actions: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """The target's last hidden state (after its final norm: what vLLM hands an EAGLE head) at every
    engine position of `frames` [B, F, P] with `actions`, teacher-forced: [B, F * (P + A), H]."""
    out = []
    for s in range(0, len(frames), batch):
        codes = frames[s:s + batch].reshape(len(frames[s:s + batch]), -1)
        x = target.embed_interleaved(codes, actions[s:s + batch, :frames.shape[1]])
        out.append(target.model(inputs_embeds=x, use_cache=False).last_hidden_state)
    return torch.cat(out)


def shifted(x: torch.Tensor, by: int, fill: int) -> torch.Tensor:
    """`x` [B, L] moved `by` to the left along its last axis, `fill` past the end."""
    return torch.cat([x[:, by:], torch.full_like(x[:, :by], fill)], 1)


def head_inputs(ids: torch.Tensor, labels: torch.Tensor, depth: int, placeholder_id: int):
    """Per base `t`: the ids draft 1.. reads (`ids[t + 1 ..]`, [B, L + depth - 1]) and each draft's
    label (`labels[t + s]`, the target's argmax for `x_{t + s + 1}`: [depth, B, L])."""
    tokens = torch.cat([ids[:, 1:], torch.full_like(ids[:, :depth], placeholder_id)], 1)
    return tokens, torch.stack([shifted(labels, s, IGNORE) for s in range(1, depth + 1)])


# ---------------------------------------------------------------------------- training
def unrolled_logits(head, target, tokens, hidden, positions, depth):
    return [target.lm_head(g) for g in head.unroll(target.model.embed_tokens, tokens, hidden, positions, depth)]


def head_loss(head, target, tokens, hidden, labels, positions) -> torch.Tensor:
    """Mean over drafts of the cross-entropy against the target's argmax (`labels` [depth, B, T])."""
    logits = unrolled_logits(head, target, tokens, hidden, positions, len(labels))
    return sum(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lb.reshape(-1), ignore_index=IGNORE)
               for lg, lb in zip(logits, labels)) / len(labels)


def windows(tokens, hidden, labels, batch: int, window: int, g: torch.Generator):
    """`batch` random windows of `window` bases from random rollouts: (tokens, hidden, labels, positions)."""
    rows = torch.randint(len(hidden), (batch,), generator=g)
    start = int(torch.randint(hidden.shape[1] - window + 1, (1,), generator=g))
    depth = labels.shape[0]
    return (tokens[rows, start: start + window + depth - 1], hidden[rows, start: start + window],
            labels[:, rows, start: start + window], torch.arange(start, start + window))


def train_head(head, target, tokens, hidden, labels, steps: int, batch: int, window: int, lr: float, warmup: int,
               seed: int, bar=None) -> list[float]:
    """Train in place on windows of (ids, target hidden states, labels); returns every step's loss."""
    for p in target.parameters():
        p.requires_grad_(False)
    return train_in_place(head, lambda g: head_loss(head, target, *windows(tokens, hidden, labels, batch, window, g)),
                          steps, lr, warmup, seed, bar)


# ---------------------------------------------------------------------------- how good it is
@torch.inference_mode()
def draft_agreement(head, target, ids, hidden, labels, depth: int, placeholder_id: int) -> torch.Tensor:
    """[depth, B, L]: does draft `s` at base `t` (the head unrolled over whole sequences, its earlier
    drafts given the rollout's ids) equal the target's argmax for `x_{t + s + 1}`; False where that
    id is not a code."""
    tokens, lab = head_inputs(ids, labels, depth, placeholder_id)
    out = []
    for b in range(len(ids)):
        logits = unrolled_logits(head, target, tokens[b:b + 1], hidden[b:b + 1], torch.arange(ids.shape[1]), depth)
        out.append(torch.stack([lg.argmax(-1)[0] for lg in logits]))
    agree = torch.stack(out, 1)
    return (agree == lab) & (lab != IGNORE)


def code_bases(layout, n_frames: int) -> torch.Tensor:
    """[F, P]: the base of the first draft of each code, two positions before it (negative in frame
    0, which a rollout never generates)."""
    return torch.arange(n_frames)[:, None] * layout.frame_len + torch.arange(layout.image_tokens)[None] - 2


def simulated_steps(agree: torch.Tensor, layout, k: int, first_frame: int) -> tuple[int, int]:
    """(codes, request steps) of greedy decoding with `k` drafts over frames `first_frame..` of
    `agree` (from `draft_agreement`, depth >= k): vLLM samples a frame's first code at the prefill,
    then each step keeps the drafts up to the first disagreement and one code of the target's own."""
    if agree.shape[0] < k:
        raise ValueError(f"agreement of {agree.shape[0]} drafts cannot count steps of {k}")
    bases = code_bases(layout, agree.shape[2] // layout.frame_len)[first_frame:]
    P, codes, steps = layout.image_tokens, 0, 0
    for row in agree.permute(1, 2, 0).tolist():          # [L][depth] per rollout
        for frame in bases.tolist():
            i = 1                                         # code 0 came with the prefill
            while i < P:
                n, run = min(k, P - 1 - i), 0
                while run < n and row[frame[i]][run]:
                    run += 1
                i += run + 1
                codes += run + 1
                steps += 1
    return codes, steps


def simulated_codes_per_step(agree, layout, k: int, first_frame: int) -> float:
    """Mean codes a greedy step keeps with `k` drafts: vLLM's generated / (generated - accepted), but
    for the prefill's code."""
    codes, steps = simulated_steps(agree, layout, k, first_frame)
    return codes / steps


def draft_rates(agree: torch.Tensor, labels: torch.Tensor, first_base: int) -> list[float]:
    """Per draft: how often it is the target's argmax where that is a code, over bases `first_base..`
    (`labels` from `head_inputs`)."""
    valid = labels[:, :, first_base:] != IGNORE
    return [round(float(a / n), 4) for a, n in zip(agree[:, :, first_base:].sum((1, 2)), valid.sum((1, 2)))]


def first_draft_by_position(agree: torch.Tensor, layout, first_frame: int) -> list[float]:
    """How often the first draft of a code is the target's, by the code's position in its frame."""
    F_ = agree.shape[2] // layout.frame_len
    bases = code_bases(layout, F_)[first_frame:]
    first = agree[0][:, bases.clamp(min=0)]               # [B, F', P]
    return [round(float(x), 4) for x in first.float().mean((0, 1))]


# ---------------------------------------------------------------------------- the command
def build(out=None, log=print, progress: bool = True, save: bool = True, **overrides):
    """Rollouts -> hidden states and labels -> training -> (head, record); saved to `out`
    (default data/toy/eagle)."""
    from tqdm.auto import tqdm

    hp = check_settings(overrides, DEFAULTS, "EAGLE")
    t0 = time.time()
    target, layout, frames, actions = target_and_rollouts(hp, progress)
    ids, labels = engine_ids(frames, layout), teacher_labels(target, frames, actions)
    hidden = target_hidden(target, frames, actions)
    t_data = time.time() - t0
    log(f"data: {len(ids)} rollouts x {ids.shape[1]} positions ({t_data:.0f} s)")

    held, greedy = held_out_rows(hp)
    tokens, lab = head_inputs(ids, labels, hp["depth"], layout.placeholder_id)
    head = new_head(eagle_config(target.config, hp["heads"], hp["intermediate"]), hp["seed"])
    t0 = time.time()
    with tqdm(total=hp["steps"], unit="step", desc="EAGLE head", disable=not progress) as bar:
        losses = train_head(head, target, tokens[~held], hidden[~held], lab[:, ~held], hp["steps"], hp["batch"],
                            hp["window"], hp["lr"], hp["warmup"], hp["seed"], bar)
    t_train = time.time() - t0
    head = rounded(head)   # judged as it is saved
    agree = draft_agreement(head, target, ids[held], hidden[held], labels[held], 8, layout.placeholder_id)
    record = {
        **training_record(hp, t_data, t_train, losses, head, "terra_nb.toyworld.eagle"),
        "held_out_agreement": round(float(np.mean(first_draft_by_position(agree, layout, hp["n_context"]))), 4),
        "draft_agreement": draft_rates(agree, head_inputs(ids[held], labels[held], 8, layout.placeholder_id)[1],
                                       hp["n_context"] * layout.frame_len - 2),
        "simulated_codes_per_step": {kind: {str(k): round(simulated_codes_per_step(agree[:, rows], layout, k,
                                                                                   hp["n_context"]), 3) for k in (2, 4, 8)}
                                     for kind, rows in (("greedy", greedy), ("sampled", ~greedy)) if bool(rows.any())},
        "first_draft_by_position": first_draft_by_position(agree, layout, hp["n_context"]),
    }
    log(f"EAGLE head: loss {record['final_loss']}, held-out first-draft agreement {record['held_out_agreement']}, "
        f"simulated codes/step {record['simulated_codes_per_step']} ({t_train:.0f} s)")
    if save:
        path = save_head(head, out or eagle_dir(), record)
        log(f"saved {path}")
    return head, record


if __name__ == "__main__":
    command_line(build, DEFAULTS, __doc__, "data/toy/eagle")
