"""The front door (`terra_nb.port.vllm_frontdoor`), without an engine: the layout rules it applies
(`layout.check_plain_prompt`, ...), and vLLM's own `InputProcessor` (what `LLM.generate` and
`vllm serve` call for every request) wrapped by the plugin, refusing with vLLM's validation error.

On the installed release the processor is built from a `ModelConfig` of the tiny checkpoint, and
every refusal is Terra's (its rule and message), raised before vLLM's own checks. Where vLLM 0.26.0 is (the `vllm026_src` fixture: installed on the GPU runner, or an
unpacked wheel), a subprocess does the same with 0.26's `InputProcessor` and must refuse the same
requests with the same messages. The engine-level test is
`test_vllm_fuzz.py`.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from transformers import LlamaConfig

from terra_nb.port import layout as L
from terra_nb.port import vllm_frontdoor as F
from terra_nb.workbook.checkpoints import preset_config
from terra_nb.port.layout import FrameLayout, TerraInputError
from vllm.v1.engine.input_processor import InputProcessor
from terra_nb.port.vllm_patch import RequestValidationError

TINY = FrameLayout.from_config(preset_config("tiny"))  # 64 codes + 6 slots, vocab 513, placeholder 512


pytestmark = pytest.mark.engine


# ---------------------------------------------------------------------------- the checks
@pytest.mark.parametrize("ids, needle", [
    ([3, 512], "action slots but no multi_modal_data: position 1 (frame 0, image code 1) holds 512"),
    ([1] * 64 + [-3], "action slots but no multi_modal_data: position 64 (frame 0, action slot 0) holds -3"),
    ([3, -1], "token id -1 at position 1 is negative"),
    ([3, 4, 513], "token id 513 at position 2 is out of vocabulary (vocab_size 513"),
    ([10**7] * 10, "token id 10000000 at position 0 is out of vocabulary"),
    ([2**70], "token id 1180591620717411303424 at position 0 is out of vocabulary"),
    ([2**64 - 1], "token id 18446744073709551615 at position 0 is out of vocabulary"),
    ([1.5, 2], "prompt_token_ids must be a flat list of ints, got float 1.5 at position 0"),
    ([[1, 2]], "must be a flat list of ints, got list [1, 2] at position 0"),
    ([1] * 65, "a prompt without actions holds at most 64 image codes"),
])
def test_plain_prompts_are_refused_by_name(ids, needle):
    with pytest.raises(TerraInputError) as err:
        L.check_plain_prompt(ids, TINY)
    assert needle in str(err.value)
    assert isinstance(err.value, ValueError)
    mapped = F.as_request_error(err.value)  # what the front door raises: vLLM's error, same text and rule
    assert isinstance(mapped, RequestValidationError) and isinstance(mapped, ValueError)
    assert needle in str(mapped) and mapped.rule == err.value.rule and mapped.parameter == err.value.param


@pytest.mark.parametrize("good, bad", [
    ([0, 511, 7], [0, 512, 7]),          # the last code passes, the placeholder id one above it does not
    (list(range(64)), list(range(65))),  # one whole frame of codes passes, one code into the slots does not
    ([0], [-1]),                         # code 0 is a code (the seed's pitfall), -1 is not
])
def test_plain_prompts_of_image_codes_within_one_frame_pass(good, bad):
    """Each accepted prompt beside its one-off neighbour, which is refused: a rule drawn one too
    tight or one too loose fails here."""
    assert L.check_plain_prompt(good, TINY) is None
    with pytest.raises(TerraInputError):
        L.check_plain_prompt(bad, TINY)


def test_generation_must_stay_inside_the_frame():
    L.check_generation_window(3 * 70, 64, TINY)  # a frame-aligned prompt: one whole frame
    L.check_generation_window(60, 4, TINY)
    with pytest.raises(TerraInputError, match="max_tokens=65 runs past the frame: the prompt ends 0 codes"):
        L.check_generation_window(3 * 70, 65, TINY)
    with pytest.raises(TerraInputError, match=r"ends 60 codes into frame 0, which has 4 image codes left"):
        L.check_generation_window(60, 5, TINY)
    with pytest.raises(TerraInputError, match="ends 64 codes into frame 0, which has 0 image codes left"):
        L.check_generation_window(64, 1, TINY)


def test_the_door_is_for_terra_models_only():
    assert F.terra_layout(SimpleNamespace(hf_config=preset_config("tiny"))) == TINY
    assert F.terra_layout(SimpleNamespace(hf_config=LlamaConfig())) is None


# ---------------------------------------------------------------------------- vLLM's InputProcessor
@pytest.fixture(scope="module")
def input_processor(tiny_ckpt):
    from vllm.config import ModelConfig, VllmConfig
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what every vLLM process does first: installs the door
    mc = ModelConfig(model=str(tiny_ckpt), skip_tokenizer_init=True, dtype="float32", max_model_len=420)
    return InputProcessor(VllmConfig(model_config=mc))


def process(ip, prompt, **params):
    from vllm import SamplingParams

    return ip.process_inputs("r", prompt, SamplingParams(**{"max_tokens": 4, **params}), supported_tasks=("generate",))


def test_the_plugin_wraps_process_inputs_once(input_processor):
    from terra_nb.port.vllm_patch import wrapped_by

    assert F.installed()
    wrapped = InputProcessor.process_inputs
    F.install()
    assert InputProcessor.process_inputs is wrapped
    assert wrapped_by(F._MARK) == 1  # once, beside any other plugin's door (TinyVLM's wraps it too)


def test_doors_of_two_plugins_compose_in_either_order():
    """Each door counts only itself: a second plugin's wrapper neither hides nor copies the first's mark."""
    from terra_nb.port.vllm_patch import PROCESS_INPUTS, wrap, wrapped_by

    before = InputProcessor.process_inputs
    calls = []

    def recorder(name):
        def make(original):
            def wrapper(self, *a, **k):
                calls.append(name)
                return original(self, *a, **k)
            return wrapper
        return make

    try:
        def process_inputs(self, request_id, prompt, params, *a, **k):
            return "done"

        InputProcessor.process_inputs = process_inputs
        for name in ("_door_a", "_door_b", "_door_a"):
            assert wrap(PROCESS_INPUTS, name, recorder(name), "a test's door")
        assert (wrapped_by("_door_a"), wrapped_by("_door_b")) == (1, 1)
        assert InputProcessor.process_inputs(object(), "r", [0], None) == "done" and calls == ["_door_b", "_door_a"]
    finally:
        InputProcessor.process_inputs = before


def test_input_processor_refuses_what_would_kill_or_fool_the_engine(input_processor, sample):
    import numpy as np

    from terra_nb.port.layout import build_prompt

    good = {"prompt_token_ids": build_prompt(sample.context, TINY), "multi_modal_data": {"actions": sample.actions[:3]}}
    assert len(process(input_processor, good).prompt_token_ids) == 210
    assert process(input_processor, {"prompt_token_ids": [0, 5, 7]}).prompt_token_ids == [0, 5, 7]
    # Terra's own refusal, rule and message, on every release: vLLM's id check inside
    # process_inputs (bounded by the vocabulary, with or without a tokenizer on some releases) never
    # answers first.
    cases = [
        ({"prompt_token_ids": [10**7] * 10}, {}, "id_out_of_vocab", "token id 10000000 at position 0 is out of vocab"),
        ({"prompt_token_ids": [513] * 3}, {}, "id_out_of_vocab", "token id 513 at position 0 is out of vocabulary"),
        ({"prompt_token_ids": [5, -4]}, {}, "id_negative", "token id -4 at position 1 is negative"),
        ({"prompt_token_ids": good["prompt_token_ids"]}, {}, "slots_without_actions", "action slots but no multi_modal_data"),
        ({"prompt_token_ids": good["prompt_token_ids"], "multi_modal_data": {}}, {}, "slots_without_actions",
         "action slots but no multi_modal_data"),
        ({"prompt_token_ids": [3, -3]}, {}, "slots_without_actions", "position 1 (frame 0, image code 1) holds -3"),
        ({"prompt_token_ids": np.arange(5)}, {}, "ids_not_ints", "must be a flat list of ints, got numpy.ndarray"),
        (good, {"max_tokens": 65}, "generation_window", "runs past the frame"),
        (good, {"max_tokens": None}, "generation_window", "runs past the frame"),
        ({"prompt_token_ids": [1] * 60}, {"max_tokens": 16}, "generation_window", "runs past the frame"),
    ]
    for prompt, params, rule, needle in cases:
        with pytest.raises(RequestValidationError, match=re.escape(needle)) as err:
            process(input_processor, prompt, **params)
        assert err.value.rule == rule and isinstance(err.value, ValueError)


# ---------------------------------------------------------------------------- vLLM 0.26.0
_PROBE = r"""
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = CpuPlatform()  # the source tree has no build to detect a platform from
import numpy as np
import vllm
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm import SamplingParams
from vllm.config import ModelConfig, VllmConfig
from terra_nb.port import vllm_frontdoor as F
from vllm.v1.engine.input_processor import InputProcessor
from terra_nb.port.layout import FrameLayout
from terra_nb.workbook.data import load_sample
from terra_nb.port.layout import build_prompt

