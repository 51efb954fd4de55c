"""`terra_nb.lessons.inspect_vllm` on vLLM's real front end, without starting an engine.

The engine's pieces these helpers read (`llm.renderer`, `llm.llm_engine.vllm_config`) are built
here the way `LLM` builds them: a `VllmConfig` from `EngineArgs` for the tiny checkpoint and
vLLM's renderer for it. So `engine_input` runs vLLM's own rendering and processing code, and
`profiling_plan` vLLM's own `MultiModalBudget`, in seconds.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import terra_nb  # noqa: F401
from terra_nb.lessons import inspect_vllm as I
from terra_nb.workbook.checkpoints import preset_config
from terra_nb.port.layout import FrameLayout
from terra_nb.port.layout import SEED_PLACEHOLDER, build_prompt

P, A, FL = 64, 6, 70  # tiny: codes per frame, action slots, frame length
PH = 512


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    """An object with the attributes of `vllm.LLM` the helpers use, minus the engine core."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins
    from vllm.renderers import renderer_from_config

    load_general_plugins()
    cfg = EngineArgs(model=str(tiny_ckpt), skip_tokenizer_init=True, dtype="float32", max_model_len=25 * FL,
                     limit_mm_per_prompt={"actions": 24}, max_num_seqs=32,
                     enable_prefix_caching=True).create_engine_config()
    return SimpleNamespace(renderer=renderer_from_config(cfg), llm_engine=SimpleNamespace(vllm_config=cfg),
                           model_config=cfg.model_config)


def request(context, actions):
    return {"prompt_token_ids": build_prompt(context, FrameLayout.from_config(preset_config("tiny")),
                                             placeholder=SEED_PLACEHOLDER),
            "multi_modal_data": {"actions": actions}}


# ---------------------------------------------------------------------------- APIs and tables
def test_seed_api_is_gone_and_v1_api_is_there():
    assert {r["in this vLLM"] for r in I.api_presence(I.SEED_API)} == {"gone"}
    assert {r["in this vLLM"] for r in I.api_presence(I.V1_API)} == {"yes"}
    assert I.api_presence([("no_such_module:x", "r"), ("torch:nn.Linear", "r")])[0]["in this vLLM"] == "gone"
    assert I.api_presence([("torch:nn.Linear", "r")])[0] == {"name": "torch.nn.Linear", "in this vLLM": "yes",
                                                            "role": "r"}


def test_text_table():
    out = I.text_table([{"a": 1, "b": "x"}, {"a": 22222, "c": 0.5}])
    assert out.splitlines() == ["a       b  c", "------  -  ----", "1       x", "22,222     0.50"]


# ---------------------------------------------------------------------------- one request
def test_engine_processor_is_the_ports(llm):
    from terra_nb.port.vllm_processing import LlamaActionMultiModalProcessor

    assert isinstance(I.engine_processor(llm), LlamaActionMultiModalProcessor)


def test_engine_input_items_kwargs_and_hashes(llm, layout, sample):
    mi = I.engine_input(llm, request(sample.context, sample.actions[:3]))
    assert mi["prompt_token_ids"] == build_prompt(sample.context, layout)  # -3 became 512
    rows = I.item_rows(mi, layout)
    assert [(r["item"], r["offset"], r["length"], r["frame"]) for r in rows] == [(k, k * FL + P, A, k) for k in range(3)]
    assert all(r["ids there"] == [PH] and r["slots in frame"] == "64..69" for r in rows)
    assert all(r["actions"] == "(6, 3) float32" and len(r["hash"]) == 12 for r in rows)
    kw = I.model_kwargs(mi)
    assert list(kw) == ["actions"] and torch.equal(kw["actions"], sample.actions[:3])
    # per-frame hashes: one more frame keeps the first three
    longer = I.engine_input(llm, request(torch.cat([sample.context, sample.context[:1]]), sample.actions[:4]))
    assert longer["mm_hashes"]["actions"][:3] == mi["mm_hashes"]["actions"]


def test_bad_requests_each_raise_the_named_value_error(llm, layout, sample):
    from terra_nb.port.layout import RULES, rule_of

    bad = I.bad_requests(sample.context, sample.actions, layout)
    assert list(bad) == ["wrong_action_shape", "actions_not_finite", "actions_mismatch", "code_out_of_range",
                         "not_frame_aligned", "wrong_action_slots", "too_many_frames"]
    for rule, req in bad.items():
        with pytest.raises(ValueError) as err:
            I.engine_input(llm, req)
        assert rule_of(err.value) == rule and rule in RULES, (rule, str(err.value))
    assert len(I.engine_input(llm, request(sample.context, sample.actions[:3]))["mm_placeholders"]["actions"]) == 3


