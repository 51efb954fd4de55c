"""TinyAV (terra_nb.port_av), without an engine: two modalities in one prompt, an HF processor that
needs the text, items raw or already processed, the value checks, and the vLLM facts notebook 13
and PORTING.md state ("Two modalities, and a processor that needs the text"), each checked against
the installed vLLM; where vLLM 0.26 is at hand (the `vllm026_src` fixture) the same processor runs
there too, in a subprocess, and must give the same prompts."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

TEXT = "<image> what is the sound <audio> here"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from terra_nb.port_av.checkpoints import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("tiny_av"))


@pytest.fixture(scope="module")
def processor(ckpt):
    from terra_nb.lessons.port_av import offline_processor

    return offline_processor(ckpt)


@pytest.fixture(scope="module")
def hf_proc(ckpt):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(ckpt)


@pytest.fixture(scope="module")
def items():
    g = torch.Generator().manual_seed(0)
    return torch.rand(3, 16, 16, generator=g), torch.randn(50, generator=g)  # 4 patches; 50 samples -> 4 frames


def test_the_hf_processor_needs_the_text_and_one_placeholder_per_item(hf_proc, items):
    img, clip = items
    out = hf_proc(text=TEXT, images=[img], audio=[clip])
    assert out["input_ids"][0].tolist() == [1, 4, 4, 4, 4, 18, 12, 7, 21, 5, 5, 5, 5, 3]
    assert out["pixel_values"].shape == (1, 4, 192) and out["audio_frames"].shape == (4, 16)
    assert out["audio_num_frames"].tolist() == [4]
    with pytest.raises(ValueError, match="needs the text"):
        hf_proc(images=[img])
    with pytest.raises(ValueError, match=r"1 <audio> token\(s\) but 2 audio clip"):
        hf_proc(text=TEXT, audio=[clip, clip])


def test_raw_processed_and_mixed_items_give_the_same_prompt_and_fields(processor, hf_proc, items):
    from terra_nb.lessons.port_av import hf_processor_calls, process, processed_items, release_facts, summary

    img, clip = items
    done = processed_items(hf_proc, [img], [clip])
    raw = summary(process(processor, TEXT, [img], [clip]))
    assert raw["ids"] == hf_proc(text=TEXT, images=[img], audio=[clip])["input_ids"][0].tolist()
    assert raw["runs"] == {"audio": [(9, 4)], "image": [(1, 4)]}
    assert raw["fields"] == {"audio": [{"audio_frames": [4, 16], "audio_num_frames": []}],
                             "image": [{"pixel_values": [4, 192]}]}
    assert summary(process(processor, TEXT, done["images"], done["audio"])) == raw
    assert summary(process(processor, TEXT, [img], done["audio"])) == raw
    # the HF processor gets text beside the raw items, and no data for the items passed processed
    assert hf_processor_calls(processor, process, processor, TEXT, [img], [clip]) == [
        {"text": "<image><audio>", "images": 1, "audio": 1}]
    assert hf_processor_calls(processor, process, processor, TEXT, [img], done["audio"]) == [
        {"text": "<image><audio>", "images": 1, "audio": None}]
    # all items processed: 0.32 calls no HF processor; 0.26 calls it with the text alone
    expected = [] if release_facts()["hf_text_from_get_hf_mm_text"] else [
        {"text": "<image><audio>", "images": None, "audio": None}]
    assert hf_processor_calls(processor, process, processor, TEXT, done["images"], done["audio"]) == expected


def test_without_the_release_switch_the_hf_processor_gets_no_text(processor, items):
    """TinyAV's processor sets both switches (0.32's `_get_hf_mm_text`, 0.26's `_call_hf_processor`
    override); with vLLM's defaults the HF processor is called with the data alone (0.32) and refuses."""
    from vllm.multimodal.processing import BaseMultiModalProcessor

    from terra_nb.lessons.port_av import error_of, hf_processor_calls, process, release_facts
    from terra_nb.port_av.vllm_processing import TinyAVMultiModalProcessor

    facts = release_facts()
    assert facts["hf_text_from_get_hf_mm_text"] != facts["hf_text_when_call_hf_processor_overridden"]
    defaults = {"_call_hf_processor": BaseMultiModalProcessor._call_hf_processor}
    if hasattr(BaseMultiModalProcessor, "_get_hf_mm_text"):
        defaults["_get_hf_mm_text"] = BaseMultiModalProcessor._get_hf_mm_text
    no_text = type("NoText", (TinyAVMultiModalProcessor,), defaults)(processor.info, processor.dummy_inputs)
    img, clip = items
    calls = hf_processor_calls(no_text, error_of, process, no_text, TEXT, [img], [clip])
    error = error_of(process, no_text, TEXT, [img], [clip])
    if facts["hf_text_from_get_hf_mm_text"]:  # 0.32
        assert calls == [{"text": None, "images": 1, "audio": 1}]
        assert error.startswith("ValueError: Failed to apply TinyAVProcessor")
    else:  # 0.26: `call_hf_processor_mm_only` looks for `image_processor` / `feature_extractor` only
        assert calls == [] and error is not None


