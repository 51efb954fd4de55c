"""Check a vLLM source tree against what terra-nb relies on: run it when a release lands.

    python tools/vllm_source_check.py /tmp/vllm-0.34.0    # an unpacked sdist (or wheel, or checkout)
    python tools/vllm_source_check.py                     # the installed vLLM

The tree is read, not imported (`ast`: no build, no platform, any release on any machine). Three
reports, and exit status 1 when any of them finds a problem:

* **hooks**: every private piece of vLLM the port relies on (`vllm_hooks.PRIVATE_HOOKS`, those of
  the tree's release) and frame copy's (`lessons.frame_copy.hooks()`) is there, with the leading
  parameters (a class: the fields) the port expects: what `vllm_hooks.hook_problems()` checks in
  an installed vLLM;
* **imports**: every name the copyable ports (`terra_nb/port*/`) and the vendored model tests
  import from `vllm` is in the tree (the tests of the tree's release where they are vendored, else
  those of the newest vendored release: the ones to carry over);
* **vendored tests' drift**: for each of those test modules (`tests/vllm_model_tests/release.py`),
  each top-level function and class against vLLM's test file in the tree: `same`, `changed`, `adapted` (it carries `# adapted:`: compare by hand) or
  `gone`. A tree without `tests/` (a wheel, an installed package) skips this report, saying so.

PORTING.md ("A new vLLM release") says what to do with what it finds.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODEL_TESTS = REPO / "tests" / "vllm_model_tests"


class Tree:
    """A vLLM source tree: the folder that holds the `vllm` package (and, for an sdist, `tests/`)."""

    def __init__(self, root: str | Path):
        root = Path(root)
        self.root = root.parent if root.name == "vllm" and (root / "__init__.py").exists() else root
        if not (self.root / "vllm" / "__init__.py").exists():
            raise SystemExit(f"{root}: no vllm package here (pass the folder that holds vllm/)")
        self._bodies: dict[str, list | None] = {}

    def version(self) -> str | None:
        for name in ("_version.py", "version.py"):
            path = self.root / "vllm" / name
            m = path.exists() and re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", path.read_text())
            if m:
                return m.group(1)
        return None

    def module_file(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for path in (base / "__init__.py", base.with_suffix(".py")):
            if path.exists():
                return path
        return None

    def body(self, module: str) -> list | None:
        if module not in self._bodies:
            path = self.module_file(module)
            self._bodies[module] = None if path is None else _flat(ast.parse(path.read_text()).body)
        return self._bodies[module]

    def find(self, module: str, name: str, depth: int = 0):
        """(module, node) binding `name` in `module`: a def, class or assignment (node), or a
        submodule (node None); None when it is not there. Follows imports, `*` and lazy tables."""
        body = self.body(module)
        if body is None or depth > 20:
            return None
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
                return module, stmt
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and name in _targets(stmt):
                return module, stmt
            if isinstance(stmt, ast.ImportFrom):
                source = _absolute(module, stmt, self.module_file(module))
                for alias in stmt.names:
                    if alias.name == "*":
                        found = self.find(source, name, depth + 1)
                        if found:
                            return found
                    elif (alias.asname or alias.name) == name:
                        return self.find(source, alias.name, depth + 1) or self._submodule(f"{source}.{alias.name}")
        for stmt in body:  # a lazy `__getattr__` table: {"LLM": ".entrypoints.llm:LLM", ...}
            for node in ast.walk(stmt):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(f":{name}"):
                    source = node.value.rsplit(":", 1)[0]
                    if source.startswith("."):
                        package = module if self.module_file(module).name == "__init__.py" else module.rsplit(".", 1)[0]
                        source = package + source
                    found = self.find(source, name, depth + 1) if re.fullmatch(r"[\w.]+", source) else None
                    if found:
                        return found
        return self._submodule(f"{module}.{name}")

    def _submodule(self, module: str):
        return (module, None) if self.module_file(module) else None

    def resolve(self, target: str):
        """The (module, node) of "module:Qualified.name", or an error message."""
        module, qualname = target.split(":")
        first, *rest = qualname.split(".")
        found = self.find(module, first)
        for part in rest:
            if found is None:
                break
            owner_module, node = found
            found = self.member(owner_module, node, part) if isinstance(node, ast.ClassDef) else (
                self.find(owner_module, part) if node is None else None)
        return found or f"{target} is not in the tree"

    def member(self, module: str, cls: ast.ClassDef, name: str, depth: int = 0):
        """A class's own or inherited member `name` (bases followed where they are in the tree)."""
        for stmt in _flat(cls.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
                return module, stmt
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and name in _targets(stmt):
                return module, stmt
        for base in cls.bases if depth < 20 else ():
            found = self._base(module, base)
            if found and isinstance(found[1], ast.ClassDef):
                inherited = self.member(*found, name, depth + 1)
                if inherited:
                    return inherited
        return None

    def _base(self, module: str, base: ast.expr):
        if isinstance(base, ast.Subscript):  # Generic[T], BaseX[Info]
            base = base.value
        if isinstance(base, ast.Name):
            return self.find(module, base.id)
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            owner = self.find(module, base.value.id)
            return self.find(owner[0], base.attr) if owner and owner[1] is None else None
        return None

    def fields(self, module: str, cls: ast.ClassDef, depth: int = 0) -> list[str]:
        """A class's annotated fields and members, its bases' (in the tree) included."""
        names = [n for stmt in _flat(cls.body) for n in (
            _targets(stmt) if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else
            [stmt.name] if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) else [])]
        for base in cls.bases if depth < 20 else ():
            found = self._base(module, base)
            if found and isinstance(found[1], ast.ClassDef):
                names += self.fields(*found, depth + 1)
        return names