mc = ModelConfig(model=sys.argv[1], skip_tokenizer_init=True, dtype="float32", max_model_len=420)
ip = InputProcessor(VllmConfig(model_config=mc))
lay, s = FrameLayout.from_config(mc.hf_config), load_sample("tiny")
good = {"prompt_token_ids": build_prompt(s.context, lay), "multi_modal_data": {"actions": s.actions[:3]}}
out = {"version": vllm.__version__, "installed": F.installed(), "results": []}
for prompt, max_tokens in [(good, 64), ({"prompt_token_ids": [0, 5, 7]}, 4), ({"prompt_token_ids": [10**7] * 10}, 4),
                           ({"prompt_token_ids": [513] * 3}, 4), ({"prompt_token_ids": [5, -4]}, 4),
                           ({"prompt_token_ids": good["prompt_token_ids"]}, 4), ({"prompt_token_ids": np.arange(5)}, 4),
                           (good, 65), ({"prompt_token_ids": [1] * 65}, 4)]:
    try:
        r = ip.process_inputs("r", prompt, SamplingParams(max_tokens=max_tokens), supported_tasks=("generate",))
        out["results"].append(len(r.prompt_token_ids))
    except ValueError as e:
        out["results"].append({"rule": getattr(e, "rule", None), "message": str(e)})
