"""Fuzzing a real engine with bad requests: every one is refused by the rule it breaks, and the
engine keeps serving exactly as before.

Three hundred seeded requests, each a good request (1-4 frames of the tiny checkpoint, random
codes with code 0, random actions in one of the three accepted forms, `-3` or in-vocabulary slots)
broken in exactly one way: an id past the vocabulary, negative, not an int, beyond int64; a prompt
cut or lengthened, too long, empty, without its actions; actions with NaN/inf, values beyond
float32, wrong shapes and dtypes, missing or extra frames; sampling parameters that run past the
frame or name ids outside the vocabulary. One fault per case, so each case breaks one rule, and the
refusal must name that rule (`named_rule`: Terra's rule id, or vLLM's own check where vLLM refuses
first). The sampling parameters are built before the request is sent: a parameter vLLM's own
`SamplingParams` rejects is a bad test case, not a refusal. Every case enters `llm.generate`; the
test counts those that reach vLLM's `InputProcessor.process_inputs` (the engine's front door, where
the plugin's checks run): exactly the cases whose fault only the door can see (`DOOR_FAULTS`: no
actions, or sampling parameters); the others are refused before it, by Terra's multimodal processor
or vLLM's own checks in its renderer. Then a good greedy and a good seeded request must return the
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

from terra_nb.port.layout import RULES, SEED_PLACEHOLDER, build_prompt, rule_of
from vllm.v1.engine.input_processor import InputProcessor
from terra_nb.port.vllm_compat import shutdown_llm
from terra_nb.port.vllm_hooks import VLLM_VERSION
from terra_nb.port.vllm_rollout import make_llm

N_REQUESTS = 300
MAX_FRAMES = 6  # engine: prompts of at most 5 frames
BAD = (ValueError, VLLMValidationError)  # VLLMValidationError is no ValueError on vLLM 0.32


pytestmark = pytest.mark.engine


def engine_options() -> dict:
    if torch.cuda.is_available():
        return {"gpu_memory_utilization": 0.3, "enforce_eager": True}
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


# ---------------------------------------------------------------------------- which rule a refusal names
# Terra's rules are `layout.RULES` (one message each; `rule_of` reads a refusal's `.rule` or its text).
# vLLM's own checks, where vLLM refuses before Terra's rules run:
VLLM_RULES = {
    "vllm:max_model_len": r"maximum context length is \d+ tokens",
    "vllm:modality_limit": r"at most 0 \w+\(s\) may be provided in one prompt",
    "vllm:sampling_ids_out_of_vocab": r"out-of-vocab token id",
}


def named_rule(error: BaseException) -> str | None:
    """The rule a refusal names: Terra's (`layout.rule_of`), else the vLLM check whose message it is."""
    import re

    rule = rule_of(error)
    if rule is not None:
        return rule
    text = str(error).lower()
    return next((r for r, pattern in VLLM_RULES.items() if re.search(pattern, text)), None)


# ---------------------------------------------------------------------------- the good request
class Case:
    """A good request under construction: prompt ids, actions, sampling parameters; a fault breaks
    one rule of it and sets `rule`, the rule the refusal must name."""

    def __init__(self, rng: random.Random, layout):
        self.rng, self.layout = rng, layout
        self.n = rng.randint(1, 4)
        self.g = torch.Generator().manual_seed(rng.randrange(2**31))
        codes = torch.randint(0, layout.num_codes, (self.n, layout.image_tokens), generator=self.g)
        codes[0, 0] = 0
        self.slot = rng.choice([SEED_PLACEHOLDER, layout.placeholder_id])
        self.ids: object = build_prompt(codes, layout, placeholder=self.slot)
        self.actions: object = self.random_actions(self.n)
        self.form = rng.choice(["flat", "stacked", "list"])
        self.mm: object = "actions"  # "actions": {"actions": <actions>}; else the literal value
        self.params = greedy(layout)
        self.rule: str | None = None
        self.fault = ""

    def random_actions(self, n: int) -> torch.Tensor:
        return torch.randn(n, self.layout.action_tokens, self.layout.action_dim, generator=self.g) * 3

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

    def frames_of_codes(self, n: int) -> list[int]:
        codes = torch.randint(0, self.layout.num_codes, (n, self.layout.image_tokens), generator=self.g)
        return build_prompt(codes, self.layout, placeholder=self.slot)


