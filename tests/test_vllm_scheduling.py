"""The scheduler's fast path for decoding Terra requests (`vllm_scheduling`) returns exactly what
vLLM's own `Scheduler._try_schedule_encoder_inputs` returns, on vLLM 0.32 and on vLLM 0.26.

The probe runs vLLM's real method, unwrapped and wrapped, for a request with three action items at
every window from before the first item to past the last. Where the wrapper takes its fast path (the
window starts at or after the last item's end), vLLM's search runs over the real items and finds
none; the wrapper must give the same tuple. The other windows go to vLLM's method unchanged, which
the routing test checks. The probe runs in this process for the installed vLLM (vLLM's method is
what the wrapper wraps), and in a fresh interpreter with 0.26's source first on the path for 0.26.
"""
from __future__ import annotations

import types

import pytest

_PROBE = r"""
import json, types
import vllm
from vllm.multimodal.inputs import PlaceholderRange
from vllm.v1.core.sched.scheduler import Scheduler
from terra_nb.workbook.checkpoints import preset_config
from terra_nb.port import vllm_scheduling

original = Scheduler._try_schedule_encoder_inputs
while getattr(original, vllm_scheduling._MARK, False):  # installed already (this process ran an engine)
    original = original.__wrapped__
vllm_scheduling.install()
wrapped = Scheduler._try_schedule_encoder_inputs

def scheduler():
    mc = types.SimpleNamespace(hf_config=preset_config("tiny"))
    return types.SimpleNamespace(is_encoder_decoder=False, vllm_config=types.SimpleNamespace(model_config=mc))

# three frames' action items: 6 slots after each frame's 64 codes (the tiny layout)
items = [types.SimpleNamespace(mm_position=PlaceholderRange(offset=70 * k + 64, length=6), identifier=f"a{k}")
         for k in range(3)]
request = types.SimpleNamespace(mm_features=items, has_encoder_inputs=True, num_encoder_inputs=3)
end = items[-1].mm_position.offset + items[-1].mm_position.length
out = {"version": vllm.__version__, "installed": original is not wrapped, "same": [], "differ": []}
for computed in range(end, end + 80):
    for new in (1, 7, 64):
        a = original(scheduler(), request, computed, new, 1000)
        b = wrapped(scheduler(), request, computed, new, 1000)
        (out["same"] if list(a) == list(b) else out["differ"]).append([computed, new, repr(a), repr(b)])
out["example"] = repr(wrapped(scheduler(), request, end + 3, 1, 1000))
print("PROBE" + json.dumps(out))
"""


def _check(out: dict) -> None:
    assert out["installed"] and not out["differ"], out["differ"][:3]
    assert len(out["same"]) == 80 * 3
    n = 4 if out["version"].startswith("0.26") else 5  # 0.32 also returns the duplicate inputs
    assert out["example"] == repr(([], 1, 1000, *([[]] * (n - 3))))


def test_the_fast_path_returns_what_vllm_returns_on_the_installed_vllm(tiny_ckpt, probe_here):
    _check(probe_here(_PROBE, tiny_ckpt))


def test_the_fast_path_returns_what_vllm_returns_on_vllm_026(tiny_ckpt, run_probe, vllm026_src):
    out = run_probe(_PROBE, tiny_ckpt, vllm026_src)
    assert out["version"].startswith("0.26")
    _check(out)


def _route(model_type: str = "llama_action", encoder_decoder: bool = False, extra: tuple = ([], [])):
    """The wrapper around a stand-in for vLLM's method that records each request it was given and
    answers "nothing to schedule" as a release does: (inputs, tokens, budget, *extra)."""
    from terra_nb.port import vllm_scheduling
    from terra_nb.workbook.checkpoints import preset_config

    seen = []

    def vllm(self, request, computed, new, budget, *args):
        seen.append(request)
        return ([], new, budget, *extra)

    wrapper = vllm_scheduling._fast_path(vllm)
    cfg = preset_config("tiny")
    if model_type != cfg.model_type:
        cfg = types.SimpleNamespace(model_type=model_type)
    sched = types.SimpleNamespace(is_encoder_decoder=encoder_decoder, vllm_config=types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=cfg)))
    return wrapper, sched, seen


def _request():
    item = types.SimpleNamespace(mm_position=types.SimpleNamespace(offset=64, length=6))
    return types.SimpleNamespace(mm_features=[item])


@pytest.mark.parametrize("computed, fast", [(0, False), (69, False), (70, True), (500, True)])
@pytest.mark.parametrize("extra", [([],), ([], [])], ids=["0.26's shape", "0.32's shape"])
def test_only_a_window_past_every_item_takes_the_fast_path(computed, fast, extra):
    from terra_nb.port import vllm_scheduling

    wrapper, sched, seen = _route(extra=extra)
    request = _request()
    for _ in range(3):
        assert wrapper(sched, request, computed, 1, 100) == ([], 1, 100, *extra)
    # the fast path asks vLLM once per scheduler, with the stand-in, for its answer's shape
    assert seen == ([vllm_scheduling._NO_ITEMS] if fast else [request] * 3)


def test_an_answer_of_another_shape_sends_the_stand_in_to_vllm():
    from terra_nb.port import vllm_scheduling

    wrapper, sched, seen = _route(extra=([], [], []))
    assert wrapper(sched, _request(), 500, 1, 100) == ([], 1, 100, [], [], [])
    assert seen == [vllm_scheduling._NO_ITEMS] * 2   # the shape asked once, then the call itself


@pytest.mark.parametrize("model_type, encoder_decoder", [("llama", False), ("llama_action", True)])
def test_other_models_and_encoder_decoders_keep_vllms_search(model_type, encoder_decoder):
    wrapper, sched, seen = _route(model_type, encoder_decoder)
    request = _request()
    wrapper(sched, request, 500, 1, 100)
    assert seen == [request]


def test_an_engine_built_with_the_fast_path_off_keeps_vllms_search():
    from terra_nb.port import vllm_scheduling

    wrapper, sched, seen = _route()
    sched.vllm_config.additional_config = {vllm_scheduling.CONFIG_KEY: False}
    request = _request()
    wrapper(sched, request, 500, 1, 100)
    assert seen == [request] and not vllm_scheduling._asked(sched.vllm_config)
    sched.vllm_config.additional_config = {}   # vLLM's default: the fast path
    assert vllm_scheduling._asked(sched.vllm_config)


def test_the_plugin_wraps_the_scheduler_once():
    from terra_nb.port.vllm_patch import wrapped_by
    from terra_nb.port.vllm_plugin import register
    from terra_nb.port.vllm_scheduling import _MARK, ENCODER_SCHEDULING

    for _ in range(2):
        register()
    assert wrapped_by(_MARK, ENCODER_SCHEDULING) == 1