def test_probe_request_reports_errors_and_tokens():
    from terra_nb.port.vllm_patch import RequestValidationError

    def failing(*a, **k):
        raise RequestValidationError("too many frames: x", parameter="actions")

    p = I.probe_request(SimpleNamespace(generate=failing), {}, None)
    assert (p.ok, p.error, p.message) == (False, "RequestValidationError", "too many frames: x")
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[3, 1, 2])])
    p = I.probe_request(SimpleNamespace(generate=lambda *a, **k: [out]), {}, None)
    assert p.ok and p.tokens == (3, 1, 2) and p.line() == "ok, tokens [3, 1, 2]"


def test_predicted_cached_tokens_follow_blocks_and_item_hashes(layout, sample):
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, P, (4, P), generator=g)
    a = sample.actions[:4]
    old = build_prompt(frames[:3], layout) + frames[3].tolist()  # 3-frame prompt + the generated frame
    new = build_prompt(frames, layout)
    assert I.predicted_cached_tokens(old, a[:3], new, a, layout, 128) == 256
    assert I.predicted_cached_tokens(old, a[:3], new, a, layout, 16) == 272  # 274 shared -> 17 blocks
    for frame, want in ((1, 128), (0, 0)):
        changed = a.clone()
        changed[frame, 0, 0] += 1.0
        assert I.predicted_cached_tokens(old, a[:3], new, changed, layout, 128) == want
    assert I.predicted_cached_tokens(new, a, new, a, layout, 16) == 272  # never the whole prompt: 279 -> 272


# ---------------------------------------------------------------------------- start-up
def test_worst_case_from_the_config():
    terra = FrameLayout.from_config(preset_config("terra"))
    assert I.worst_case(terra) == {
        "prompt_frames": 24, "image_codes": 13824, "action_tokens": 144, "prompt_tokens": 13968,
        "generated_tokens": 576, "request_tokens": 14544, "max_model_len": 14550, "spare_tokens": 6,
    }
    tiny = FrameLayout.from_config(preset_config("tiny"))
    wc = I.worst_case(tiny)
    assert (wc["prompt_frames"], wc["action_tokens"], wc["prompt_tokens"], wc["max_model_len"]) == (24, 144, 1680, 1750)
    assert I.worst_case(tiny, 10 * FL)["prompt_frames"] == 9


