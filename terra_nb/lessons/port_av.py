"""Teaching helpers for notebook 13 (TinyAV: two modalities, a processor that needs the text):
vLLM's processor run offline, the HF processor's calls recorded, vLLM's own error for an item
without its placeholder, a log of `embed_multimodal`'s calls inside the engine, parity on both
paths, the release facts read from vLLM's source, and the in-process hang reproduced in a subprocess.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .parity import GreedyParity

EMBED_LOG_EXTENSION = "terra_nb.lessons.port_av.EmbedCallLog"
"""Pass as `make_llm(..., worker_extension_cls=EMBED_LOG_EXTENSION)` to log `embed_multimodal`'s calls."""


class EmbedCallLog:
    """Mixed into vLLM's worker (`worker_extension_cls`), called with `llm.collective_rpc`.

    `tiny_av_embed_calls(reset)` wraps the model's `embed_multimodal` on its first call and returns
    one `[field names, items]` per call since the last reset, in the order vLLM made them."""

    def tiny_av_embed_calls(self, reset: bool = False) -> list:
        model = self.model_runner.get_model()
        if not hasattr(model, "_embed_calls"):
            model._embed_calls = []
            embed = model.embed_multimodal

            def logged(**kwargs):
                out = embed(**kwargs)
                model._embed_calls.append([sorted(kwargs), len(out)])
                return out

            model.embed_multimodal = logged
        calls = list(model._embed_calls)
        if reset:
            model._embed_calls.clear()
        return calls


def embed_calls(llm, reset: bool = True) -> list[tuple[str, int]]:
    """(modality, items) of each `embed_multimodal` call since the last reset."""
    [calls] = llm.collective_rpc("tiny_av_embed_calls", args=(reset,))
    return [("image" if "pixel_values" in keys else "audio", n) for keys, n in calls]


# ----------------------------------------------------------------------------- processor offline
def offline_processor(checkpoint_dir, **model_config_kwargs):
    """vLLM's multimodal processor for a TinyAV checkpoint, built as the engine builds it."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from terra_nb.port_av.vllm_plugin import register

    register()
    kwargs = dict(model=str(checkpoint_dir), dtype="float32", max_model_len=512, enable_mm_embeds=True)
    kwargs.update(model_config_kwargs)
    return MULTIMODAL_REGISTRY.create_processor(ModelConfig(**kwargs))


def mm_data(images=None, audio=None) -> dict:
    return {k: v for k, v in (("image", images), ("audio", audio)) if v is not None}


def process(processor, text: str, images=None, audio=None, vllm_apply: bool = False):
    """Tokenize, parse and `apply` as the front end does. `vllm_apply`: vLLM's own `apply`, without
    the port's placeholder-count check (to see what vLLM does by itself)."""
    from vllm.multimodal.processing import BaseMultiModalProcessor, ProcessorInputs, TimingContext

    ids = processor.info.get_tokenizer().encode(text)
    items = processor.info.parse_mm_data(mm_data(images, audio))
    apply = BaseMultiModalProcessor.apply.__get__(processor) if vllm_apply else processor.apply
    return apply(ProcessorInputs(prompt=ids, mm_data_items=items), TimingContext(enabled=False))


def error_of(fn, *args, **kwargs) -> str | None:
    """`"Type: first line"` of what `fn(...)` raises; None when it returns."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - we show what is raised
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def summary(mm_input) -> dict:
    """Prompt ids, placeholder runs (offset, length) per modality, and each item's field shapes."""
    return {
        "ids": list(mm_input["prompt_token_ids"]),
        "runs": {m: [(r.offset, r.length) for r in rs] for m, rs in sorted(mm_input["mm_placeholders"].items())},
        "fields": {m: [{k: list(v.data.shape) for k, v in sorted(item.items())} for item in items]
                   for m, items in sorted(mm_input["mm_kwargs"].items())},
    }