# ---------------------------------------------------------------------------- faults
# Each fault breaks one rule of a good case and returns that rule's id. Where the fault lands
# decides the rule: an id past the vocabulary in an action slot breaks the slots' rule, in an
# image code the codes' rule (the prompt's slots are checked first).
def _bad_id(c: Case, value: int) -> str:
    kind = c.rng.choice(["code", "slot"])
    c.ids[c.pos(kind)] = value
    return "code_out_of_range" if kind == "code" else "wrong_action_slots"


def id_past_vocab(c: Case) -> str:
    v = c.layout.vocab_size
    return _bad_id(c, c.rng.choice([v, v + 1, v + c.rng.randrange(2, 1000), 10**7, 2**31 - 1, 2**63 - 1]))


def id_negative(c: Case) -> str:
    return _bad_id(c, c.rng.choice([-1, -2, -4, -(10**7), -(2**63)]))


def seed_slot_on_a_code(c: Case) -> str:
    c.ids[c.pos("code")] = SEED_PLACEHOLDER
    return "code_out_of_range"


def code_in_a_slot(c: Case) -> str:
    c.ids[c.pos("slot")] = c.rng.randrange(c.layout.num_codes)
    return "wrong_action_slots"


def id_beyond_int64(c: Case) -> str:
    c.ids[c.pos("code")] = 2**64 + c.rng.randrange(10**6)
    return "id_out_of_vocab"  # an int all the same: the layout refuses it as past the vocabulary


def ids_not_ints(c: Case) -> str:
    if c.rng.random() < 0.5:
        c.ids = [t + 0.5 for t in c.ids]  # would be truncated to the good prompt
    else:
        c.ids[c.pos("code")] = float(c.ids[c.pos("code")]) + 0.25
    return "ids_not_ints"


def ids_nested(c: Case) -> str:
    c.ids = [c.ids]
    return "ids_not_ints"


def prompt_cut_or_padded(c: Case) -> str:
    k = c.rng.randrange(1, c.layout.frame_len)
    c.ids = c.ids[:-k] if c.rng.random() < 0.5 else c.ids + [0] * k
    return "not_frame_aligned"


def prompt_too_long(c: Case) -> str:
    """More frames than the engine takes, each with its actions: only the length is wrong. Past
    `max_model_len` (MAX_FRAMES whole frames) vLLM's own length check speaks first."""
    frames = c.rng.choice([MAX_FRAMES, MAX_FRAMES + 1, 30])
    c.ids, c.actions = c.frames_of_codes(frames), c.random_actions(frames)
    return "too_many_frames" if frames <= MAX_FRAMES else "vllm:max_model_len"


def prompt_empty(c: Case) -> str:
    c.ids = []
    return "not_frame_aligned"


def actions_nan(c: Case) -> str:
    a = torch.as_tensor(c.actions).clone()
    a.view(-1)[c.rng.randrange(a.numel())] = c.rng.choice([float("nan"), float("inf"), -float("inf")])
    c.actions = a
    return "actions_not_finite"


def actions_beyond_float32(c: Case) -> str:
    a = torch.as_tensor(c.actions).double().clone()
    a.view(-1)[c.rng.randrange(a.numel())] = c.rng.choice([1e39, -1e300])
    c.actions = a
    return "actions_not_finite"


def actions_wrong_shape(c: Case) -> str:
    n, A, D = c.n, c.layout.action_tokens, c.layout.action_dim
    shape = c.rng.choice([(n, A - 1, D), (n, A, D - 1), (n, A, D + 1), (n * A + 1, D), (n * A * D,), (1, n, A, D), ()])
    c.actions, c.form = torch.zeros(shape), "stacked"
    return "wrong_action_shape"


def actions_one_item_wrong(c: Case) -> str:
    items = list(torch.as_tensor(c.actions))
    items[c.rng.randrange(len(items))] = torch.zeros(c.layout.action_tokens + 1, c.layout.action_dim)
    c.actions, c.form = items, "stacked"
    return "wrong_action_shape"


def actions_wrong_dtype(c: Case) -> str:
    a = torch.as_tensor(c.actions)
    c.actions, c.form = c.rng.choice([a > 0, a.to(torch.complex64), "waypoints", [None] * c.n]), "stacked"
    return "actions_not_numbers"


def actions_missing_frames(c: Case) -> str:
    """Fewer actions than prompt frames (a one-frame prompt gets a second frame without actions)."""
    if c.n == 1:
        c.ids = c.ids + c.frames_of_codes(1)
    else:
        c.actions = torch.as_tensor(c.actions)[: c.rng.randrange(1, c.n)]
    return "actions_mismatch"


