"""TinyVLM (terra_nb.port_vlm), without an engine: checkpoint, HF processor, vLLM's processor run
offline as the engine builds it, the request checks, registration and the two-port table."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from terra_nb.port_vlm.checkpoints import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("tiny_vlm"))


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(1)
    return torch.rand(3, 16, 24, generator=g), torch.rand(3, 32, 32, generator=g)  # 2x3 and 4x4 patches


@pytest.fixture(scope="module")
def processor(ckpt):
    from terra_nb.lessons.port_vlm import offline_processor

    return offline_processor(ckpt)


def test_checkpoint_folder_is_self_contained(ckpt):
    names = {p.name for p in ckpt.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "processor_config.json"} <= names
    # the chat template where released models keep it, so LLM.chat and vllm serve need no argument
    from terra_nb.port_vlm.hf_processing import CHAT_TEMPLATE

    assert json.loads((ckpt / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    text = json.loads((ckpt / "config.json").read_text())["text_config"]
    # vLLM's CPU attention takes head_dim 64; RoPE as rope_parameters with a theta vLLM must not replace
    assert text["head_dim"] == 64 and text["num_key_value_heads"] == 1
    assert text["rope_parameters"]["rope_theta"] == 50000.0


def test_hf_processor_expands_each_image_to_its_patches(ckpt, images):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(ckpt)
    out = proc(text="<image> red <image> car", images=list(images))
    ids = out["input_ids"][0].tolist()
    assert ids[0] == 1 and ids.count(proc.image_token_id) == 6 + 16
    assert out["pixel_values"].shape == (22, 192) and out["image_grid_hw"].tolist() == [[2, 3], [4, 4]]
    with pytest.raises(ValueError, match="1 <image> tokens but 2 images"):
        proc(text="<image> red car", images=list(images))


@pytest.mark.parametrize("image, message", [
    (torch.zeros(3, 16, 24, dtype=torch.uint8), "dtype torch.uint8"),
    (torch.rand(1, 16, 24), r"shape \[1, 16, 24\]"),
    (torch.rand(3, 0, 24), r"shape \[3, 0, 24\]"),
    ("photo.png", "got str"),
    (torch.full((3, 8, 8), float("nan")), "NaN"),
])
def test_check_image_names_the_problem(image, message):
    from terra_nb.port_vlm import ImageGeometry, check_image

    with pytest.raises(ValueError, match=message):
        check_image(image, ImageGeometry(8, 32))


@pytest.mark.parametrize("height, width, resized", [
    (16, 24, (16, 24)),    # an allowed size stays
    (149, 211, (24, 32)),  # a photo: fit 32 px keeping the aspect ratio, then the nearest multiple of 8
    (12, 24, (16, 24)),    # halves round up
    (16, 40, (16, 32)),
    (3, 500, (8, 32)),     # at least one patch a side
    (5, 5, (8, 8)),
])
def test_any_image_size_is_resized_to_fit_the_encoder(height, width, resized):
    from terra_nb.port_vlm import ImageGeometry, check_image

    geometry = ImageGeometry(8, 32)
    assert geometry.resized(height, width) == resized
    image = torch.rand(3, height, width, generator=torch.Generator().manual_seed(0))
    out = check_image(image, geometry)
    assert tuple(out.shape) == (3, *resized) and geometry.num_tokens(height, width) == resized[0] * resized[1] // 64
    assert out.min() >= 0 and out.max() <= 1
    if (height, width) == resized:
        assert torch.equal(out, image)  # no resampling of an image that fits


def _photo(width=211, height=149, seed=0):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(height, width, 3, generator=g) * 255).to(torch.uint8).numpy()
    return Image.fromarray(pixels)


def test_every_input_form_gives_the_same_prompt_and_pixels(processor, ckpt, images):
    """What vLLM's users send: a PIL image (any size), a float numpy array or tensor [3, H, W], one
    or in a list; vLLM's processor and the HF processor give the same pixels for each."""
    from transformers import AutoProcessor

    from terra_nb.lessons.port_vlm import process

    photo = _photo()
    as_tensor = torch.from_numpy(np.asarray(photo, dtype=np.float32) / 255.0).permute(2, 0, 1)
    forms = {"PIL": photo, "PIL list": [photo], "tensor": as_tensor, "numpy": as_tensor.numpy(),
             "numpy list": [as_tensor.numpy()], "tensor tuple": (as_tensor,)}
    outs = {name: process(processor, "<image> what", form) for name, form in forms.items()}
    hf = AutoProcessor.from_pretrained(ckpt)(text="<image> what", images=photo)
    for name, out in outs.items():
        item = out["mm_kwargs"]["image"][0]
        assert out["prompt_token_ids"] == hf["input_ids"][0].tolist(), name
        assert item["image_grid_hw"].data.tolist() == [3, 4], name  # 149x211 -> 24x32 px -> 3x4 patches
        assert torch.allclose(item["pixel_values"].data, hf["pixel_values"], atol=1e-6), name
    # two images, one not in a list would be one image: a list of two gives two runs
    assert len(process(processor, "<image> a <image> b", [photo, images[0]])["mm_kwargs"]["image"]) == 2


