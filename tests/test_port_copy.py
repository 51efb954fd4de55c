"""The ports copy: `terra_nb/port/` and `terra_nb/port_vlm/`, moved into another project under other
names, work alone, and a vLLM without a private method they wrap still starts every engine.

Both folders are copied to temporary packages (`terra_port_copy`, `tiny_vlm_copy`), beside a
`terra_nb` that refuses to be imported, first on `PYTHONPATH`. Terra's copy is declared as a vLLM
general plugin the way an installed project would (a `*.dist-info/entry_points.txt` on the path);
TinyVLM's is not installed at all, and registers the other way PORTING.md gives ("Registering
without installing"): its `register()` called in the process, the engine core kept in that process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`). One fresh interpreter, with `VLLM_PLUGINS` naming only Terra's
copy, then:

* loads the plugins as an engine does (`load_general_plugins`), on a vLLM whose
  `AsyncLLM._add_streaming_input_request`, a private method Terra's front door wraps, is deleted
  first, as on a release that renamed it. vLLM calls plugins without a guard: a plugin that raised
  there would stop every engine of the environment, whatever its model;
* Terra: builds the HF model through `AutoModelForCausalLM` and a vLLM engine from the copy alone,
  rolls out one greedy frame on each (the two must agree token by token), and sends the engine's
  front end a streaming-session chunk, which Terra must refuse, naming the missing method;
* TinyVLM, the other model, found by no entry point: `register()` called by hand, then the same with
  `AutoModelForImageTextToText` and one prompt with an image;
* TinyAV (`terra_nb/port_av/`, copied as `tiny_av_copy`, not installed): `register()` by hand and
  its vLLM model module imported, no engine (tests/test_port_av_engine.py serves the original);
* reports the module of every class HF built and vLLM registered: each must be the copy's. (A copy
  that named `terra_nb.port_vlm` would serve the original's classes wherever `terra_nb` is installed;
  here, where it cannot be imported, its engine would not start.)

The three tests read the one run (about a minute: two engines on two cores).
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import terra_nb.port
import terra_nb.port_av
import terra_nb.port_vlm

pytestmark = pytest.mark.engine

TERRA, VLM, AV = "terra_port_copy", "tiny_vlm_copy", "tiny_av_copy"
TERRA_ARCHS = ("LlamaActionForCausalLM", "LlamaActionV2ForCausalLM")
VLM_ARCH = "TinyVLMForConditionalGeneration"
AV_ARCH = "TinyAVForConditionalGeneration"
SHARED = {"vllm_patch.py": ("port", "port_vlm", "port_av"),  # shipped, the same file, in these ports
          "vllm_chat.py": ("port_vlm", "port_av")}
MAX_TOKENS = 8

_SCRIPT = rf"""
import json, logging, sys, traceback
import torch

warnings = []


class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())


logging.getLogger().addHandler(Keep(logging.WARNING))

# A vLLM release without the method the door wraps to follow streaming sessions.
from vllm.v1.engine.async_llm import AsyncLLM
del AsyncLLM._add_streaming_input_request
from vllm.plugins import load_general_plugins
load_general_plugins()  # Terra's copy's entry point, as every engine process does

from importlib.metadata import entry_points
import os
from vllm import ModelRegistry, SamplingParams
out = {{"entry_points": sorted(ep.value for ep in entry_points(group="vllm.general_plugins")
                              if ep.value.split(".")[0] in {(TERRA, VLM)!r}),
       "registered_by_plugins": getattr(ModelRegistry.models.get({VLM_ARCH!r}), "module_name", None)}}

