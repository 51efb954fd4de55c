"""Teaching helpers for notebook 10 (TinyVLM, the ordinary port): the processor run offline, a
counter of encoder runs inside the engine, the wrong-`_get_prompt_updates` pitfall, parity, and
the side-by-side table of the two ports generated from their sources.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import torch

from .parity import GreedyParity

ENCODER_COUNT_EXTENSION = "terra_nb.lessons.port_vlm.EncoderCountExtension"
"""Pass as `make_llm(..., worker_extension_cls=ENCODER_COUNT_EXTENSION)` to count encoder runs."""


class EncoderCountExtension:
    """Mixed into vLLM's worker (`worker_extension_cls`); called with `llm.collective_rpc`.

    `tiny_vlm_images_encoded()` wraps the model's `embed_multimodal` on its first call (so call it
    once before the requests you measure) and returns how many images it has encoded since.
    """

    def tiny_vlm_images_encoded(self) -> int:
        model = self.model_runner.get_model()
        if not hasattr(model, "_images_encoded"):
            model._images_encoded = 0
            encode = model.embed_multimodal

            def counted(**kwargs):
                out = encode(**kwargs)
                model._images_encoded += len(out)
                return out

            model.embed_multimodal = counted
        return model._images_encoded


def images_encoded(llm) -> int:
    return int(sum(llm.collective_rpc("tiny_vlm_images_encoded")))


# ----------------------------------------------------------------------------- processor offline
def offline_processor(checkpoint_dir, processor_cls=None):
    """vLLM's multimodal processor for a TinyVLM checkpoint, built as the engine builds it (a
    `ModelConfig`, `MULTIMODAL_REGISTRY.create_processor`), in this process, without an engine.
    `processor_cls` swaps in a subclass of `TinyVLMMultiModalProcessor` (for the pitfall)."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from terra_nb.port_vlm.vllm_plugin import register

    register()  # in this process: the engine's processes get it from the entry point
    processor = MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(checkpoint_dir), dtype="float32", max_model_len=512))
    if processor_cls is not None:
        processor = processor_cls(processor.info, processor.dummy_inputs)
    return processor


def process(processor, text: str, images):
    """Run the processor on `text` + `images` as the front end does: tokenize, parse, `apply`.
    `images`: a list (or tuple) of images, or one image as a user may send it (not in a list)."""
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    ids = processor.info.get_tokenizer().encode(text)
    items = processor.info.parse_mm_data({"image": list(images) if isinstance(images, (list, tuple)) else images})
    return processor.apply(ProcessorInputs(prompt=ids, mm_data_items=items), TimingContext(enabled=False))


def placeholder_runs(mm_input) -> list[tuple[int, int]]:
    """(offset, length) of each image's placeholders in the processed prompt."""
    return [(r.offset, r.length) for r in mm_input["mm_placeholders"].get("image", [])]


def wrong_update_processors():
    """Two classic mistakes in `_get_prompt_updates`, as processor subclasses."""
    from vllm.multimodal.processing import PromptReplacement

    from terra_nb.port_vlm.vllm_processing import TinyVLMMultiModalProcessor

    class NotExpanded(TinyVLMMultiModalProcessor):
        """Keeps one `<image>` per image (replacement = target): Terra's choice, wrong here."""

        def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
            tok = self.info.get_hf_config().image_token_id
            return [PromptReplacement(modality="image", target=[tok], replacement=[tok])]

    class LargestImage(TinyVLMMultiModalProcessor):
        """Expands every image as if it had the largest size."""

        def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
            tok = self.info.get_hf_config().image_token_id
            return [PromptReplacement(modality="image", target=[tok], replacement=[tok] * self.info.geometry.max_tokens)]

    return {"not expanded": NotExpanded, "every image as the largest": LargestImage}