def hf_processor_calls(processor, fn, *args, **kwargs) -> list[dict]:
    """Run `fn(*args, **kwargs)` and record each call of the HF processor class: whether it got
    text (and which), and which data keywords."""
    from terra_nb.port_av.hf_processing import TinyAVProcessor

    calls: list[dict] = []
    original = TinyAVProcessor.__call__

    def recording(self, text=None, images=None, audio=None, **kw):
        calls.append({"text": text, "images": None if images is None else len(images),
                      "audio": None if audio is None else len(audio)})
        return original(self, text=text, images=images, audio=audio, **kw)

    TinyAVProcessor.__call__ = recording
    try:
        fn(*args, **kwargs)
    finally:
        TinyAVProcessor.__call__ = original
    return calls


def processed_items(hf_processor, images=None, audio=None) -> dict:
    """The HF processor's outputs for the items, per modality: the form passed straight to the model."""
    out = {}
    if images:
        out["images"] = hf_processor.process_images(images)
    if audio:
        out["audio"] = hf_processor.process_audio(audio)
    return out


# ----------------------------------------------------------------------------- parity
@dataclass
class Parity(GreedyParity):
    """A TinyAV prompt's greedy tokens, HF against vLLM, with its items sent raw or already processed."""
    path: str = ""

    def columns(self) -> dict:
        return {"items as": self.path}


def greedy_parity(llm, hf_model, hf_processor, prompts: dict, max_tokens: int) -> list[Parity]:
    """HF's greedy tokens against vLLM's for each `name: (text, images, audio)`, every prompt sent
    twice: items raw (vLLM calls the HF processor) and already processed (passed to the model)."""
    from vllm import SamplingParams

    from terra_nb.port_av.hf_model import greedy_generate
    from terra_nb.port_av.vllm_engine import request

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    reqs, rows = [], []
    for name, (text, images, audio) in prompts.items():
        done = processed_items(hf_processor, images, audio)
        reqs.append((name, "raw", request(text, images, audio)))
        reqs.append((name, "processed", request(text, done.get("images"), done.get("audio"))))
    outs = llm.generate([r for _, _, r in reqs], params, use_tqdm=False)
    refs = {name: greedy_generate(hf_model, hf_processor(text=text, images=images or None, audio=audio or None),
                                  max_tokens) for name, (text, images, audio) in prompts.items()}
    for (name, path, _), out in zip(reqs, outs):
        rows.append(Parity(name, len(out.prompt_token_ids), refs[name], list(out.outputs[0].token_ids), path=path))
    return rows


# ----------------------------------------------------------------------------- vLLM's source
def _source(module: str, qualname: str, root: str | None = None) -> str:
    """The source of `module:qualname` (a function or `Class.method`) in the installed vLLM, or in
    the vLLM tree under `root` (an unpacked wheel), read without importing it."""
    if root is None:
        path = Path(importlib.util.find_spec(module).origin)
    else:
        path = Path(root, *module.split(".")).with_suffix(".py")
    text = path.read_text()
    nodes = ast.parse(text).body
    for part in qualname.split("."):
        [node] = [n for n in nodes if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part]
        nodes = node.body
    return ast.get_source_segment(text, node)


def release_facts(root: str | None = None) -> dict[str, bool]:
    """What vLLM's source says about the points TinyAV depends on (installed, or the tree at `root`)."""
    runner = _source("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._batch_mm_inputs_from_scheduler", root)
    mm_only = _source("vllm.multimodal.processing.processor", "BaseMultiModalProcessor", root)
    budget = "vllm.multimodal.encoder_budget" if root is None and importlib.util.find_spec(
        "vllm.multimodal.encoder_budget") else None
    return {
        # embed_multimodal: items sorted by modality before grouping (0.32), or prompt order (0.26)
        "encoder_items_sorted_by_modality": "sorted(range(len(mm_kwargs)), key=lambda i: mm_kwargs[i][0])" in runner,
        # the HF processor gets text from `_get_hf_mm_text` (0.32) ...
        "hf_text_from_get_hf_mm_text": "def _get_hf_mm_text" in mm_only,
        # ... or, on 0.26, the dummy text once a subclass overrides `_call_hf_processor`
        "hf_text_when_call_hf_processor_overridden": "type(self)._call_hf_processor != BaseMultiModalProcessor._call_hf_processor" in mm_only,
        "unplaced_item_asserts": '"Failed to apply prompt replacement for "' in mm_only,
        "placeholder_count_is_runtime_error": "raise RuntimeError(\n                    f\"Expected there to be {item_count} prompt placeholders" in mm_only,
        "budget_module_read": budget is not None,
    }


