"""Fuzzing a real engine with bad requests: every one is refused with a message naming the problem,
and the engine keeps serving exactly as before.

A few hundred seeded requests, each a good request (1-4 frames of the tiny checkpoint, random
codes with code 0, random actions in one of the three accepted forms, `-3` or in-vocabulary slots)
broken in one to three ways at once: ids past the vocabulary, negative, not ints, beyond int64;
prompts cut or lengthened, without their actions, too long; actions with NaN/inf, values beyond
float32, wrong shapes and dtypes, missing or extra frames; sampling parameters out of range.
Every request must raise `ValueError` or vLLM's `VLLMValidationError` whose message contains a
phrase of one of the faults applied. Then a good greedy and a good seeded request must return the
tokens they returned before the fuzzing.

A batch with one bad request among good ones is refused as a whole: vLLM adds a batch's requests
one by one and, when one raises, aborts those already added and re-raises. No output comes back,
nothing is left in the engine, and the good requests sent again give the tokens they give alone.

One engine for the module (`max_frames=6` for a short start; eager on the CPU). On a GPU the same
test runs with vLLM's defaults (CUDA graphs) on 30% of the memory.
"""
from __future__ import annotations

import random

import pytest
import torch

from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from terra_nb.port.layout import SEED_PLACEHOLDER, build_prompt
from terra_nb.port.vllm_compat import shutdown_llm
from terra_nb.port.vllm_rollout import make_llm

N_REQUESTS = 300
MAX_FRAMES = 6  # engine: prompts of at most 5 frames
BAD = (ValueError, VLLMValidationError)  # VLLMValidationError is no ValueError on vLLM 0.32


def engine_options() -> dict:
    if torch.cuda.is_available():
        return {"gpu_memory_utilization": 0.3}
    return {"enforce_eager": True}  # skips a minute of torch.compile on two cores


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    engine = make_llm(tiny_ckpt, max_frames=MAX_FRAMES, **engine_options())
    yield engine
    shutdown_llm(engine)


def greedy(layout, n=4):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)


def seeded(layout, n=4):
    return SamplingParams(max_tokens=n, temperature=1.0, seed=11, ignore_eos=True, detokenize=False)


def tokens(llm, requests, params) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(requests, params, use_tqdm=False)]


# ---------------------------------------------------------------------------- the good request
class Case:
    """A request under construction: prompt ids, actions, params, and the phrases its error may name."""

    def __init__(self, rng: random.Random, layout):
        self.rng, self.layout = rng, layout
        self.n = rng.randint(1, 4)
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        codes = torch.randint(0, layout.num_codes, (self.n, layout.image_tokens), generator=g)
        codes[0, 0] = 0
        slot = rng.choice([SEED_PLACEHOLDER, layout.placeholder_id])
        self.ids: object = build_prompt(codes, layout, placeholder=slot)
        self.actions: object = torch.randn(self.n, layout.action_tokens, layout.action_dim, generator=g) * 3
        self.form = rng.choice(["flat", "stacked", "list"])
        self.mm: object = "actions"  # "actions": {"actions": <actions>}; else the literal value
        self.params = greedy(layout)
        self.expect: list[str] = []
        self.faults: list[str] = []

    def request(self) -> dict:
        a = self.actions
        if isinstance(a, torch.Tensor) and a.dim() == 3 and self.form == "flat":
            a = a.reshape(-1, a.shape[-1])
        elif isinstance(a, torch.Tensor) and a.dim() == 3 and self.form == "list":
            a = list(a)
        req = {"prompt_token_ids": self.ids}
        if self.mm == "actions":
            req["multi_modal_data"] = {"actions": a}
        elif self.mm is not None:
            req["multi_modal_data"] = self.mm
        return req

    def pos(self, kind: str) -> int:
        """A random position of an image code ("code") or an action slot ("slot")."""
        L = self.layout
        f = self.rng.randrange(self.n)
        if kind == "code":
            return f * L.frame_len + self.rng.randrange(L.image_tokens)
        return f * L.frame_len + L.image_tokens + self.rng.randrange(L.action_tokens)


# ---------------------------------------------------------------------------- faults
# Each fault changes one part of a case and says which phrases the error may contain. A case takes
# at most one fault per group, so no two faults can undo each other.
OUT_OF_RANGE = ["image code out of range", "wrong action slots", "out of vocabulary", "negative"]


def id_past_vocab(c: Case):
    v = c.layout.vocab_size
    value = c.rng.choice([v, v + 1, v + c.rng.randrange(2, 1000), 10**7, 2**31 - 1, 2**63 - 1])
    c.ids[c.pos(c.rng.choice(["code", "slot"]))] = value
    c.expect += OUT_OF_RANGE


def id_negative(c: Case):
    value = c.rng.choice([-1, -2, -4, -(10**7), -(2**63)])
    c.ids[c.pos(c.rng.choice(["code", "slot"]))] = value
    c.expect += OUT_OF_RANGE


def seed_slot_on_a_code(c: Case):
    c.ids[c.pos("code")] = SEED_PLACEHOLDER
    c.expect += OUT_OF_RANGE


