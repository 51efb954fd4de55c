"""The `actions` modality without an engine: registration, parser, processor, dummy inputs, checks.

The processor is built the way the engine builds it (`MULTIMODAL_REGISTRY.create_processor` on a
`ModelConfig` of the tiny checkpoint, `skip_tokenizer_init=True`), so these tests exercise vLLM's
own matching and hashing code on our prompt updates, in a second.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

import terra_nb  # noqa: F401
from terra_nb.port.layout import FrameLayout
from terra_nb.port.layout import SEED_PLACEHOLDER, build_prompt
from terra_nb.port.vllm_release import dummy_mm_inputs

P, A, FL = 64, 6, 70  # tiny preset: codes per frame, action slots, frame length
PH = 512  # tiny placeholder id (vocab 513)


@pytest.fixture(scope="module")
def model_config(tiny_ckpt):
    from vllm.config import ModelConfig
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what vLLM does in every process it starts
    return ModelConfig(model=str(tiny_ckpt), skip_tokenizer_init=True, dtype="float32", max_model_len=25 * FL)


@pytest.fixture(scope="module")
def processor(model_config):
    from vllm.multimodal import MULTIMODAL_REGISTRY

    return MULTIMODAL_REGISTRY.create_processor(model_config)


@pytest.fixture(scope="module")
def layout(model_config):
    return FrameLayout.from_config(model_config.hf_config)


def process(processor, prompt, actions):
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    items = processor.info.parse_mm_data({"actions": actions})
    return processor.apply(ProcessorInputs(prompt=list(prompt), mm_data_items=items), TimingContext(enabled=False))


# ---------------------------------------------------------------------------- registration
def test_plugin_registers_both_architectures_and_the_config():
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from terra_nb.port.vllm_plugin import ARCHITECTURES, register

    register()
    register()  # idempotent: vLLM calls it in every process, maybe more than once
    archs = set(ModelRegistry.get_supported_archs())
    assert set(ARCHITECTURES) <= archs
    assert AutoConfig.for_model("llama_action").model_type == "llama_action"


def test_released_config_json_reads_without_trust_remote_code(tmp_path):
    """vLLM's ModelConfig on the released config.json (auto_map to remote code, both action fields)."""
    from vllm.config import ModelConfig
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    src = terra_nb.__file__.rsplit("/", 2)[0] + "/tests/data/terra_config.json"
    shutil.copy(src, tmp_path / "config.json")
    assert "auto_map" in json.loads((tmp_path / "config.json").read_text())
    mc = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, trust_remote_code=False, max_model_len=14550)
    assert mc.architectures == ["LlamaActionForCausalLM"]
    assert mc.is_multimodal_model
    assert type(mc.hf_config).__name__ == "LlamaActionConfig"
    assert mc.hf_config.num_action_embeddings == 6 and mc.hf_config.vocab_size == 262145


def test_info_limits_and_tokens_per_item(processor):
    info = processor.info
    assert info.get_supported_mm_limits() == {"actions": 24}  # 25 frames per round, the last is generated
    assert info.get_mm_max_tokens_per_item(25 * FL, {"actions": 24}) == {"actions": A}


# ---------------------------------------------------------------------------- prompts and items
def test_seed_placeholders_become_in_vocab_ids_and_code_zero_stays(processor, layout, sample):
    assert bool((sample.context == 0).any()), "the sample context must contain code 0"
    seed_prompt = build_prompt(sample.context, layout, placeholder=SEED_PLACEHOLDER)
    ph_prompt = build_prompt(sample.context, layout)
    a = sample.actions[:3]
    r_seed = process(processor, seed_prompt, a.reshape(-1, 3))  # the seed's flat [n*6, 3] form
    r_ph = process(processor, ph_prompt, list(a))  # a list of per-frame [6, 3]
    assert r_seed["prompt_token_ids"] == r_ph["prompt_token_ids"] == ph_prompt
    ids = torch.tensor(r_ph["prompt_token_ids"]).view(3, FL)
    assert torch.equal(ids[:, :P], sample.context)  # every code as itself, 0 included
    assert bool((ids[:, P:] == PH).all())
    assert r_seed["mm_hashes"] == r_ph["mm_hashes"]


def test_one_item_per_frame_at_its_slots(processor, layout, sample):
    r = process(processor, build_prompt(sample.context, layout), sample.actions[:3])
    ranges = r["mm_placeholders"]["actions"]
    assert [(p.offset, p.length) for p in ranges] == [(k * FL + P, A) for k in range(3)]
    items = r["mm_kwargs"]["actions"]
    assert len(items) == 3
    for k, item in enumerate(items):
        assert torch.equal(item["actions"].data, sample.actions[k])