@pytest.mark.parametrize("text, images, audio, message", [
    ("<audio> what", None, [torch.full((20,), float("nan"))], "audio clip 0: holds NaN"),
    ("<image> what", [torch.full((3, 16, 16), float("inf"))], None, "image 0: holds NaN or inf"),
    ("<audio> what", None, [torch.zeros(20, dtype=torch.int16)], "dtype torch.int16"),
    ("<image> what", [torch.rand(4, 16, 16)], None, r"shape \[4, 16, 16\]"),
    ("<image> what", "photo.png", None, "image 0: expected a PIL image or a float tensor"),
    ("<audio> what", None, (np.zeros(320, dtype=np.float32), 8000), "sampled at 8000 Hz; TinyAV takes 16000 Hz"),
    ("<audio> what", None, [torch.zeros(16 * 511)], "511 tokens; at most 510"),
    ("<audio> what", None, {"audio_frames": torch.zeros(3, 16), "audio_num_frames": torch.tensor([2])},
     r"expected float \[2 \(the sum"),
    ("<audio> what", None, {"audio_frames": torch.full((2, 16), float("nan")), "audio_num_frames": torch.tensor([2])},
     "audio_frames holds NaN"),
    ("<image> what", {"pixel_values": torch.zeros(1, 4, 192), "extra": torch.zeros(1)}, None, "keys"),
    ("what", None, [torch.zeros(20)], r"0 <audio> token\(s\) but 1 audio item"),
    ("<audio> <audio> what", None, [torch.zeros(20)], r"2 <audio> token\(s\) but 1 audio item"),
])
def test_value_checks_refuse_in_the_front_end(processor, text, images, audio, message):
    from terra_nb.lessons.port_av import process

    with pytest.raises(ValueError, match=message):
        process(processor, text, images, audio)


def _photo(width=211, height=149, seed=0):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(height, width, 3, generator=g) * 255).to(torch.uint8).numpy())


def test_every_input_form_gives_the_same_prompt_and_fields(processor, hf_proc, items):
    """What vLLM's users send: a PIL image of any size (resized to the fixed 16 x 16), float arrays
    and tensors; audio as a `(np.ndarray, 16000)` tuple or an array; one item not in a list is one
    item (not iterated into channels or samples). vLLM's processor equals the HF processor on each."""
    from terra_nb.lessons.port_av import process, summary

    img, clip = items
    photo = _photo()
    photo_t = torch.from_numpy(np.asarray(photo, dtype=np.float32) / 255.0).permute(2, 0, 1)
    forms = {
        "lists of tensors": ([img], [clip]),
        "one tensor each, not in lists": (img, clip),
        "numpy arrays, not in lists": (img.numpy(), clip.numpy()),
        "a (samples, rate) tuple": ([img], (clip.numpy(), 16000)),
        "tuples in a list": ([img], [(clip.numpy().astype(np.float64), 16000)]),
        "a list of floats": ([img], clip.tolist()),
    }
    base = summary(process(processor, TEXT, *forms["lists of tensors"]))
    for name, (images, audio) in forms.items():
        assert summary(process(processor, TEXT, images, audio)) == base, name
        hf = hf_proc(text=TEXT, images=images, audio=audio)
        assert hf["input_ids"][0].tolist() == base["ids"], name
    # a 211x149 PIL image: resized to 16 x 16, the same pixels through vLLM's processor and HF's
    out = process(processor, TEXT, photo, (clip.numpy(), 16000))
    hf = hf_proc(text=TEXT, images=photo, audio=(clip.numpy(), 16000))
    assert out["prompt_token_ids"] == hf["input_ids"][0].tolist() == base["ids"]
    pixels = out["mm_kwargs"]["image"][0]["pixel_values"].data
    assert torch.allclose(pixels, hf["pixel_values"][0], atol=1e-6)
    assert torch.allclose(pixels, hf_proc(text=TEXT, images=[photo_t], audio=[clip])["pixel_values"][0], atol=1e-6)
    with pytest.raises(ValueError, match="sampled at 8000 Hz"):
        hf_proc(text="<audio> what", audio=[clip], sampling_rate=8000)