print("PROBE" + json.dumps(out))
"""


def test_vllm_026_input_processor_refuses_the_same_requests(tiny_ckpt, run_probe, vllm026_src):
    """Where the installed vLLM is 0.26 (the GPU runner) the probe runs against it."""
    old = run_probe(_PROBE, tiny_ckpt, vllm026_src)
    assert old["version"].startswith("0.26") and old["installed"]
    new = old if vllm026_src is None else run_probe(_PROBE, tiny_ckpt, None)
    assert old["results"] == new["results"]
    assert old["results"][:2] == [210, 3]
    # by hand: the rule each refused request breaks, in the probe's order
    assert [r["rule"] for r in old["results"][2:]] == ["id_out_of_vocab", "id_out_of_vocab", "id_negative",
                                                      "slots_without_actions", "ids_not_ints", "generation_window",
                                                      "plain_prompt_too_long"]


def test_sampling_parameters_hold_only_vocabulary_ids():
    """vLLM 0.26 does not check these (an out-of-vocabulary stop id was served on the H200); 0.32 does."""
    from terra_nb.port.layout import check_sampling_ids

    lay = FrameLayout(image_tokens=64, action_tokens=6, max_frames=25, action_dim=3, vocab_size=513)
    check_sampling_ids(SimpleNamespace(logit_bias={512: -100.0}, allowed_token_ids=[0, 511], stop_token_ids=[]), lay)
    for key, value, rule in [("logit_bias", {513: 1.0}, "id_out_of_vocab"), ("allowed_token_ids", [0, -1], "id_negative"),
                             ("stop_token_ids", [10**7], "id_out_of_vocab"), ("stop_token_ids", ["a"], "id_out_of_vocab")]:
        with pytest.raises(TerraInputError, match=f"token id .* at {key} entry \\d+ is") as err:
            check_sampling_ids(SimpleNamespace(**{key: value}), lay)
        assert (err.value.rule, err.value.param) == (rule, key)



# ---------------------------------------------------------------------------- streaming sessions
# One session through vLLM's own `InputProcessor`, as `AsyncLLM._add_streaming_input_request` runs it
# (the door's wrapper of that method sets `_SESSION`): the validation request passes, the first chunk
# is a whole-frame prompt, a continuation is 7 ids with its item at offset 1, the rest is refused by
# rule; outside a session the same requests are answered as before. The engine takes 5-frame prompts.
_SESSION_STEPS = r"""
from vllm import SamplingParams
from terra_nb.port import vllm_frontdoor as F
from terra_nb.port.layout import FrameLayout, build_prompt
from terra_nb.workbook.data import load_sample