def worker_merge_error(hidden_size: int, placeholders: int, rows: int) -> str:
    """What vLLM's worker does with `rows` image embeddings for `placeholders` positions: it runs
    vLLM's own `_merge_multimodal_embeddings` (the scatter of `embed_input_ids`) here, on zeros."""
    from vllm.model_executor.models.utils import _merge_multimodal_embeddings

    embeds = torch.zeros(placeholders + 2, hidden_size)
    is_mm = torch.zeros(placeholders + 2, dtype=torch.bool)
    is_mm[1 : 1 + placeholders] = True
    try:
        _merge_multimodal_embeddings(embeds, [torch.ones(rows, hidden_size)], is_mm)
    except Exception as e:  # noqa: BLE001 - we show what vLLM raises
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return "no error: merged"


# ----------------------------------------------------------------------------- parity
@dataclass
class Parity(GreedyParity):
    """A TinyVLM prompt's greedy tokens, HF against vLLM, and how many images it holds."""
    images: int = 0

    def columns(self) -> dict:
        return {"images": self.images}


def greedy_parity(llm, hf_model, hf_processor, prompts: dict, max_tokens: int) -> list[Parity]:
    """HF's and vLLM's greedy tokens for each (text, images) of `prompts`."""
    from vllm import SamplingParams

    from terra_nb.port_vlm.hf_model import greedy_generate
    from terra_nb.port_vlm.vllm_engine import image_request

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    requests = [image_request(text, images) for text, images in prompts.values()]
    outs = llm.generate(requests, params, use_tqdm=False)
    result = []
    for (name, (text, images)), out in zip(prompts.items(), outs):
        ref = greedy_generate(hf_model, hf_processor(text=text, images=list(images) or None), max_tokens)
        result.append(Parity(name, len(out.prompt_token_ids), ref, list(out.outputs[0].token_ids), images=len(images)))
    return result