# TinyVLM's copy is not installed: register it in this process, and keep the engine core here
from {VLM}.vllm_plugin import entry_point_installed, register
out["vlm_entry_point_installed"] = entry_point_installed()
out["multiprocessing"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
register()

out.update({{"plugin_warnings": list(warnings),
       # lazily registered: "module:Class", whether or not that module can be imported here
       "registered": {{a: getattr(ModelRegistry.models.get(a), "module_name", None)
                      for a in {TERRA_ARCHS + (VLM_ARCH,)!r}}}}})


def part(name):
    # each part reports its own failure, so that one test failing says why and leaves the others
    def run(fn):
        try:
            out[name] = fn()
        except Exception:
            out[name] = {{"error": traceback.format_exc()[-3000:]}}
    return run


@part("terra")
def terra():
    # one greedy frame on HF and on vLLM, then a session chunk the door cannot follow
    from transformers import AutoModelForCausalLM
    from {TERRA}.rollout import SamplingConfig, hf_rollout
    from {TERRA}.vllm_compat import shutdown_llm
    from {TERRA}.vllm_rollout import make_llm, vllm_rollout

    hf = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    lay = hf.layout
    ctx = torch.randint(0, lay.num_codes, (2, lay.image_tokens), generator=g)
    acts = torch.randn(2, lay.action_tokens, lay.action_dim, generator=g)
    greedy = SamplingConfig(temperature=0.0)
    res = {{"hf": hf_rollout(hf, ctx, acts, 1, greedy, progress=False).tolist(), "hf_class": type(hf).__module__}}
    llm = make_llm(sys.argv[1], max_frames=3, enforce_eager=True)
    try:
        res["vllm"] = vllm_rollout(llm, ctx, acts, 1, greedy, progress=False).tolist()
        try:
            llm.llm_engine.input_processor.process_inputs(
                "chunk", {{"prompt_token_ids": ctx[0].tolist()}}, SamplingParams(max_tokens=lay.image_tokens),
                supported_tasks=("generate",), resumable=True)
            res["session_refusal"] = None
        except Exception as e:
            res["session_refusal"] = f"{{type(e).__name__}}: {{e}}"
    finally:  # a test's engine gets 1 s to exit on the CPU (vLLM's default waits longer)
        shutdown_llm(llm, timeout=None if torch.cuda.is_available() else 1.0)
    return res


@part("vlm")
def vlm():
    # one prompt with one image, greedy, on HF and on vLLM
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from {VLM}.checkpoints import write_random_checkpoint
    from {VLM}.hf_model import greedy_generate
    from {VLM}.vllm_engine import image_request, make_llm

    ckpt = write_random_checkpoint(sys.argv[2])
    hf = AutoModelForImageTextToText.from_pretrained(ckpt).eval()
    processor = AutoProcessor.from_pretrained(ckpt)
    image = torch.rand(3, 16, 24, generator=torch.Generator().manual_seed(1))
    text = "<image> describe the picture"
    res = {{"hf": greedy_generate(hf, processor(text=text, images=[image]), {MAX_TOKENS}),
           "hf_class": type(hf).__module__, "processor_class": type(processor).__module__}}
    llm = make_llm(ckpt, enforce_eager=True)
    try:
        params = SamplingParams(temperature=0.0, max_tokens={MAX_TOKENS}, ignore_eos=True)
        res["vllm"] = list(llm.generate([image_request(text, [image])], params, use_tqdm=False)[0].outputs[0].token_ids)
    finally:  # 1 s to exit on the CPU, as Terra's part above (this copy has no vllm_compat.shutdown_llm)
        llm.llm_engine.engine_core.shutdown(timeout=None if torch.cuda.is_available() else 1.0)
    return res


@part("av")
def av():
    # TinyAV's copy: registered in the process, its vLLM model module imported (no engine: the
    # engine test serves the original), every class from the copy
    import importlib
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING
    from {AV}.vllm_plugin import register as register_av
    register_av()
    model = importlib.import_module("{AV}.vllm_model").{AV_ARCH}
    cfg = AutoConfig.for_model("tiny_av")
    return {{"registered": getattr(ModelRegistry.models.get({AV_ARCH!r}), "module_name", None),
            "vllm_class": model.__module__,
            "hf_class": AutoModelForImageTextToText._model_mapping[type(cfg)].__module__,
            "processor_class": PROCESSOR_MAPPING[type(cfg)].__module__}}


out["terra_nb_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "terra_nb")
print("PROBE" + json.dumps(out))
"""


def _copy_package(source: Path, root: Path, name: str, installed: bool = True) -> None:
    """`root/name/` (the package's .py files) and, if `installed`, its plugin entry point, as an
    installed project has."""
    shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    if not installed:
        return
    dist = root / f"{name}-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{name} = {name}.vllm_plugin:register\n")


def _make_copies(root: Path) -> None:
    """Both ports under other names, and a `terra_nb` that refuses to import (so any leftover
    `import terra_nb` fails loudly)."""
    _copy_package(Path(terra_nb.port.__file__).parent, root, TERRA)
    _copy_package(Path(terra_nb.port_vlm.__file__).parent, root, VLM, installed=False)
    _copy_package(Path(terra_nb.port_av.__file__).parent, root, AV, installed=False)
    (root / "terra_nb").mkdir()
    (root / "terra_nb" / "__init__.py").write_text('raise ImportError("a copied port imported terra_nb")\n')


@pytest.fixture(scope="module")
def copies(tiny_ckpt, tmp_path_factory):
    """What the one run of `_SCRIPT` over the copies reports (its output, on failure)."""
    root = tmp_path_factory.mktemp("copies")
    _make_copies(root)
    # the copies first; whatever PYTHONPATH already holds (the GPU runner's vLLM lives there) after them
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    # the engine core in this process: TinyVLM's copy, registered here only, needs it (PORTING.md)
    env = {**os.environ, "PYTHONPATH": path, "VLLM_PLUGINS": TERRA, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tiny_ckpt), str(root / "tiny_vlm_ckpt")], env=env,
                          cwd=root, capture_output=True, text=True, timeout=500)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("PROBE"):])


def _part(copies: dict, name: str) -> dict:
    """One part of the run; its traceback when it failed."""
    res = copies[name]
    assert "error" not in res, f"the {name} part failed in the copy:\n{res.get('error')}"
    return res


def _first_difference(a: list[int], b: list[int]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"HF and vLLM differ first at token {i}: HF {a[i:i + 4]}, vLLM {b[i:i + 4]}"


def test_a_copy_of_the_port_under_another_name_serves_alone_with_hf_parity(copies):
    assert copies["terra_nb_loaded"] == []
    assert {a: copies["registered"][a] for a in TERRA_ARCHS} == dict.fromkeys(TERRA_ARCHS, f"{TERRA}.vllm_model")
    terra = _part(copies, "terra")
    assert terra["hf_class"] == f"{TERRA}.hf_model"
    hf, vl = terra["hf"][0], terra["vllm"][0]
    assert len(hf) == len(vl) == 64  # one frame of the tiny preset's 64 codes
    assert hf == vl, _first_difference(hf, vl)


def test_a_copy_of_port_vlm_under_another_name_serves_alone_with_hf_parity(copies):
    assert copies["terra_nb_loaded"] == []
    assert copies["registered"][VLM_ARCH] == f"{VLM}.vllm_model"
    vlm = _part(copies, "vlm")
    assert (vlm["hf_class"], vlm["processor_class"]) == (f"{VLM}.hf_model", f"{VLM}.hf_processing")
    assert len(vlm["hf"]) == len(vlm["vllm"]) == MAX_TOKENS
    assert vlm["hf"] == vlm["vllm"], _first_difference(vlm["hf"], vlm["vllm"])


def test_a_copy_of_port_av_under_another_name_registers_and_imports_its_own_classes(copies):
    assert copies["terra_nb_loaded"] == []
    av = _part(copies, "av")
    assert av == {"registered": f"{AV}.vllm_model", "vllm_class": f"{AV}.vllm_model",
                  "hf_class": f"{AV}.hf_model", "processor_class": f"{AV}.hf_processing"}


def test_a_copy_not_installed_registers_in_process_and_serves_with_the_engine_core_in_process(copies):
    """PORTING.md, "Registering without installing": no entry point names TinyVLM's copy, so vLLM's
    plugin loading does not register it; `register()` in the process does, and with the engine core
    in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) that is enough to serve."""
    assert copies["entry_points"] == [f"{TERRA}.vllm_plugin:register"]
    assert copies["vlm_entry_point_installed"] is False
    assert copies["registered_by_plugins"] is None  # load_general_plugins alone: unknown to vLLM
    assert copies["multiprocessing"] == "0"
    assert copies["registered"][VLM_ARCH] == f"{VLM}.vllm_model"  # after register()
    assert len(_part(copies, "vlm")["vllm"]) == MAX_TOKENS


def test_an_engine_core_of_its_own_registers_only_what_the_entry_points_register():
    """PORTING.md's reason for the env var, read in the installed vLLM: the engine core process runs
    the general plugins (entry points) in its constructor, and on the CPU backend it is always a
    spawned, fresh interpreter, so a `register()` called in the parent never reaches it."""

    # read, not imported (importing the engine core takes seconds)
    assert "load_general_plugins()" in _vllm_source("vllm.v1.engine.core", "EngineCore", "__init__")
    assert 'os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"' in _vllm_source(
        "vllm.platforms.cpu", "CpuPlatform", "check_and_update_config")


def _vllm_source(module: str, cls: str, method: str) -> str:
    """The source of `module.cls.method` in the installed vLLM."""
    import ast
    import importlib.util

    text = Path(importlib.util.find_spec(module).origin).read_text()
    [node] = [n for c in ast.parse(text).body if isinstance(c, ast.ClassDef) and c.name == cls
              for n in c.body if isinstance(n, ast.FunctionDef) and n.name == method]
    return ast.get_source_segment(text, node)


def test_the_engine_helper_takes_its_modality_limits_from_the_model():
    """`port_vlm/vllm_engine.py` copies unchanged: `limit_mm_per_prompt` is the processing file's
    `LIMIT_MM_PER_PROMPT`, over the modalities the processing info declares."""
    from terra_nb.port_vlm import vllm_processing
    from terra_nb.port_vlm.vllm_engine import llm_kwargs

    limits = llm_kwargs("checkpoint")["limit_mm_per_prompt"]
    assert limits == vllm_processing.LIMIT_MM_PER_PROMPT == {"image": 2}
    assert limits is not vllm_processing.LIMIT_MM_PER_PROMPT
    supported = vllm_processing.TinyVLMProcessingInfo.get_supported_mm_limits(None)  # uses no state
    assert set(limits) == set(supported)
    assert '"image"' not in inspect.getsource(llm_kwargs)  # no modality named in the helper


def test_without_a_method_the_door_wraps_every_engine_starts_and_terra_refuses_what_it_cannot_check(copies):
    # both models registered (the engines above served), Terra's plugin saying once what it skipped
    [warning] = [w for w in copies["plugin_warnings"] if "_add_streaming_input_request" in w]
    assert "AsyncLLM._add_streaming_input_request is gone" in warning
    assert "skipped Terra's streaming-session checks" in warning
    assert _part(copies, "vlm")["vllm"] and _part(copies, "terra")["vllm"]
    refusal = _part(copies, "terra")["session_refusal"]
    assert refusal is not None and refusal.startswith("RequestValidationError: Terra refuses streaming-input sessions")
    assert "AsyncLLM._add_streaming_input_request is gone" in refusal and "one request per frame" in refusal


def test_the_files_the_ports_share_are_the_same():
    """Each port carries its own copy of the shared helpers, so that it copies alone; they must not drift."""
    root = Path(terra_nb.port.__file__).parent.parent
    for name, ports in SHARED.items():
        first, *others = ports
        for other in others:
            assert (root / first / name).read_text() == (root / other / name).read_text(), f"{first}/{name} and {other}/{name} differ"


def test_the_ports_hold_no_workbook_setting():
    """A copied port gets the product only: the workbook's GPU runner settings (its environment
    variables, `terra_nb.workbook.gpu_settings`) are engine arguments the workbook passes, and no
    engine stop is shortened for test speed (`shutdown_llm` keeps vLLM's default)."""
    from terra_nb.workbook import gpu_settings

    names = (gpu_settings.GPU_SHARE_ENV, gpu_settings.KV_CACHE_ENV, gpu_settings.EAGER_ENV, "TERRA_NB_")
    import terra_nb.port_gpt2

    for package in (terra_nb.port, terra_nb.port_vlm, terra_nb.port_av, terra_nb.port_gpt2):
        folder = Path(package.__file__).parent
        assert not (folder / "gpu_settings.py").exists(), f"{folder.name}/gpu_settings.py"
        for path in sorted(folder.glob("*.py")):
            text = path.read_text()
            assert not [n for n in names if n in text], f"{folder.name}/{path.name} reads the workbook's environment"
            assert "SHUTDOWN_TIMEOUT" not in text, f"{folder.name}/{path.name} shortens the engine's stop"
    # Terra's port: no random-weight writer, no speculation lesson, no test-only readers
    port = Path(terra_nb.port.__file__).parent
    assert not {"checkpoints.py", "frame_copy.py"} & {p.name for p in port.glob("*.py")}
    for path in sorted(port.glob("*.py")):
        text = path.read_text()
        assert not [n for n in ("frame_copy", "prefix_cache_counters", "speculative_k") if n in text], path.name
