"""`LLM.chat`'s prompt ids for TinyVLM and TinyAV equal HF's (one `<s>`, the chat template's), on
vLLM 0.32 and on vLLM 0.26, without an engine: vLLM's own `LLM._preprocess_chat` (the code
`LLM.chat` runs before the engine: render the template, tokenize, run the multimodal processor) on
a renderer built from the checkpoint, with the plugins registered as every vLLM process does.

vLLM 0.26 tokenizes a chat with the multimodal processor's defaults (`add_special_tokens=True`), a
second `<s>` after the template's; the plugins' `vllm_chat` gives it 0.32's default. The 0.26 half
runs where 0.26 is (the `vllm026_src` fixture: installed on the GPU runner, or an unpacked wheel
named by `$TERRA_VLLM026_SRC`), in a subprocess, and must give exactly what the installed release
gives (its probe runs in this process).
"""
from __future__ import annotations

import pytest

_PROBE = r"""
import base64, io, json, sys, types
import numpy as np
from PIL import Image
import vllm
from vllm.config import DeviceConfig, ModelConfig, VllmConfig
from vllm.entrypoints.llm import LLM
from vllm.platforms import current_platform
from vllm.renderers import renderer_from_config
from transformers import AutoProcessor
from terra_nb.port_av.vllm_plugin import register as register_av
from terra_nb.port_vlm.vllm_plugin import register as register_vlm

register_vlm()
register_av()
root = sys.argv[1]
photo = Image.fromarray((np.random.default_rng(0).random((149, 211, 3)) * 255).astype(np.uint8))
buf = io.BytesIO()
photo.save(buf, format="PNG")
url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
chats = {"text": "describe the picture",
         "image": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is the picture"}]}
out = {"version": vllm.__version__}
for port in ("vlm", "av"):
    d = f"{root}/{port}"
    mc = ModelConfig(model=d, dtype="float32", max_model_len=512)
    # the platform's device; none where 0.26's source runs beside a CPU-only torch (its renderer needs none)
    device = DeviceConfig(device=current_platform.device_type or "cpu")
    llm = types.SimpleNamespace(model_config=mc, chat_template=None,  # what `_preprocess_chat` reads
                                renderer=renderer_from_config(VllmConfig(model_config=mc, device_config=device)))
    hf = AutoProcessor.from_pretrained(d)
    for name, content in chats.items():
        (got,) = LLM._preprocess_chat(llm, [[{"role": "user", "content": content}]])
        images = photo if name == "image" else None
        want = hf(text=got["prompt"], images=images, add_special_tokens=False)["input_ids"][0].tolist()
        out[f"{port} {name}"] = {"prompt": got["prompt"], "vllm": list(got["prompt_token_ids"]), "hf": want}
    # a caller's own tokenization_kwargs still win
    (asked,) = LLM._preprocess_chat(llm, [[{"role": "user", "content": "what"}]],
                                    tokenization_kwargs={"add_special_tokens": True})
    out[f"{port} asked"] = list(asked["prompt_token_ids"])[:2]
print("PROBE" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A random TinyVLM and TinyAV checkpoint, as `<root>/vlm` and `<root>/av`."""
    from terra_nb.port_av.checkpoints import write_random_checkpoint as write_av
    from terra_nb.port_vlm.checkpoints import write_random_checkpoint as write_vlm

    root = tmp_path_factory.mktemp("chat_ckpts")
    write_vlm(root / "vlm")
    write_av(root / "av")
    return root


def _check(out: dict) -> None:
    for port in ("vlm", "av"):
        for name in ("text", "image"):
            got = out[f"{port} {name}"]
            assert got["prompt"].startswith("<s>") and not got["prompt"].startswith("<s><s>")
            assert got["vllm"] == got["hf"], f"{out['version']}, {port}, {name} chat: vLLM {got['vllm'][:4]}..., HF {got['hf'][:4]}..."
            assert got["vllm"][:2].count(1) == 1  # one <s>
        assert out[f"{port} asked"] == [1, 1]  # asked for special tokens: the tokenizer's <s> too


def test_llm_chat_prompt_ids_equal_hf_on_the_installed_vllm(checkpoints, probe_here):
    _check(probe_here(_PROBE, checkpoints))


def test_llm_chat_prompt_ids_equal_hf_on_vllm_026(checkpoints, run_probe, vllm026_src):
    out = run_probe(_PROBE, checkpoints, vllm026_src)
    assert out["version"].startswith("0.26")
    _check(out)


def test_each_plugin_wraps_llm_chat_once_for_its_own_models():
    """`vllm_patch.CHAT_RENDERING` (`LLM._preprocess_chat`) wrapped once per port, however often the
    plugins run; the default applies to the port's models only, and a caller's kwargs win."""
    import types

    from terra_nb.port_av import vllm_chat as chat_av
    from terra_nb.port_av.config import TinyAVConfig
    from terra_nb.port_av.vllm_plugin import register as register_av
    from terra_nb.port_vlm import vllm_chat as chat_vlm
    from terra_nb.port_vlm.config import TinyVLMConfig
    from terra_nb.port_vlm.vllm_patch import CHAT_RENDERING, wrapped_by
    from terra_nb.port_vlm.vllm_plugin import register as register_vlm

    for _ in range(2):
        register_vlm()
        register_av()
    assert wrapped_by(chat_vlm._MARK, CHAT_RENDERING) == wrapped_by(chat_av._MARK, CHAT_RENDERING) == 1

    def preprocess_chat(self, conversations, chat_template=None, chat_template_content_format="auto",
                        chat_template_kwargs=None, add_generation_prompt=True, continue_final_message=False,
                        tools=None, tokenization_kwargs=None, mm_processor_kwargs=None):
        return tokenization_kwargs

    llm = lambda config: types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=config))  # noqa: E731
    vlm = chat_vlm._chat_without_special_tokens(preprocess_chat)
    assert vlm(llm(TinyVLMConfig()), [[]]) == {"add_special_tokens": False}
    assert vlm(llm(TinyVLMConfig()), [[]], tokenization_kwargs={"add_special_tokens": True}) == {"add_special_tokens": True}
    assert vlm(llm(TinyAVConfig()), [[]]) is None  # the other port's model: its own wrapper's business
    assert chat_av._chat_without_special_tokens(preprocess_chat)(llm(TinyAVConfig()), [[]]) == {"add_special_tokens": False}
    assert vlm(llm(object()), [[]], None, "auto", None, True, False, None, {"truncation": True}) == {"truncation": True}