# ----------------------------------------------------------------------------- side by side
def _src(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (TypeError, OSError):
        return ""


def _defines(cls, name: str) -> bool:
    return any(name in vars(k) for k in cls.__mro__ if k.__module__.startswith("terra_nb"))


def _apply(cls) -> str:
    if not _defines(cls, "apply"):
        return "vLLM's default"
    src = _src(cls.apply)
    return "vLLM's default (`super().apply`), after a check" if "super().apply(inputs" in src.split("return")[-1] else "its own"


def _fields(cls) -> str:
    kinds = sorted(set(re.findall(r"MultiModalFieldConfig\.(\w+)", _src(cls._get_mm_fields_config))))
    return ", ".join(f"`{k}`" for k in kinds)


def _updates(cls) -> str:
    src = _src(cls._get_prompt_updates)
    same = re.search(r"replacement=(\w+)", src)
    tgt = re.search(r"target=(\w+)", src)
    if same and tgt and same.group(1) == tgt.group(1):
        return "replacement == target (slots already in the prompt)"
    return "one token -> a run per item (`replacement` computed per item)"


def _weights(model_cls) -> str:
    src = _src(model_cls.load_weights)
    if "AutoWeightsLoader" in src:
        return "`AutoWeightsLoader` + `WeightsMapper`" if "mapper" in src else "`AutoWeightsLoader`"
    return "hand-written `load_weights`"


def _mixins(cls) -> str:
    names = [k.__name__ for k in cls.__mro__[1:] if k.__module__.endswith("vllm_release")]
    return ", ".join(f"`{n}`" for n in names) or "none"


def _tokenizer(engine_fn) -> str:
    return "none (`skip_tokenizer_init=True`)" if "skip_tokenizer_init=True" in _src(engine_fn) else "its own, in the checkpoint"


def _backbone(model_cls) -> str:
    src = _src(model_cls)
    if "init_vllm_registered_model" in src:
        return "vLLM's `LlamaForCausalLM`, as it is"
    return "a `@support_torch_compile` subclass of `LlamaModel`"


def _dummy_text(builder) -> str:
    src = _src(builder.get_dummy_text)
    return "empty (prompt ids from `get_dummy_prompt_ids`)" if 'return ""' in src else "`<image>` per image, tokenized by vLLM"


WHY = {
    "tokenizer": "Terra's prompts are image-tokenizer codes (576 per frame), not text: a tokenizer would only add "
                 "detokenisation",
    "HF processor call": "Terra's action vectors need no preprocessing; vLLM 0.26 would load an HF `AutoProcessor` "
                         "anyway, so a compatibility class (`vllm_release`) skips that call there",
    "`apply`": "a rollout re-sends its whole prompt every frame, so Terra's `apply` computes where each frame's 6 "
               "action positions lie from the frame layout (work per frame) instead of vLLM's search of the prompt "
               "for every item",
    "`_get_prompt_updates`": "Terra's prompt already holds 6 placeholder ids after every frame (its action slots); "
                             "nothing is expanded, vLLM only has to find them",
    "`_get_mm_fields_config`": "every action item has the same shape [6, 3]",
    "dummy text": "no tokenizer: the dummy prompt is token ids",
    "compat mixins": "without a tokenizer or an HF processor, vLLM 0.26 and 0.32 need different methods overridden; "
                     "`TokenizerFreeProcessorMixin` (`terra_nb/port/vllm_release.py`) holds both",
    "decoder": "Terra adds a learned position embedding to the hidden states, which must happen inside the compiled "
               "module (CUDA-graph replay)",
    "weights": "written before the port used `AutoWeightsLoader`; names its mismatches",
    "unfilled placeholders": "Terra's slots are ordinary ids too; both need their own check",
}


def side_by_side() -> list[dict[str, str]]:
    """Each vLLM piece: Terra's choice and TinyVLM's, read from the two packages' sources."""
    from terra_nb.port import vllm_frontdoor as terra_door
    from terra_nb.port import vllm_model as terra_model
    from terra_nb.port import vllm_processing as terra_proc
    from terra_nb.port import vllm_rollout as terra_engine
    from terra_nb.port_vlm import vllm_engine as vlm_engine
    from terra_nb.port_vlm import vllm_frontdoor as vlm_door
    from terra_nb.port_vlm import vllm_model as vlm_model
    from terra_nb.port_vlm import vllm_processing as vlm_proc

    T, V = terra_proc.LlamaActionMultiModalProcessor, vlm_proc.TinyVLMMultiModalProcessor
    TM, VM = terra_model.LlamaActionForCausalLM, vlm_model.TinyVLMForConditionalGeneration
    rows = [
        ("tokenizer", _tokenizer(terra_engine.make_llm), _tokenizer(vlm_engine.llm_kwargs)),
        ("HF processor call", "none (the action vectors pass through unchanged)" if "get_processor_data" in _src(terra_proc)
         else "called", "vLLM's default: `TinyVLMProcessor` on the images"),
        ("`apply`", _apply(T), _apply(V)),
        ("`_get_prompt_updates`", _updates(T), _updates(V)),
        ("`_get_mm_fields_config`", _fields(T), _fields(V)),
        ("dummy text", _dummy_text(terra_proc.LlamaActionDummyInputsBuilder), _dummy_text(vlm_proc.TinyVLMDummyInputsBuilder)),
        ("compat mixins", _mixins(T), _mixins(V)),
        ("decoder", _backbone(TM), _backbone(VM)),
        ("weights", _weights(TM), _weights(VM)),
        ("unfilled placeholders", "front door (`" + terra_door.install.__module__.rsplit(".", 1)[-1] + "`)",
         "front door (`" + vlm_door.install.__module__.rsplit(".", 1)[-1] + "`)"),
    ]
    return [{"vLLM piece": p, "Terra": t, "TinyVLM (ordinary)": v, "why Terra deviates": WHY[p] if t != v else "-"}
            for p, t, v in rows]