def _flat(body: list) -> list:
    """Statements of a body, with those inside top-level `if` / `try` / `with` blocks."""
    out = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, ast.If):
            out += _flat(stmt.body) + _flat(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            out += _flat(stmt.body) + [s for h in stmt.handlers for s in _flat(h.body)] + _flat(stmt.orelse)
        elif isinstance(stmt, ast.With):
            out += _flat(stmt.body)
    return out


def _targets(stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _absolute(module: str, stmt: ast.ImportFrom, path: Path | None) -> str:
    if not stmt.level:
        return stmt.module or ""
    package = module.split(".") if path is not None and path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (stmt.level - 1)]
    return ".".join(base + ([stmt.module] if stmt.module else []))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Parameter names in `inspect.signature`'s order; none for a property (as `hook_problems`)."""
    if any(isinstance(d, (ast.Name, ast.Attribute)) and (getattr(d, "id", None) or d.attr) in
           ("property", "cached_property") for d in fn.decorator_list):
        return []
    a = fn.args
    return ([p.arg for p in a.posonlyargs + a.args] + ([a.vararg.arg] if a.vararg else [])
            + [p.arg for p in a.kwonlyargs] + ([a.kwarg.arg] if a.kwarg else []))


# ---------------------------------------------------------------------------- the three reports
def hook_report(tree: Tree, release: str) -> list[str]:
    """What `vllm_hooks.hook_problems` would say in the tree's vLLM, read from its source."""
    from terra_nb.lessons.frame_copy import hooks
    from terra_nb.port.vllm_hooks import PRIVATE_HOOKS

    problems = []
    for hook in PRIVATE_HOOKS + hooks():
        if hook.release not in (None, release):
            continue
        found = tree.resolve(hook.target)
        if isinstance(found, str):
            problems.append(f"{found} (used by {hook.used_by})")
            continue
        module, node = found
        wanted = list(hook.params)
        if isinstance(node, ast.ClassDef):
            names = tree.fields(module, node)
            ok = set(wanted) <= set(names)
        else:
            names = _params(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            ok = names[: len(wanted)] == wanted or (not wanted and node is not None)
        if not ok:
            problems.append(f"{hook.target} (used by {hook.used_by}) takes {names}, the port expects {wanted}")
    return problems


def vllm_imports(paths) -> list[tuple[str, str | None, str]]:
    """(module, name or None, where) for every `vllm` import in `paths`, lazy ones included."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "vllm":
                out += [(node.module, alias.name, where) for alias in node.names]
            elif isinstance(node, ast.Import):
                out += [(alias.name, None, where) for alias in node.names if alias.name.split(".")[0] == "vllm"]
    return out


def import_report(tree: Tree, paths) -> list[str]:
    problems = []
    for module, name, where in vllm_imports(paths):
        if tree.module_file(module) is None:
            problems.append(f"{where} imports {module}: no such module in the tree")
        elif name is not None and name != "*" and tree.find(module, name) is None:
            problems.append(f"{where} imports {name} from {module}: not there in the tree")
    return problems


def vendored_table() -> dict:
    spec = importlib.util.spec_from_file_location("vendored_release", MODEL_TESTS / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VENDORED


def vendored_for(version: str | None) -> tuple[str, dict[str, str]]:
    """(release, {vendored module: vLLM's test file}): the vendored tests of the release `version`
    where they are vendored, else of the newest vendored release (those to carry over)."""
    table = vendored_table()
    releases = sorted({r for _, rs in table.values() for r in rs}, key=lambda r: tuple(map(int, r.split("."))))
    release = next((r for r in releases if version and version.startswith(r)), releases[-1])
    return release, {m: path for m, (path, rs) in table.items() if release in rs}


def _top_level(source: str) -> dict[str, str]:
    """{name: 'adapted' or its ast dump} of a test file's top-level functions and classes (adapted:
    `# adapted` or `adapted:` in it or in the comments just above it)."""
    out = {}
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            while first > 1 and lines[first - 2].lstrip().startswith("#"):  # comments just above it
                first -= 1
            text = "\n".join(lines[first - 1: node.end_lineno])
            out[node.name] = "adapted" if re.search(r"#\s*adapted|\badapted:", text) else ast.dump(node)
    return out


def drift_report(tree: Tree, vendored: dict[str, str]) -> tuple[list[str], list[str]]:
    """(lines, problems): per vendored module, its top-level names against vLLM's test file in the
    tree. A changed or gone name is a problem; an adapted one is listed."""
    lines, problems = [], []
    for module, upstream in sorted(vendored.items()):
        theirs_path = tree.root / upstream
        if not theirs_path.exists():
            lines.append(f"{module}: {upstream} is not in the tree")
            problems.append(f"{module}: {upstream} is gone")
            continue
        ours, theirs = _top_level((MODEL_TESTS / f"{module}.py").read_text()), _top_level(theirs_path.read_text())
        status = {name: "adapted" if dump == "adapted" else "gone" if name not in theirs
                  else "same" if theirs[name] == dump else "changed" for name, dump in ours.items()}
        counts = {s: sorted(n for n, v in status.items() if v == s) for s in ("same", "changed", "adapted", "gone")}
        lines.append(f"{module} ({upstream}): " + "; ".join(f"{s} {len(n)}" + (f" {n}" if s != "same" and n else "")
                                                            for s, n in counts.items()))
        problems += [f"{module}.{name} is {s} in the tree" for s in ("changed", "gone") for name in counts[s]]
    return lines, problems


def check(root: str | Path, release: str | None = None, vendored: str | None = None) -> dict:
    """Every report for the tree at `root`: {"version", "release", "vendored", "hooks", "imports",
    "drift", "drift_lines"}. `release` picks the release-specific hooks (default: from the tree's
    version), `vendored` the vendored tests' release (default: `vendored_for` the tree's version)."""
    tree = Tree(root)
    version = tree.version()
    release = release or ("0.26" if version and tuple(map(int, re.findall(r"\d+", version)[:2])) < (0, 32) else "0.32")
    vendored, tests = vendored_for(vendored or version)
    ports = sorted(p for p in (REPO / "terra_nb").glob("port*/*.py"))
    report = {"version": version, "release": release, "vendored": vendored, "hooks": hook_report(tree, release),
              "imports": import_report(tree, ports + [MODEL_TESTS / f"{m}.py" for m in tests]),
              "drift": None, "drift_lines": []}
    if (tree.root / "tests").is_dir():
        report["drift_lines"], report["drift"] = drift_report(tree, tests)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", nargs="?", help="the folder that holds vllm/ (default: the installed vLLM)")
    parser.add_argument("--release", choices=("0.26", "0.32"),
                        help="whose release-specific hooks to check (default: from the tree's version)")
    parser.add_argument("--vendored", help="compare the vendored tests of this release (e.g. 0.32.0; default: "
                                           "the tree's own where vendored, else the newest)")
    args = parser.parse_args(argv)
    root = args.tree or Path(importlib.util.find_spec("vllm").origin).parent
    report = check(root, args.release, args.vendored)
    print(f"vLLM {report['version'] or '(no version file)'} at {Tree(root).root} (release-specific hooks: "
          f"{report['release']}; vendored tests of {report['vendored']})")
    for what in ("hooks", "imports"):
        print(f"{what}: " + ("ok" if not report[what] else f"{len(report[what])} problem(s)"))
        for line in report[what]:
            print("  " + line)
    if report["drift"] is None:
        print("vendored tests' drift: not checked (no tests/ in this tree: use an unpacked sdist)")
    else:
        print("vendored tests' drift: " + ("ok" if not report["drift"] else f"{len(report['drift'])} problem(s)"))
        for line in report["drift_lines"]:
            print("  " + line)
    return 1 if report["hooks"] or report["imports"] or report["drift"] else 0


if __name__ == "__main__":
    sys.exit(main())