def test_item_hashes_are_per_frame_so_longer_prompts_share_a_prefix(processor, layout, sample):
    rng = torch.Generator().manual_seed(0)
    frames = torch.randint(0, P, (4, P), generator=rng)
    short = process(processor, build_prompt(frames[:3], layout), sample.actions[:3])["mm_hashes"]["actions"]
    longer = process(processor, build_prompt(frames, layout), sample.actions[:4])["mm_hashes"]["actions"]
    assert longer[:3] == short and len(set(longer)) == 4
    other = sample.actions[:3].clone()
    other[1, 2, 0] += 0.5
    changed = process(processor, build_prompt(frames[:3], layout), other)["mm_hashes"]["actions"]
    assert changed[0] == short[0] and changed[1] != short[1]


# ---------------------------------------------------------------------------- profiling inputs
def test_dummy_inputs_worst_case_is_24_frames_of_6_action_tokens(processor):
    d = dummy_mm_inputs(processor, {"actions": 24})  # vLLM's own profiling path
    ranges = d["mm_placeholders"]["actions"]
    assert len(ranges) == 24 and sum(r.length for r in ranges) == 144
    assert len(d["prompt_token_ids"]) == 25 * FL  # padded to max_model_len by vLLM
    one = dummy_mm_inputs(processor, {"actions": 1})
    assert [(r.offset, r.length) for r in one["mm_placeholders"]["actions"]] == [(P, A)]


def test_zero_frames_of_dummy_inputs_omit_the_modality_and_take_the_empty_branch_of_apply(processor):
    """A count of 0 gives no `actions` key (an empty [0, 3] tensor would be refused by the parser
    as a wrong action shape), and `apply` hands the empty prompt to vLLM's own `apply`."""
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    assert processor.dummy_inputs.get_dummy_mm_data(25 * FL, {"actions": 0}) == {}
    assert processor.dummy_inputs.get_dummy_prompt_ids(25 * FL, {"actions": 0}) == []
    empty = processor.apply(ProcessorInputs(prompt=[], mm_data_items=processor.info.parse_mm_data({})),
                            TimingContext(enabled=False))
    assert list(empty["prompt_token_ids"]) == [] and not empty["mm_placeholders"].get("actions")
    d = dummy_mm_inputs(processor, {"actions": 0})  # vLLM's own profiling path, no item
    assert not d["mm_placeholders"].get("actions")


# ---------------------------------------------------------------------------- checks
def _bad_cases(layout, sample):
    ctx, a3 = sample.context, sample.actions[:3]
    good = build_prompt(ctx, layout)
    five_slots = good.copy()
    five_slots[FL + P + 2] = 7  # a code where frame 1's slot 2 should be
    out_of_range = good.copy()
    out_of_range[5] = 512  # the placeholder id at an image position
    negative = good.copy()
    negative[3] = -1
    too_many = build_prompt(torch.zeros(25, P, dtype=torch.long), layout)
    nan = a3.clone()
    nan[0, 0, 0] = float("nan")
    inf = a3.clone()
    inf[2, 5, 1] = float("inf")
    return {
        "not frame-aligned": (good[:-1], a3),
        "wrong action slots": (five_slots, a3),
        "image code out of range": (out_of_range, a3),
        "image code out of range ": (negative, a3),
        "too many frames": (too_many, torch.zeros(25, A, 3)),
        "actions do not match the prompt": (good, sample.actions[:2]),
        "NaN or inf": (good, nan),
        "NaN or inf ": (good, inf),
        "wrong action shape": (good, torch.zeros(3, 5, 3)),
        "wrong action shape ": (good, torch.zeros(17, 3)),
        "wrong action shape  ": (good, [torch.zeros(6, 3), torch.zeros(6, 2)]),
    }


def test_each_bad_request_raises_a_value_error_naming_it(processor, layout, sample):
    for needle, (prompt, actions) in _bad_cases(layout, sample).items():
        with pytest.raises(ValueError, match=needle.strip()):
            process(processor, prompt, actions)
    # and the processor still serves a good one
    r = process(processor, build_prompt(sample.context, layout), sample.actions[:3])
    assert len(r["mm_placeholders"]["actions"]) == 3


def test_text_prompts_are_refused(processor, sample):
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    items = processor.info.parse_mm_data({"actions": sample.actions[:1]})
    with pytest.raises(ValueError, match="token ids"):
        processor.apply(ProcessorInputs(prompt="a road", mm_data_items=items), TimingContext(enabled=False))