def test_vllm_processor_places_one_run_per_image(processor, images):
    from terra_nb.lessons.port_vlm import placeholder_runs, process

    out = process(processor, "<image> red car <image> what", images)
    assert placeholder_runs(out) == [(1, 6), (9, 16)]
    ids = out["prompt_token_ids"]
    assert ids[1:7] == [4] * 6 and ids[9:25] == [4] * 16 and ids.count(4) == 22
    items = out["mm_kwargs"]["image"]
    assert [tuple(item["pixel_values"].data.shape) for item in items] == [(6, 192), (16, 192)]
    assert [item["image_grid_hw"].data.tolist() for item in items] == [[2, 3], [4, 4]]


@pytest.mark.parametrize("text, n_images, message", [
    ("<image> what", 2, "1 <image> token.* but 2 image"),
    ("<image> what <image>", 1, "2 <image> token.* but 1 image"),
    ("what", 1, "0 <image> token.* but 1 image"),
])
def test_vllm_processor_refuses_wrong_image_counts(processor, images, text, n_images, message):
    from terra_nb.lessons.port_vlm import process

    with pytest.raises(ValueError, match=message):
        process(processor, text, images[:n_images])


@pytest.mark.parametrize("image, message", [
    (torch.zeros(3, 16, 24, dtype=torch.uint8), "dtype"),
    (torch.rand(4, 12, 24), r"shape \[4, 12, 24\]"),
    ("photo.png", "image 0: expected a PIL image"),
    (torch.rand(16, 24), "precomputed image embeddings"),
])
def test_vllm_parser_refuses_bad_images(processor, image, message):
    from terra_nb.lessons.port_vlm import process
    from terra_nb.port_vlm.vllm_patch import RequestValidationError

    with pytest.raises(RequestValidationError, match=message):
        process(processor, "<image> what", [image])


def test_front_door_check_counts_unfilled_image_tokens():
    from types import SimpleNamespace

    from vllm.multimodal.inputs import PlaceholderRange

    from terra_nb.port_vlm.vllm_frontdoor import check_image_tokens

    feature = SimpleNamespace(modality="image", mm_position=PlaceholderRange(offset=1, length=6))
    check_image_tokens([1] + [4] * 6 + [9], [feature], 4)  # all filled
    with pytest.raises(ValueError, match="2 <image> token.* no image"):
        check_image_tokens([1, 4, 9, 4], None, 4)
    with pytest.raises(ValueError, match="2 <image> tokens but 1 image"):
        check_image_tokens([1] + [4] * 6 + [9, 4], [feature], 4)


def test_wrong_prompt_updates_give_placeholders_the_encoder_cannot_fill(ckpt, images):
    from terra_nb.lessons.port_vlm import offline_processor, placeholder_runs, process, worker_merge_error, wrong_update_processors

    lengths = {name: placeholder_runs(process(offline_processor(ckpt, cls), "<image> what", images[:1]))[0][1]
               for name, cls in wrong_update_processors().items()}
    assert lengths == {"not expanded": 1, "every image as the largest": 16}  # the encoder gives 6 rows
    assert "6 multimodal tokens to 16 placeholders" in worker_merge_error(128, 16, 6)
    assert worker_merge_error(128, 6, 6) == "no error: merged"


def test_plugin_registers_and_pyproject_declares_the_entry_point():
    from vllm import ModelRegistry

    from terra_nb.port_vlm.vllm_plugin import ARCHITECTURE, ENTRY_POINT, register

    register()
    register()  # idempotent
    assert ARCHITECTURE in ModelRegistry.get_supported_archs()
    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    assert eps[ENTRY_POINT] == "terra_nb.port_vlm.vllm_plugin:register"


def test_side_by_side_is_read_from_the_sources():
    from terra_nb.lessons.port_vlm import side_by_side

    rows = {r["vLLM piece"]: r for r in side_by_side()}
    assert rows["weights"]["TinyVLM (ordinary)"] == "`AutoWeightsLoader` + `WeightsMapper`"
    assert rows["`_get_mm_fields_config`"]["TinyVLM (ordinary)"] == "`batched`, `flat_from_sizes`"
    assert rows["`apply`"]["Terra"] == "its own"
    assert rows["compat mixins"]["TinyVLM (ordinary)"] == "none"
    assert all(r["why Terra deviates"] != "-" for r in rows.values() if r["Terra"] != r["TinyVLM (ordinary)"])
