"""The private vLLM hooks of Terra's port (`terra_nb.port.vllm_hooks`): each where the port expects
it, on the installed release and on vLLM 0.26's source, and the list complete (read from the
port's source and classes, no engine)."""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from terra_nb.port import vllm_hooks as H
from terra_nb.port import vllm_release

PORT = Path(H.__file__).parent


def test_every_private_hook_of_the_port_is_where_the_port_expects_it():
    assert H.hook_problems() == []
    # the check can fail: the other release's code path names hooks this release does not have
    other = "0.26" if H.VLLM_VERSION >= (0, 32) else "0.32"
    assert any(h.release == other for h in H.PRIVATE_HOOKS) and H.hook_problems(other)


def test_a_moved_hook_is_reported():
    moved = H.Hook("vllm.model_executor.models.utils:AutoWeightsLoader.load_weights", "test", ("self", "tensors"))
    gone = H.Hook("vllm.model_executor.models.utils:_no_such_helper", "test")
    problems = H.hook_problems(hooks=(moved, gone))
    assert len(problems) == 2 and "the port expects ['self', 'tensors']" in problems[0] and "is gone" in problems[1]


_HOOK_PROBE = r"""
import json
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = CpuPlatform()  # the source tree has no build to detect a platform from
import vllm
from terra_nb.port.vllm_hooks import hook_problems
print("PROBE" + json.dumps({"version": vllm.__version__, "problems": hook_problems()}))
"""


def test_vllm_026_has_every_private_hook_too(tiny_ckpt, run_probe, vllm026_src):
    out = run_probe(_HOOK_PROBE, tiny_ckpt, vllm026_src)
    assert out["version"].startswith("0.26") and out["problems"] == []


# ---------------------------------------------------------------------------- the list is complete
def _hooked_names() -> set[str]:
    """The last name of every hook's target ('...:BaseMultiModalProcessor.apply' -> 'apply')."""
    return {h.target.rsplit(":", 1)[1].rsplit(".", 1)[-1] for h in H.PRIVATE_HOOKS}


def foreign_private_names(folder: Path = PORT) -> dict[str, list[str]]:
    """`_name` -> where: every private name the port's source imports from vLLM, or reads as an
    attribute, that no module of the port defines (so it is someone else's: vLLM's)."""
    defined, used = set(), {}
    trees = {p: ast.parse(p.read_text()) for p in sorted(folder.glob("*.py"))}
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(n.name)
            elif isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store):
                defined.add(n.id if isinstance(n, ast.Name) else n.attr)
    for path, tree in trees.items():
        for n in ast.walk(tree):
            names = []
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                names = [n.attr]
            elif isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("vllm"):
                names = [a.name for a in n.names]
            for name in names:
                if name.startswith("_") and not name.startswith("__") and name not in defined:
                    used.setdefault(name, []).append(f"{path.name}:{n.lineno}")
    return used


def private_overrides(folder: Path = PORT) -> dict[str, str]:
    """'module.Class._method' -> the vLLM class it overrides, for every private method a class of
    the port (or a mixin of the port in its bases) defines over a vLLM base class's."""
    out = {}
    for path in sorted(folder.glob("*.py")):
        module = importlib.import_module(f"{H.__package__}.{path.stem}")
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            for own in (k for k in cls.__mro__ if k.__module__.startswith(H.__package__)):
                for name, value in vars(own).items():
                    fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                    if not (inspect.isfunction(fn) and name.startswith("_") and not name.startswith("__")):
                        continue
                    base = next((b for b in cls.__mro__ if b.__module__.startswith("vllm") and name in vars(b)), None)
                    if base is not None:
                        out[f"{own.__module__.rsplit('.', 1)[1]}.{own.__name__}.{name}"] = \
                            f"{base.__module__}.{base.__qualname__}"
    return out


def test_every_private_vllm_name_the_port_uses_is_a_hook():
    missing = {name: where for name, where in foreign_private_names().items() if name not in _hooked_names()}
    assert not missing, f"add these to vllm_hooks.PRIVATE_HOOKS: {missing}"


def test_every_private_vllm_method_the_port_overrides_is_a_hook():
    found = private_overrides()
    assert "vllm_processing.LlamaActionDataParser._get_subparsers" in found  # the scan sees overrides ...
    if "_apply_prompt_updates" in vars(vllm_release.TokenizerFreeProcessorMixin):  # ... a mixin's too (0.26)
        assert "vllm_release.TokenizerFreeProcessorMixin._apply_prompt_updates" in found
    missing = {k: v for k, v in found.items() if k.rsplit(".", 1)[1] not in _hooked_names()}
    assert not missing, f"add these to vllm_hooks.PRIVATE_HOOKS: {missing}"


def test_the_completeness_scan_can_fail(tmp_path):
    (tmp_path / "a.py").write_text("from vllm.model_executor.models.utils import _merge_multimodal_embeddings\n"
                                   "def f(model):\n    return model._mark_tower_model\n")
    found = foreign_private_names(tmp_path)
    assert set(found) == {"_merge_multimodal_embeddings", "_mark_tower_model"}
    assert "_merge_multimodal_embeddings" not in _hooked_names()  # no longer used by the port