def test_a_request_takes_one_item_not_in_a_list(processor, items):
    """`vllm_engine.request` with one PIL image and one `(samples, rate)` clip, not in lists: the
    request carries them as they are and the processor reads each as one item; empty lists or None
    give a prompt without items."""
    from terra_nb.lessons.port_av import process
    from terra_nb.port_av.vllm_engine import request

    _, clip = items
    photo = _photo()
    req = request(TEXT, photo, (clip.numpy(), 16000))
    data = req["multi_modal_data"]
    assert data["image"] is photo and set(data) == {"image", "audio"}
    listed = process(processor, TEXT, [photo], [(clip.numpy(), 16000)])
    assert process(processor, req["prompt"], data["image"], data["audio"])["prompt_token_ids"] == listed["prompt_token_ids"]
    assert request("x", images=[], audio=None) == {"prompt": "x"} == request("x")


def test_what_vllm_does_by_itself_with_unmatched_items(processor, items):
    """PORTING.md's corrected facts: vLLM's own `apply` raises an `AssertionError` for an item without
    its placeholder (0.26 and 0.32; its "Expected there to be N prompt placeholders" is a
    `RuntimeError` neither release reaches here) and serves an extra placeholder as a word."""
    from terra_nb.lessons.port_av import error_of, process, release_facts

    _, clip = items
    assert error_of(process, processor, "what is the sound", None, [clip], vllm_apply=True) == (
        "AssertionError: Failed to apply prompt replacement for mm_items['audio'][0]")
    assert error_of(process, processor, "<audio> what <audio>", None, [clip], vllm_apply=True) is None
    facts = release_facts()
    assert facts["unplaced_item_asserts"] and facts["placeholder_count_is_runtime_error"]
    with pytest.raises(ValueError, match="Unsupported modality: video"):  # only the subparsers' modalities
        processor.info.parse_mm_data({"video": [torch.zeros(1)]})


def test_processed_items_need_enable_mm_embeds(ckpt, hf_proc, items):
    from terra_nb.lessons.port_av import error_of, offline_processor, process, processed_items

    done = processed_items(hf_proc, *[[x] for x in items])
    plain = offline_processor(ckpt, enable_mm_embeds=False)
    assert error_of(process, plain, "<audio> what", None, done["audio"]) == (
        "ValueError: You must set `--enable-mm-embeds` to input `audio_embeds`")


def test_the_longest_clip_is_what_fits_the_sequence(processor):
    """`get_mm_max_tokens_per_item` for an item with no natural maximum: the longest clip the parser
    accepts (the sequence less `<s>` and one generated token); vLLM's own budget reads it as is."""
    from vllm.multimodal.encoder_budget import get_mm_max_toks_per_item

    info = processor.info
    assert dict(info.get_mm_max_tokens_per_item(512, {"image": 1, "audio": 1})) == {"image": 4, "audio": 510}
    counts = {"image": 1, "audio": 1}
    try:  # 0.32: (processor, mm_counts, cache); 0.26: (model_config, mm_registry, processor, mm_counts)
        budget = get_mm_max_toks_per_item(processor, counts, None)
    except TypeError:
        from vllm.multimodal import MULTIMODAL_REGISTRY

        budget = get_mm_max_toks_per_item(info.ctx.model_config, MULTIMODAL_REGISTRY, processor, counts)
    assert dict(budget) == {"image": 4, "audio": 510}
    dummy = processor.dummy_inputs.get_dummy_mm_data(512, {"audio": 1})["audio"][0]
    assert info.sizes.audio_tokens(dummy.numel()) == 510
    info.parse_mm_data({"audio": [torch.zeros(16 * 510)]})  # the longest accepted


