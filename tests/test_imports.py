"""The import graph of `terra_nb/`, built from the source (ast, no module imported): no import
circle anywhere in `terra_nb/`, the layers of the benchmark and of the port each import one way, and
the copyable ports import only their own package.

- Every `import` and `from ... import` counts, at module level or inside a function (a lazy import
  still ties the two modules together). An edge goes to the module named: `from terra_nb.bench
  import results` to `terra_nb.bench.results`, `from terra_nb.bench.results import merge` to
  `terra_nb.bench.results`, `import terra_nb` to the package's `__init__` (the parent packages
  Python also imports on the way are not counted, or every package would be a circle with its
  modules).
- The private-name rule covers `terra_nb/bench/` only: a module there imports no `_name` from
  another `terra_nb` module (make the helper public instead). Other packages are not held to it
  yet: some of them import private names across modules (`private_imports(modules(), None)` lists
  them).
- The benchmark has no `import *`.
- Terra's port: the rules (`port.layout`) import none of the helpers beside them and nothing of
  vLLM; each `vllm_patch.Patch` is named by a test; the modules that check Terra inputs raise no
  bare `ValueError` (every refusal is a `TerraInputError` of `layout.RULES`).
- Every copyable port package (`terra_nb/port*/`) imports its own modules relatively and nothing
  of `terra_nb` (a copy under another name must not reach the original).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "terra_nb"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """{dotted name: file} of every module under terra_nb/."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(known: dict[str, Path]) -> list[tuple[str, str, str | None, int]]:
    """(importer, imported module, name imported from it or None, line) for every import of a
    terra_nb module, anywhere in a module's code."""
    out = []
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    target = next((".".join(parts[:k]) for k in range(len(parts), 0, -1)
                                   if ".".join(parts[:k]) in known), None)
                    if target:
                        out.append((module, target, None, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:
                        out.append((module, sub, None, node.lineno))
                    elif base in known:
                        out.append((module, base, alias.name, node.lineno))
    return out


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in known}
    for a, b, _, _ in imports(known):
        if a != b:
            g[a].add(b)
    return g


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `g` as [a, b, ..., a], or None (depth-first search, colours)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


def private_imports(known: dict[str, Path], under: str | None) -> list[str]:
    """'importer:line imports _name from module' for each private name a module imports from another
    terra_nb module; `under`: only importers in that package."""
    return [f"{a}:{line} imports {name} from {b}" for a, b, name, line in imports(known)
            if name and name.startswith("_") and not name.startswith("__") and a != b
            and (under is None or a == under or a.startswith(under + "."))]


def test_the_graph_is_built_from_every_module_and_counts_lazy_imports():
    known = modules()
    assert {"terra_nb", "terra_nb.bench", "terra_nb.bench.cli", "terra_nb.port.layout"} <= known.keys()
    g = graph(known)
    assert "terra_nb.bench.pairs" in g["terra_nb.bench.cli"]
    assert "terra_nb.workbook.paths" in g["terra_nb.bench.records"]   # imported inside a function


def test_find_cycle_names_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_terra_nb():
    cycle = find_cycle(graph(modules()))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_benchmark_layers_import_one_way():
    """The pure and measuring layers never reach the result files or the runner above them."""
    g = graph(modules())
    b = "terra_nb.bench."
    assert not {b + "records", b + "pairs", b + "headline", b + "cli"} & g[b + "stats"]
    assert not {b + "pairs", b + "headline", b + "plots"} & g[b + "records"]
    assert not {b + "records", b + "pairs", b + "headline"} & g[b + "engines"]
    assert b + "headline" not in g[b + "pairs"]


def test_the_benchmark_imports_no_private_name_across_modules():
    found = private_imports(modules(), "terra_nb.bench")
    assert not found, "make these public instead: " + "; ".join(found)


def test_the_benchmark_has_no_star_import():
    stars = [f"{m}:{node.lineno}" for m, p in modules().items() if m.startswith("terra_nb.bench")
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom)
             and any(a.name == "*" for a in node.names)]
    assert not stars, stars