def code_in_a_slot(c: Case):
    c.ids[c.pos("slot")] = c.rng.randrange(c.layout.num_codes)
    c.expect += ["wrong action slots"]


def id_beyond_int64(c: Case):
    c.ids[c.pos("code")] = 2**64 + c.rng.randrange(10**6)
    c.expect += ["could not be read as numbers", "out of vocabulary"]


def ids_not_ints(c: Case):
    if c.rng.random() < 0.5:
        c.ids = [t + 0.5 for t in c.ids]  # would be truncated to the good prompt
    else:
        c.ids[c.pos("code")] = float(c.ids[c.pos("code")]) + 0.25
    c.expect += ["list of ints", "must be ints"]


def ids_nested(c: Case):
    c.ids = [c.ids]
    c.expect += ["flat list of ints"]


def prompt_cut_or_padded(c: Case):
    k = c.rng.randrange(1, c.layout.frame_len)
    c.ids = c.ids[:-k] if c.rng.random() < 0.5 else c.ids + [0] * k
    c.expect += ["frame-aligned", "cannot be empty"]


def prompt_too_long(c: Case):
    frames = c.rng.choice([MAX_FRAMES, MAX_FRAMES + 1, 30, 200])
    c.ids = c.ids[: c.layout.frame_len] * frames
    c.expect += ["too many frames", "maximum context length", "longer than the maximum model length"]


def prompt_empty(c: Case):
    c.ids = []
    c.expect += ["frame-aligned", "cannot be empty"]


def actions_nan(c: Case):
    a = torch.as_tensor(c.actions).clone()
    a.view(-1)[c.rng.randrange(a.numel())] = c.rng.choice([float("nan"), float("inf"), -float("inf")])
    c.actions = a
    c.expect += ["nan or inf"]


def actions_beyond_float32(c: Case):
    a = torch.as_tensor(c.actions).double().clone()
    a.view(-1)[c.rng.randrange(a.numel())] = c.rng.choice([1e39, -1e300])
    c.actions = a
    c.expect += ["nan or inf"]


def actions_wrong_shape(c: Case):
    n, A, D = c.n, c.layout.action_tokens, c.layout.action_dim
    shape = c.rng.choice([(n, A - 1, D), (n, A, D - 1), (n, A, D + 1), (n * A + 1, D), (n * A * D,), (1, n, A, D), ()])
    c.actions, c.form = torch.zeros(shape), "stacked"
    c.expect += ["wrong action shape"]


def actions_one_item_wrong(c: Case):
    items = list(torch.as_tensor(c.actions))
    items[c.rng.randrange(len(items))] = torch.zeros(c.layout.action_tokens + 1, c.layout.action_dim)
    c.actions, c.form = items, "stacked"
    c.expect += ["wrong action shape"]


def actions_wrong_dtype(c: Case):
    a = torch.as_tensor(c.actions)
    c.actions, c.form = c.rng.choice([a > 0, a.to(torch.complex64), "waypoints", [None] * c.n, {"x": 1}]), "stacked"
    c.expect += ["must be numbers", "could not be read as numbers", "is empty", "wrong action shape"]


def actions_missing_frames(c: Case):
    c.actions = torch.as_tensor(c.actions)[: c.rng.randrange(c.n)]
    c.expect += ["actions do not match", "empty list", "wrong action shape: got [0, 3]"]


def actions_extra_frames(c: Case):
    extra = c.rng.choice([1, 2, MAX_FRAMES, 10**3])
    a = torch.as_tensor(c.actions)
    c.actions = torch.cat([a, torch.zeros(extra, *a.shape[1:])])
    c.expect += ["actions do not match", "too many frames"]


def actions_forgotten(c: Case):
    c.mm = c.rng.choice([None, {}])
    c.expect += ["action slots but no multi_modal_data", "list of ints"]


def actions_none(c: Case):
    c.mm = {"actions": None}
    c.expect += ["is empty"]


def other_modality(c: Case):
    c.mm = {"image": torch.zeros(2, 3)}
    c.expect += ["image"]


def max_tokens_past_the_frame(c: Case):
    n = c.rng.choice([c.layout.image_tokens + 1, c.layout.image_tokens + c.layout.action_tokens, 10**4, None])
    c.params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
    c.expect += ["runs past the frame", "max_tokens"]


def sampling_ids_out_of_vocab(c: Case):
    bad = c.rng.choice([c.layout.vocab_size, 10**7, -1])
    key = c.rng.choice(["logit_bias", "allowed_token_ids", "stop_token_ids"])
    value = {bad: 1.0} if key == "logit_bias" else [bad]
    c.params = lambda: SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False, **{key: value})
    c.expect += [key]


def sampling_values(c: Case):
    key, value, phrase = c.rng.choice([("temperature", -1.0, "temperature"), ("top_p", 2.0, "top_p"),
                                       ("max_tokens", 0, "max_tokens"), ("logprobs", 10**6, "logprobs"),
                                       ("prompt_logprobs", 10**6, "logprobs"), ("n", 0, "n must be"),
                                       ("top_k", -5, "top_k")])
    c.params = lambda: SamplingParams(ignore_eos=True, detokenize=False, **{key: value})
    c.expect += [phrase]


