"""`vllm_patch.wrap`: a vLLM without a method a port wraps is logged and skipped, never raised.

vLLM calls the ports' plugins in every process of every engine without a guard, so a plugin that
raised for a renamed private method would stop every engine of the environment. Here, on the real
vLLM classes (a method deleted for the test, restored after): `wrap` leaves the class alone, says
once which method and which check it skipped, and the ports then refuse what they cannot check
(their processors, which vLLM builds as an engine starts, raise a `RuntimeError` naming the method).
`tests/test_port_copy.py` starts engines on such a vLLM (Terra's and TinyVLM's, with Terra's
streaming-session method gone) and checks Terra's refusal of a session chunk.
"""
from __future__ import annotations

import logging

import pytest
from vllm.v1.engine.input_processor import InputProcessor

from terra_nb.port import vllm_patch as P
from terra_nb.port_vlm import vllm_patch as P_VLM


@pytest.fixture
def fresh_records(monkeypatch):
    """Both ports' skip records empty for the test, and as they were after it."""
    monkeypatch.setattr(P, "_SKIPPED", {})
    monkeypatch.setattr(P_VLM, "_SKIPPED", {})


def _never(original):
    raise AssertionError("a method that is not there was wrapped")


@pytest.mark.parametrize("patch, why", [
    (P.Patch(P.PROCESS_INPUTS.module, "InputProcessor", "process_inputs_v2", ("self",)),
     "InputProcessor.process_inputs_v2 is gone (AttributeError"),
    (P.Patch("vllm.v1.engine.no_such_module", "InputProcessor", "process_inputs", ("self",)),
     "no_such_module:InputProcessor.process_inputs is gone (ModuleNotFoundError"),
    (P.PROCESS_INPUTS._replace(params=("self", "prompt")),
     "InputProcessor.process_inputs takes ['self', 'request_id'] first, the wrapper expects ['self', 'prompt']"),
])
def test_a_method_this_vllm_lacks_is_skipped_and_logged_once(fresh_records, caplog, patch, why):
    before = InputProcessor.process_inputs
    with caplog.at_level(logging.WARNING, logger=P.__name__):
        assert P.wrap(patch, "_test_door", _never, "the test's check") is False
        assert P.wrap(patch, "_test_door", _never, "the test's check") is False  # the plugin runs again
    assert InputProcessor.process_inputs is before
    [record] = caplog.records
    assert why in record.getMessage() and record.getMessage().endswith(": skipped the test's check")
    assert why in P.skipped(patch) and P.skipped(P.PROCESS_INPUTS) is None


def test_without_process_inputs_the_plugins_register_and_each_port_refuses_to_build_its_engine(
        fresh_records, monkeypatch, tiny_ckpt, tmp_path):
    """The door's method gone: both plugins register without raising (so other models' engines
    start), and neither port's processor can be built (so neither engine serves unchecked)."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from terra_nb.port import vllm_frontdoor, vllm_plugin
    from terra_nb.port_vlm import vllm_plugin as vlm_plugin
    from terra_nb.port_vlm.checkpoints import write_random_checkpoint

    monkeypatch.delattr(InputProcessor, "process_inputs")
    vllm_plugin.register()
    vlm_plugin.register()
    assert not vllm_frontdoor.installed()
    terra = ModelConfig(model=str(tiny_ckpt), skip_tokenizer_init=True, dtype="float32", max_model_len=420)
    vlm = ModelConfig(model=str(write_random_checkpoint(tmp_path / "vlm")), dtype="float32", max_model_len=512)
    gone = r"vLLM [^ ]+'s vllm.v1.engine.input_processor:InputProcessor.process_inputs is gone"
    with pytest.raises(RuntimeError, match=rf"^no Terra engine on this vLLM: Terra's front door is not installed \({gone}"):
        MULTIMODAL_REGISTRY.create_processor(terra)
    with pytest.raises(RuntimeError, match=rf"^no TinyVLM engine on this vLLM: its front door is not installed \({gone}"):
        MULTIMODAL_REGISTRY.create_processor(vlm)
    # the refusal is the missing door's, nothing else: with the records cleared both build
    P._SKIPPED.clear()
    P_VLM._SKIPPED.clear()
    assert MULTIMODAL_REGISTRY.create_processor(terra) and MULTIMODAL_REGISTRY.create_processor(vlm)