def actions_extra_frames(c: Case) -> str:
    """More actions than prompt frames: past the engine's item limit, vLLM's count check speaks first."""
    extra = c.rng.choice([1, 2, MAX_FRAMES, 10**3])
    a = torch.as_tensor(c.actions)
    c.actions = torch.cat([a, torch.zeros(extra, *a.shape[1:])])
    return "too_many_frames" if c.n + extra > MAX_FRAMES - 1 else "actions_mismatch"


def actions_forgotten(c: Case) -> str:
    c.mm = c.rng.choice([None, {}])
    return "slots_without_actions"


def other_modality(c: Case) -> str:
    c.mm = {"image": torch.zeros(2, 3)}
    return "vllm:modality_limit"


def max_tokens_past_the_frame(c: Case) -> str:
    n = c.rng.choice([c.layout.image_tokens + 1, c.layout.image_tokens + c.layout.action_tokens, 10**4, None])
    c.params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
    return "generation_window"


def sampling_ids_out_of_vocab(c: Case) -> str:
    """vLLM 0.32 checks these ids itself; 0.26 checks only logit_bias's (`SamplingParams.verify`) and
    the front door the others."""
    bad = c.rng.choice([c.layout.vocab_size, 10**7, -1])
    key = c.rng.choice(["logit_bias", "allowed_token_ids", "stop_token_ids"])
    value = {bad: 1.0} if key == "logit_bias" else [bad]
    c.params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False, **{key: value})
    if VLLM_VERSION >= (0, 32) or key == "logit_bias":
        return "vllm:sampling_ids_out_of_vocab"
    return "id_negative" if bad < 0 else "id_out_of_vocab"


# Faults only the front door sees: a request without actions never meets the processor, and the
# sampling parameters are checked once the prompt is processed.
DOOR_FAULTS = {"actions_forgotten", "max_tokens_past_the_frame", "sampling_ids_out_of_vocab"}

FAULTS = [id_past_vocab, id_negative, seed_slot_on_a_code, code_in_a_slot, id_beyond_int64, ids_not_ints,
          ids_nested, prompt_cut_or_padded, prompt_too_long, prompt_empty,
          actions_nan, actions_beyond_float32, actions_wrong_shape, actions_one_item_wrong, actions_wrong_dtype,
          actions_missing_frames, actions_extra_frames, actions_forgotten, other_modality,
          max_tokens_past_the_frame, sampling_ids_out_of_vocab]

# Plain prompts (no multi_modal_data) reach vLLM without the processor: only the front door sees them.
PLAIN = {
    "past the vocabulary": (lambda L: [L.vocab_size + 5] * 3, "id_out_of_vocab"),
    "10**7": (lambda L: [10**7] * 10, "id_out_of_vocab"),
    "negative": (lambda L: [3, -1, 4], "id_negative"),
    "seed slot": (lambda L: [3, SEED_PLACEHOLDER], "slots_without_actions"),
    "placeholder": (lambda L: [3, L.placeholder_id], "slots_without_actions"),
    "codes into the slots": (lambda L: [1] * (L.image_tokens + 1), "plain_prompt_too_long"),
    "floats": (lambda L: [1.5, 2.0], "ids_not_ints"),
}


def make_case(rng: random.Random, layout) -> Case:
    c = Case(rng, layout)
    c.ids = list(c.ids)
    fault = rng.choice(FAULTS)
    c.rule, c.fault = fault(c), fault.__name__
    return c


def refusal(llm, request, params) -> BaseException:
    """`llm.generate` must raise a bad-request error; returns it."""
    try:
        out = llm.generate(request, params, use_tqdm=False)
    except BAD as e:
        return e
    raise AssertionError(f"served instead of refused: {str(request)[:300]} -> {out[0].outputs[0].token_ids}")


@pytest.fixture
def door_calls(monkeypatch):
    """Counts the requests that reach `InputProcessor.process_inputs` (the engine's front door)."""
    calls = []
    inner = InputProcessor.process_inputs

    def counted(self, *args, **kwargs):
        calls.append(1)
        return inner(self, *args, **kwargs)

    monkeypatch.setattr(InputProcessor, "process_inputs", counted)
    return calls