# ----------------------------------------------------------------------------- the in-process hang
_HANG_SCRIPT = r"""
import json, os, sys, threading, time, torch
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = sys.argv[3]
out = {"multiprocessing": sys.argv[3]}
def report():
    print("HANG" + json.dumps(out), flush=True)
import vllm
from vllm import SamplingParams
from terra_nb.port_av.vllm_plugin import register
from terra_nb.port_av.vllm_engine import make_llm, request
register()
out["vllm"] = vllm.__version__
llm = make_llm(sys.argv[1], worker_extension_cls="terra_nb.lessons.port_av.RaisingEncoder")
llm.collective_rpc("tiny_av_raise_on_long_clips", args=(int(sys.argv[4]),))
greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
good = request("<audio> what", audio=[torch.ones(32)])
out["good_before"] = list(llm.generate([good], greedy, use_tqdm=False)[0].outputs[0].token_ids)
out["good_again"] = list(llm.generate([good], greedy, use_tqdm=False)[0].outputs[0].token_ids)  # the control
t0 = time.perf_counter()
try:
    llm.generate([request("<audio> what", audio=[torch.ones(16 * (int(sys.argv[4]) + 1))])], greedy, use_tqdm=False)
    out["bad"] = "served"
except Exception as e:
    out["bad"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
out["bad_s"] = round(time.perf_counter() - t0, 1)
out["unfinished_after_bad"] = llm.llm_engine.get_num_unfinished_requests()
report()
t0 = time.perf_counter()
done = threading.Event()
def good_after():
    try:
        out["good_after"] = list(llm.generate([good], greedy, use_tqdm=False)[0].outputs[0].token_ids)
    except Exception as e:
        out["good_after"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    done.set()
threading.Thread(target=good_after, daemon=True).start()
out["returned"] = done.wait(float(sys.argv[2]))
out["good_after_s"] = round(time.perf_counter() - t0, 1)
try:  # what the engine core's scheduler still holds (read while the other thread is stuck)
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    out["scheduler_requests"] = {rid: r.status.name for rid, r in list(sched.requests.items())}
    out["unfinished"] = llm.llm_engine.get_num_unfinished_requests()
except Exception as e:
    out["scheduler_requests"] = f"{type(e).__name__}: {e}"
report()
os._exit(0)
"""


class RaisingEncoder:
    """A worker extension that makes the model's `embed_multimodal` raise a `ValueError` for a clip
    longer than a limit: a value check placed inside the model (where it must not be)."""

    def tiny_av_raise_on_long_clips(self, most_frames: int) -> None:
        model = self.model_runner.get_model()
        embed = model.embed_multimodal

        def checked(**kwargs):
            n = kwargs.get("audio_num_frames")
            if n is not None and int(torch.as_tensor(torch.cat(list(n)) if isinstance(n, (list, tuple)) else n).max()) > most_frames:
                raise ValueError(f"the audio encoder takes at most {most_frames} frames")
            return embed(**kwargs)

        model.embed_multimodal = checked


def reproduce_hang(checkpoint_dir, wait_s: float = 20.0, multiprocessing: str = "0", most_frames: int = 8,
                   kill_after_s: float = 240.0) -> dict:
    """In a fresh interpreter (killed after `kill_after_s`): an engine whose model raises a
    `ValueError` for a clip longer than `most_frames` frames; one good request, the bad one, then
    the good one again, waited for `wait_s` seconds. Returns what happened: the bad request's
    error, and whether the good one after it `returned` (False: the engine hung)."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    cmd = [sys.executable, "-c", _HANG_SCRIPT, str(checkpoint_dir), str(wait_s), multiprocessing, str(most_frames)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=kill_after_s)
        stdout, stderr, killed = proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        killed = True
    lines = [ln for ln in stdout.splitlines() if ln.startswith("HANG")]
    out = json.loads(lines[-1][4:]) if lines else {"error": stderr[-2000:]}
    out.update(killed=killed, wall_s=round(time.perf_counter() - t0, 1), wait_s=wait_s)
    return out