def test_configure_mm_token_handling_only_decides_whether_placeholders_are_masked():
    """vLLM's `configure_mm_token_handling` records whether a placeholder id is outside the
    vocabulary; only then does `embed_input_ids` embed the placeholder positions as id 0."""
    from vllm.model_executor.models.interfaces import SupportsMultiModal

    seen = []
    model = types.SimpleNamespace()
    for ids, oov in (([4, 5], False), ([4, 300], True)):
        SupportsMultiModal.configure_mm_token_handling(model, vocab_size=256, mm_token_ids=ids)
        assert model._has_oov_mm_tokens is oov
        SupportsMultiModal._embed_text_input_ids(model, torch.tensor([1, 4, 7]), lambda t: seen.append(t.tolist()),
                                                 is_multimodal=torch.tensor([False, True, False]))
    assert seen == [[1, 4, 7], [1, 0, 7]]


def test_mark_tower_model_skips_the_tower_of_a_modality_the_engine_allows_none_of(ckpt):
    from torch import nn
    from vllm.config import ModelConfig, VllmConfig
    from vllm.model_executor.models.interfaces import SupportsMultiModal
    from vllm.model_executor.models.utils import StageMissingLayer

    class Towers(nn.Module, SupportsMultiModal):
        def __init__(self, vllm_config):
            super().__init__()
            with self._mark_tower_model(vllm_config, "image"):
                self.vision_tower = nn.Linear(2, 2)
            with self._mark_tower_model(vllm_config, "audio"):
                self.audio_tower = nn.Linear(2, 2)

    mc = ModelConfig(model=str(ckpt), dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 0, "audio": 1})
    towers = Towers(VllmConfig(model_config=mc))  # a real config: every field any release reads (e.g. 0.33's runner)
    assert isinstance(towers.vision_tower, StageMissingLayer) and towers.vision_tower.stage_name == "image_tower"
    assert type(towers.audio_tower) is nn.Linear


def test_the_order_of_embed_multimodal_calls_per_release(vllm026_src):
    """0.32 sorts the scheduled items by modality name before grouping them (audio before image);
    0.26 groups consecutive items of one modality in prompt order. The engine test sees the calls."""
    from terra_nb.lessons.port_av import release_facts

    installed = release_facts()
    old = release_facts(vllm026_src) if vllm026_src is not None else installed
    assert old["encoder_items_sorted_by_modality"] is False and old["hf_text_when_call_hf_processor_overridden"]
    assert not old["hf_text_from_get_hf_mm_text"]


_PROBE = r"""
import json, sys, torch
import vllm
from transformers import AutoProcessor
from terra_nb.lessons import port_av as L
d = sys.argv[1]
proc, hp = L.offline_processor(d), AutoProcessor.from_pretrained(d)
g = torch.Generator().manual_seed(0)
img, clip = torch.rand(3, 16, 16, generator=g), torch.randn(50, generator=g)
text = "<image> what is the sound <audio> here"
done = L.processed_items(hp, [img], [clip])
out = {"version": vllm.__version__,
       "raw_calls": L.hf_processor_calls(proc, L.process, proc, text, [img], [clip]),
       "forms": [L.summary(L.process(proc, text, *f)) for f in ([[img], [clip]], [done["images"], done["audio"]],
                                                                   [[img], done["audio"]])],
       "errors": [L.error_of(L.process, proc, "what", None, [clip], vllm_apply=True),
                  L.error_of(L.process, proc, "<audio> what <audio>", None, [clip], vllm_apply=True),
                  L.error_of(L.process, proc, "what", None, [clip])]}
print("PROBE" + json.dumps(out))
"""


def test_vllm_026_runs_the_same_processor_to_the_same_prompts(ckpt, run_probe, vllm026_src):
    old = run_probe(_PROBE, ckpt, vllm026_src)
    new = old if vllm026_src is None else run_probe(_PROBE, ckpt, None)
    assert old["version"].startswith("0.26")
    assert old["raw_calls"] == new["raw_calls"] == [{"text": "<image><audio>", "images": 1, "audio": 1}]
    assert old["forms"] == new["forms"] and all(f == new["forms"][0] for f in new["forms"])
    assert old["errors"] == new["errors"]
    assert old["errors"][0].startswith("AssertionError: Failed to apply prompt replacement") and old["errors"][1] is None