def test_the_benchmark_imports_flow_down_its_package_docstring():
    """`terra_nb/bench/__init__.py` lists the modules a bullet each (a bullet may name several); a
    listed module imports no module listed in a later bullet. Modules not listed are not checked."""
    import re

    known = modules()
    g = graph(known)
    doc = ast.get_docstring(ast.parse(known["terra_nb.bench"].read_text()))
    bullets = [b for b in re.split(r"\n- ", doc)[1:]]
    place = {}
    for i, bullet in enumerate(bullets):
        for name in re.findall(r"`(\w+)`", bullet):
            if f"terra_nb.bench.{name}" in known:
                place.setdefault(f"terra_nb.bench.{name}", i)
    assert {"terra_nb.bench.records", "terra_nb.bench.pairs", "terra_nb.bench.headline",
            "terra_nb.bench.sides", "terra_nb.bench.guide"} <= place.keys()
    up = [f"{a} imports {b}" for a in place for b in g[a] if b in place and place[b] > place[a]]
    assert not up, "imports up the list in bench/__init__.py: " + "; ".join(up)


# ---------------------------------------------------------------------------- the port's layers
PORT = "terra_nb.port."
HELPERS = ("interleave", "rounds", "engine_limits")


def test_the_rules_import_none_of_the_helpers_beside_them():
    """`layout` (the rules table and its checks) is the bottom layer: the helpers that are not rules
    (`interleave`, `rounds`, `engine_limits`) and the vLLM modules import it, never the reverse."""
    g = graph(modules())
    assert not g[PORT + "layout"] & {PORT + h for h in HELPERS}
    assert all(PORT + "layout" in g[PORT + h] for h in HELPERS)  # each refuses through the rules
    src = modules()[PORT + "layout"].read_text()
    assert "import vllm" not in src and "from vllm" not in src


def test_each_runtime_patch_is_named_by_a_test():
    """Every `Patch` `vllm_patch` declares (a vLLM method wrapped at runtime) has a test that names it."""
    tree = ast.parse(modules()[PORT + "vllm_patch"].read_text())
    patches = [t.id for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and getattr(n.value.func, "id", None) == "Patch" for t in n.targets]
    assert {"PROCESS_INPUTS", "STREAMING_SESSIONS"} <= set(patches)
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    assert not [p for p in patches if p not in tests], "a patch without a test"


INPUT_CHECKERS = ("layout", "interleave", "rounds", "engine_limits", "vllm_processing", "vllm_frontdoor",
                  "vllm_release", "vllm_model", "session_rollout")


def bare_value_errors(path: Path) -> list[int]:
    """Lines where `path` raises a plain `ValueError`/`TypeError` (not a rule's `TerraInputError`)."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Raise) and n.exc is not None
            and isinstance(n.exc, ast.Call) and getattr(n.exc.func, "id", None) in ("ValueError", "TypeError")]


def test_every_terra_refusal_goes_through_the_rules_table(tmp_path):
    known = modules()
    found = {m: bare_value_errors(known[PORT + m]) for m in INPUT_CHECKERS}
    assert not {m: lines for m, lines in found.items() if lines}, "raise TerraInputError(rule, ...) instead"
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x):\n    if x:\n        raise ValueError('no')\n")
    assert bare_value_errors(bad) == [3]  # the scan can fail


def test_the_copyable_ports_import_only_their_own_package():
    """`terra_nb/port*/`: every import of a terra_nb module is relative (`from .layout import ...`),
    so a copy of the folder under another name serves its own classes (tests/test_port_copy.py runs
    the copies)."""
    known = modules()
    ports = sorted({m.split(".")[1] for m in known if m.startswith("terra_nb.port")})
    assert {"port", "port_vlm"} <= set(ports)
    absolute = []
    for m, path in known.items():
        if m.split(".")[1:2] and m.split(".")[1] in ports:
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                absolute += [f"{m}:{node.lineno} {n}" for n in names if n.split(".")[0] == "terra_nb"]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level > 1:
                    absolute.append(f"{m}:{node.lineno} reaches above its package (level {node.level})")
    assert not absolute, absolute
