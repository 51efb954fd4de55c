"""TinyAV in a real vLLM engine (in this process, registered by `register()`, not installed): fp32
greedy tokens equal to HF's, token by token, with items raw (vLLM calls the HF processor) and
already processed (passed straight to the model); `embed_multimodal` called once per modality, in
the release's order; the encoder cache sized from `get_mm_max_tokens_per_item`; value errors
refused before the engine, which serves on. One engine for the module."""
from __future__ import annotations

import pytest
import torch

MAX_TOKENS = 8


pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from terra_nb.port_av.checkpoints import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("tiny_av"))


@pytest.fixture(scope="module")
def llm(ckpt):
    from terra_nb.lessons.port_av import EMBED_LOG_EXTENSION, embed_calls
    from terra_nb.port_av.vllm_engine import make_llm
    from terra_nb.port_av.vllm_plugin import register

    register()
    engine = make_llm(ckpt, worker_extension_cls=EMBED_LOG_EXTENSION)
    embed_calls(engine)  # installs the log, drops the start-up profiling's calls
    yield engine
    from terra_nb.port.vllm_compat import shutdown_llm

    shutdown_llm(engine)


@pytest.fixture(scope="module")
def hf(ckpt):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return AutoModelForImageTextToText.from_pretrained(ckpt).eval(), AutoProcessor.from_pretrained(ckpt)


def _items(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, 16, 16, generator=g), torch.randn(50, generator=g), torch.randn(300, generator=g)


def _greedy(llm, req):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return list(llm.generate([req], params, use_tqdm=False)[0].outputs[0].token_ids)


def test_greedy_tokens_equal_hf_with_items_raw_and_processed(llm, hf):
    from terra_nb.lessons.port_av import greedy_parity

    img, short, long = _items(1)
    prompts = {"image and clip": ("<image> what is the sound <audio> here", [img], [short]),
               "two clips, two lengths": ("<audio> and <audio> which is loud", None, [long, short]),
               "clip only": ("listen <audio>", None, [long])}
    rows = greedy_parity(llm, *hf, prompts, MAX_TOKENS)
    assert [(r.name, r.path) for r in rows] == [(n, p) for n in prompts for p in ("raw", "processed")]
    assert [r.prompt_tokens for r in rows] == [1 + 4 + 4 + 4 + 1] * 2 + [1 + 19 + 1 + 4 + 3] * 2 + [1 + 1 + 19] * 2
    for r in rows:
        assert r.hf == r.vllm, f"{r.name} ({r.path}): HF {r.hf} vs vLLM {r.vllm}"
    assert len({tuple(r.hf) for r in rows[::2]}) == 3  # the items reach the model


def test_embed_multimodal_gets_one_modality_per_call_in_the_release_order(llm):
    """Items not seen before (the encoder cache would skip them), image / audio / image in the prompt."""
    from terra_nb.lessons.port_av import embed_calls, release_facts
    from terra_nb.port_av.vllm_engine import request

    a, clip, _ = _items(3)
    b = _items(4)[0]
    embed_calls(llm)
    _greedy(llm, request("<image> then <audio> then <image>", [a, b], [clip]))
    calls = embed_calls(llm)
    if release_facts()["encoder_items_sorted_by_modality"]:  # 0.32: sorted by modality name
        assert calls == [("audio", 1), ("image", 2)]
    else:  # 0.26: consecutive items of one modality, prompt order
        assert calls == [("image", 1), ("audio", 1), ("image", 1)]


def test_the_encoder_cache_is_sized_from_the_declared_longest_clip(llm):
    processor_limit = 512 - 2  # get_mm_max_tokens_per_item's audio for max_model_len 512
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    assert llm.llm_engine.input_processor.mm_encoder_cache_size == max(scheduler.encoder_cache_size, processor_limit)


@pytest.mark.parametrize("text, images, audio, message", [
    ("<audio> what", None, [torch.full((40,), float("nan"))], "holds NaN"),
    ("what", None, "clip", r"0 <audio> token\(s\) but 1 audio"),
    ("<audio> what", None, [torch.zeros(16 * 600)], "600 tokens; at most 510"),
    ("<audio> what", None, {"audio_frames": torch.zeros(3, 16), "audio_num_frames": torch.tensor([5])}, "the sum of"),
])
def test_bad_requests_are_refused_and_the_engine_serves_on(llm, text, images, audio, message):
    from terra_nb.port_av.vllm_engine import request

    img, clip, _ = _items(5)
    good = request("<image> what <audio>", [img], [clip])
    before = _greedy(llm, good)
    with pytest.raises(ValueError, match=message):
        _greedy(llm, request(text, images, [clip] if audio == "clip" else audio))
    assert _greedy(llm, good) == before


def test_what_vllm_users_send_a_pil_image_and_a_16khz_tuple_equal_hf(llm, hf):
    """A 211x149 PIL image (resized to the fixed 16 x 16) and a `(np.ndarray, 16000)` clip, each not
    in a list, through `generate`; and the image as an `image_url` through `LLM.chat` with no
    `chat_template` argument: the greedy tokens equal HF's on the same items and text."""
    import numpy as np
    from vllm import SamplingParams

    from terra_nb.port_av.hf_model import greedy_generate
    from test_port_vlm_engine import photo, pil_data_url

    model, proc = hf
    image, clip = photo(), (np.random.default_rng(0).standard_normal(300).astype(np.float32), 16000)
    text = "<image> what is the sound <audio> here"
    got = _greedy(llm, {"prompt": text, "multi_modal_data": {"image": image, "audio": clip}})
    assert got == greedy_generate(model, proc(text=text, images=image, audio=clip), MAX_TOKENS)
    as_lists = _greedy(llm, {"prompt": text, "multi_modal_data": {"image": [image], "audio": [clip[0]]}})
    assert as_lists == got

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": pil_data_url(image)}},
                                             {"type": "text", "text": "what is the picture"}]}]
    out = llm.chat(messages, params, use_tqdm=False)[0]
    assert out.prompt == "<s><image> what is the picture "
    inputs = proc(text=out.prompt, images=image, add_special_tokens=False)  # as chat front ends tokenize
    assert list(out.prompt_token_ids) == inputs["input_ids"][0].tolist()
    assert list(out.outputs[0].token_ids) == greedy_generate(model, inputs, MAX_TOKENS)