def session_answers(ip):
    lay, s = FrameLayout.from_config(ip.model_config.hf_config), load_sample("tiny")
    slots = [lay.placeholder_id] * 6

    def call(request_id, prompt, max_tokens=64, resumable=True):
        try:
            r = ip.process_inputs(request_id, prompt, SamplingParams(max_tokens=max_tokens),
                                  supported_tasks=("generate",), resumable=resumable)
            items = [[f.mm_position.offset, f.mm_position.length] for f in r.mm_features or []]
            return [len(r.prompt_token_ids), items]
        except ValueError as e:
            return getattr(e, "rule", str(e))

    def chunk(code, k, ids=None):
        return {"prompt_token_ids": ids or [code] + slots, "multi_modal_data": {"actions": s.actions[k:k + 1]}}

    token = F._SESSION.set(F._Session("s"))
    try:
        out = [call("s", {"prompt_token_ids": [0]}, resumable=False),  # the session's validation request
               call("s-1", {"prompt_token_ids": build_prompt(s.context, lay),
                            "multi_modal_data": {"actions": s.actions[:3]}}),
               call("s-1", chunk(5, 3)),
               call("s-1", chunk(5, 4, [5] + slots[:-1])),  # one slot short
               call("s-1", chunk(5, 4), max_tokens=65),
               call("s-1", chunk(7, 4)),
               call("s-1", chunk(9, 5))]  # a sixth frame: past the window
    finally:
        F._SESSION.reset(token)
    return out + [call("p", {"prompt_token_ids": [0]}, resumable=False), call("p", chunk(5, 3), resumable=False)]
"""
SESSION_ANSWERS = [[1, []], [210, [[64, 6], [134, 6], [204, 6]]], [7, [[1, 6]]], "session_chunk", "generation_window",
                   [7, [[1, 6]]], "too_many_frames", "generation_window", "not_frame_aligned"]


def test_a_session_through_the_input_processor(input_processor):
    steps: dict = {}
    exec(_SESSION_STEPS, steps)
    assert steps["session_answers"](input_processor) == SESSION_ANSWERS


_SESSION_PROBE = r"""
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = CpuPlatform()  # the source tree has no build to detect a platform from
import vllm
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config import ModelConfig, VllmConfig
from vllm.v1.engine.input_processor import InputProcessor
""" + _SESSION_STEPS + r"""
mc = ModelConfig(model=sys.argv[1], skip_tokenizer_init=True, dtype="float32", max_model_len=420)
answers = session_answers(InputProcessor(VllmConfig(model_config=mc)))
print("PROBE" + json.dumps({"version": vllm.__version__, "results": answers}))
"""


def test_vllm_026_input_processor_answers_a_session_the_same(tiny_ckpt, run_probe, vllm026_src):
    old = run_probe(_SESSION_PROBE, tiny_ckpt, vllm026_src)
    assert old["version"].startswith("0.26") and old["results"] == SESSION_ANSWERS