# ---------------------------------------------------------------------------- tests
def test_raw_request_with_an_id_past_the_vocabulary_no_longer_kills_the_engine(llm, layout, sample):
    good = {"prompt_token_ids": build_prompt(sample.context[:2], layout), "multi_modal_data": {"actions": sample.actions[:2]}}
    before = tokens(llm, good, greedy(layout))
    for name, (ids, rule) in PLAIN.items():
        error = refusal(llm, {"prompt_token_ids": ids(layout)}, greedy(layout, 1))
        assert named_rule(error) == rule, (name, str(error))
    assert tokens(llm, good, greedy(layout)) == before
    # a plain prompt that is right (part of a first frame, no slots) is still served
    assert len(tokens(llm, {"prompt_token_ids": [0, 5, 7]}, greedy(layout))[0]) == 4


def test_fuzzed_bad_requests_are_refused_by_the_rule_they_break_and_the_engine_serves_on(llm, layout, sample,
                                                                                          door_calls):
    good = {"prompt_token_ids": build_prompt(sample.context, layout, placeholder=SEED_PLACEHOLDER),
            "multi_modal_data": {"actions": sample.actions[: sample.context.shape[0]]}}
    before = tokens(llm, [good, good], [greedy(layout, layout.image_tokens), seeded(layout, layout.image_tokens)])
    rng = random.Random(20261123)
    cases = [make_case(rng, layout) for _ in range(N_REQUESTS)]   # parameters built here, not while sending
    wrong, per_fault, at_door = [], {}, set()
    for i, case in enumerate(cases):
        calls = len(door_calls)
        error = refusal(llm, case.request(), case.params)
        if len(door_calls) > calls:
            at_door.add(i)
        per_fault[case.fault] = per_fault.get(case.fault, 0) + 1
        if named_rule(error) != case.rule:
            wrong.append(f"#{i} {case.fault}: expected rule {case.rule}, got {named_rule(error)}: {str(error)[:200]}")
    assert not wrong, f"{len(wrong)} refusals name another rule:\n" + "\n".join(wrong[:10])
    # the cases that reached the front door are exactly those only the door can refuse
    door_cases = {i for i, c in enumerate(cases) if c.fault in DOOR_FAULTS}
    assert at_door == door_cases and len(door_cases) > 0, (len(at_door), len(door_cases))
    assert set(per_fault) == {f.__name__ for f in FAULTS} and min(per_fault.values()) >= 5, per_fault
    assert llm.llm_engine.get_num_unfinished_requests() == 0
    after = tokens(llm, [good, good], [greedy(layout, layout.image_tokens), seeded(layout, layout.image_tokens)])
    assert after == before and len(after[0]) == layout.image_tokens


def test_each_fault_breaks_one_rule_of_a_good_request():
    """The fuzzer's own check (no engine): a good case passes the layout's own checks (prompt and
    actions, in the form the request sends them), and each fault names a rule the matcher knows."""
    from terra_nb.workbook.checkpoints import preset_config
    from terra_nb.port.layout import FrameLayout, validate_actions, validate_prompt

    layout, rng = FrameLayout.from_config(preset_config("tiny")), random.Random(7)
    for fault in FAULTS:
        c = Case(rng, layout)
        c.ids = list(c.ids)
        assert c.rule is None and len(c.ids) == c.n * layout.frame_len
        assert validate_prompt(c.ids, layout) == c.n
        sent = c.request()["multi_modal_data"]["actions"]
        assert validate_actions(sent, layout, n_frames=c.n).shape == (c.n, layout.action_tokens, layout.action_dim)
        assert fault(c) in {**RULES, **VLLM_RULES}, fault.__name__


def test_a_batch_with_one_bad_request_is_refused_whole_and_the_good_ones_serve_unchanged(llm, layout, sample):
    a = {"prompt_token_ids": build_prompt(sample.context[:1], layout), "multi_modal_data": {"actions": sample.actions[:1]}}
    b = {"prompt_token_ids": build_prompt(sample.context[:2], layout), "multi_modal_data": {"actions": sample.actions[:2]}}
    alone = tokens(llm, [a, b], greedy(layout))
    for bad in ({"prompt_token_ids": [10**7] * 10}, {"prompt_token_ids": b["prompt_token_ids"]}):
        with pytest.raises(BAD):
            llm.generate([a, bad, b], greedy(layout), use_tqdm=False)  # the good request before it was added
        assert llm.llm_engine.get_num_unfinished_requests() == 0  # ... and aborted
    assert tokens(llm, [a, b], greedy(layout)) == alone