def test_profiling_plan_is_vllms_budget(llm):
    plan = I.profiling_plan(llm)
    sched = llm.llm_engine.vllm_config.scheduler_config
    assert (plan["limit_per_prompt"], plan["tokens_per_item"], plan["items_per_prompt"]) == (24, 6, 24)
    assert plan["action_tokens_per_prompt"] == 144
    assert plan["lm_tokens"] == sched.max_num_batched_tokens and plan["max_model_len"] == 25 * FL
    assert plan["encoder_items"] == min(plan["encoder_budget_tokens"] // 6, sched.max_num_seqs * 24)
    batch = I.encoder_profile_batch(llm, n_items=5)
    one = I.engine_processor(llm).dummy_inputs.get_dummy_mm_data(0, {"actions": 1})["actions"]
    assert list(batch) == ["actions"] and batch["actions"].shape == (5, A, 3)
    assert torch.equal(batch["actions"][4], one)


def test_kv_cache_report_and_requests_that_fit(llm, layout):
    cc = llm.llm_engine.vllm_config.cache_config
    cc.num_gpu_blocks, cc.block_size = 100, 16  # what the engine core reports back
    cc.kv_cache_size_tokens, cc.kv_cache_max_concurrency = 1750, 1.0
    rep = I.kv_cache_report(llm)
    assert rep.bytes_per_token == I.kv_bytes_per_token(preset_config("tiny"), 4) == 2 * 2 * 1 * 64 * 4
    assert (rep.block_tokens, rep.kv_bytes, rep.kv_dtype) == (1600, 1600 * 1024, "float32")
    assert rep.blocks_for(17) == 2 and rep.as_dict()["block_tokens"] == 1600
    rows = I.requests_that_fit(rep, layout)
    assert [r["prompt_frames"] for r in rows] == list(range(1, 25))
    assert rows[0] == {"prompt_frames": 1, "tokens": 134, "blocks": 9, "fit_in_kv": 11, "concurrent": 11}
    assert rows[-1]["fit_in_kv"] == 100 // 109 == 0
    assert I.kv_bytes_per_token(preset_config("terra"), 2) == 22528


def test_plots(llm, layout, sample, tmp_path):
    from matplotlib.figure import Figure

    mi = I.engine_input(llm, request(sample.context, sample.actions[:3]))
    fig = I.plot_placeholders(mi, layout, save=tmp_path / "p.png")
    assert isinstance(fig, Figure) and (tmp_path / "p.png").stat().st_size > 0
    strip = fig.subfigs[0].axes[0]  # the prompt as a strip: 1 where an action slot is, 18 of 210
    assert strip.images[0].get_array().shape == (1, 210) and int(strip.images[0].get_array().sum()) == 18
    assert [t.get_text().split("\n")[0] for t in strip.texts] == [f"item {k}: offset {70 * k + 64}, length 6" for k in range(3)]
    cc = llm.llm_engine.vllm_config.cache_config
    cc.num_gpu_blocks, cc.block_size = 9000, 128
    fig = I.plot_kv_budget(I.kv_cache_report(llm), layout, I.profiling_plan(llm), save=tmp_path / "k.png")
    assert isinstance(fig, Figure) and (tmp_path / "k.png").stat().st_size > 0


# ---------------------------------------------------------------------------- vLLM 0.26.0
_PROBE = r"""
import json, os, sys
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
from types import SimpleNamespace
import terra_nb, vllm
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.renderers import renderer_from_config
from terra_nb.lessons import inspect_vllm as I
from terra_nb.port.layout import FrameLayout
from terra_nb.workbook.data import load_sample
from terra_nb.port.layout import build_prompt

mc = ModelConfig(model=sys.argv[1], skip_tokenizer_init=True, dtype="float32", max_model_len=1750,
                 limit_mm_per_prompt={"actions": 24})
sc = SchedulerConfig(max_model_len=1750, is_encoder_decoder=False, max_num_seqs=32, max_num_batched_tokens=2048,
                     enable_chunked_prefill=False)
cfg = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=CacheConfig(block_size=16),
                 device_config=DeviceConfig(device="cpu"))
llm = SimpleNamespace(renderer=renderer_from_config(cfg), llm_engine=SimpleNamespace(vllm_config=cfg), model_config=mc)
s = load_sample("tiny")
lay = FrameLayout.from_config(mc.hf_config)
mi = I.engine_input(llm, {"prompt_token_ids": build_prompt(s.context, lay, -3), "multi_modal_data": {"actions": s.actions[:3]}})
out = {"version": vllm.__version__, "ids": list(mi["prompt_token_ids"]),
       "rows": [{k: v for k, v in r.items() if k != "hash"} for r in I.item_rows(mi, lay)],
       "kwargs": {k: list(v.shape) for k, v in I.model_kwargs(mi).items()},
       "plan": I.profiling_plan(llm), "profile_batch": list(I.encoder_profile_batch(llm, 7)["actions"].shape),
       "v1_api": I.api_presence(I.V1_API), "seed_api": I.api_presence(I.SEED_API)}
errors = {}
for name, req in I.bad_requests(s.context, s.actions, lay).items():
    try:
        I.engine_input(llm, req)
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
out["errors"] = errors
cfg.cache_config.num_gpu_blocks = 100
out["kv"] = I.kv_cache_report(llm).as_dict()
print("PROBE" + json.dumps(out))
"""


def test_vllm_026_front_end_gives_the_same_answers(tiny_ckpt, run_probe, vllm026_src):
    """The helpers use only front-end APIs both releases share: same rows, kwargs, plan, errors.
    Where the installed vLLM is 0.26 (the GPU runner) the probe runs against it."""
    import vllm

    old = run_probe(_PROBE, tiny_ckpt, vllm026_src)
    new = old if vllm026_src is None else run_probe(_PROBE, tiny_ckpt, None)
    assert old["version"].startswith("0.26") and new["version"] == vllm.__version__
    for key in ("ids", "rows", "kwargs", "plan", "profile_batch", "v1_api", "seed_api", "errors", "kv"):
        assert old[key] == new[key], key
    assert new["plan"]["encoder_items"] == 2048 // 6 and all(new["errors"].values())
    # by hand, not from either release: item k covers the 6 slots after frame k's 64 codes (70 a frame)
    assert [(r["item"], r["offset"], r["length"], r["frame"]) for r in new["rows"]] == [(k, 70 * k + 64, 6, k) for k in range(3)]
    assert new["kwargs"] == {"actions": [3, 6, 3]} and new["profile_batch"] == [7, 6, 3]
    said = {"wrong_action_shape": "wrong action shape", "actions_not_finite": "actions contain NaN or inf",
            "actions_mismatch": "actions do not match the prompt", "code_out_of_range": "image code out of range",
            "not_frame_aligned": "prompt is not frame-aligned", "wrong_action_slots": "wrong action slots",
            "too_many_frames": "too many frames"}
    assert {name: msg.split(":")[0].split(" (")[0] for name, msg in new["errors"].items()} == said