GROUPS = {
    "ids": [id_past_vocab, id_negative, seed_slot_on_a_code, code_in_a_slot, id_beyond_int64, ids_not_ints,
            ids_nested, prompt_cut_or_padded, prompt_too_long, prompt_empty],
    "actions": [actions_nan, actions_beyond_float32, actions_wrong_shape, actions_one_item_wrong, actions_wrong_dtype,
                actions_missing_frames, actions_extra_frames, actions_forgotten, actions_none, other_modality],
    "params": [max_tokens_past_the_frame, sampling_ids_out_of_vocab, sampling_values],
}

# Plain prompts (no multi_modal_data) reach vLLM without the processor: only the front door sees them.
PLAIN = {
    "past the vocabulary": (lambda L: [L.vocab_size + 5] * 3, "out of vocabulary"),
    "10**7": (lambda L: [10**7] * 10, "out of vocabulary"),
    "negative": (lambda L: [3, -1, 4], "negative"),
    "seed slot": (lambda L: [3, SEED_PLACEHOLDER], "action slots but no multi_modal_data"),
    "placeholder": (lambda L: [3, L.placeholder_id], "action slots but no multi_modal_data"),
    "codes into the slots": (lambda L: [1] * (L.image_tokens + 1), "holds at most"),
    "floats": (lambda L: [1.5, 2.0], "must be ints"),
}


def make_case(rng: random.Random, layout) -> Case:
    c = Case(rng, layout)
    c.ids = list(c.ids)
    groups = rng.sample(sorted(GROUPS), rng.choice([1, 1, 2, 3]))
    for g in groups:
        fault = rng.choice(GROUPS[g])
        fault(c)
        c.faults.append(fault.__name__)
    return c


def refuse(llm, request, params) -> str:
    """`llm.generate` must raise a bad-request error; returns its message (lowercase)."""
    try:
        params = params() if callable(params) else params
        out = llm.generate(request, params, use_tqdm=False)
    except BAD as e:
        return str(e).lower()
    raise AssertionError(f"served instead of refused: {str(request)[:300]} -> {out[0].outputs[0].token_ids}")


# ---------------------------------------------------------------------------- tests
def test_raw_request_with_an_id_past_the_vocabulary_no_longer_kills_the_engine(llm, layout, sample):
    good = {"prompt_token_ids": build_prompt(sample.context[:2], layout), "multi_modal_data": {"actions": sample.actions[:2]}}
    before = tokens(llm, good, greedy(layout))
    for name, (ids, phrase) in PLAIN.items():
        assert phrase in refuse(llm, {"prompt_token_ids": ids(layout)}, greedy(layout, 1)), name
    assert tokens(llm, good, greedy(layout)) == before
    # a plain prompt that is right (part of a first frame, no slots) is still served
    assert len(tokens(llm, {"prompt_token_ids": [0, 5, 7]}, greedy(layout))[0]) == 4


def test_fuzzed_bad_requests_are_refused_by_name_and_the_engine_serves_on(llm, layout, sample):
    good = {"prompt_token_ids": build_prompt(sample.context, layout, placeholder=SEED_PLACEHOLDER),
            "multi_modal_data": {"actions": sample.actions[: sample.context.shape[0]]}}
    before = tokens(llm, [good, good], [greedy(layout, layout.image_tokens), seeded(layout, layout.image_tokens)])
    rng = random.Random(20261123)
    unnamed = []
    for i in range(N_REQUESTS):
        case = make_case(rng, layout)
        message = refuse(llm, case.request(), case.params)
        if not any(p.lower() in message for p in case.expect):
            unnamed.append(f"#{i} {case.faults}: expected one of {case.expect}, got: {message[:200]}")
    assert not unnamed, "\n".join(unnamed[:10])
    assert llm.llm_engine.get_num_unfinished_requests() == 0
    after = tokens(llm, [good, good], [greedy(layout, layout.image_tokens), seeded(layout, layout.image_tokens)])
    assert after == before and len(after[0]) == layout.image_tokens


def test_a_batch_with_one_bad_request_is_refused_whole_and_the_good_ones_serve_unchanged(llm, layout, sample):
    a = {"prompt_token_ids": build_prompt(sample.context[:1], layout), "multi_modal_data": {"actions": sample.actions[:1]}}
    b = {"prompt_token_ids": build_prompt(sample.context[:2], layout), "multi_modal_data": {"actions": sample.actions[:2]}}
    alone = tokens(llm, [a, b], greedy(layout))
    for bad in ({"prompt_token_ids": [10**7] * 10}, {"prompt_token_ids": b["prompt_token_ids"]}):
        with pytest.raises(BAD):
            llm.generate([a, bad, b], greedy(layout), use_tqdm=False)  # the good request before it was added
        assert llm.llm_engine.get_num_unfinished_requests() == 0  # ... and aborted
    assert tokens(llm, [a, b], greedy(layout)) == alone
