"""Generated sections of Markdown files: the text between `<!-- NAME:start -->` and `<!-- NAME:end -->`,
rewritten from what a producer function returns, or checked against it.

A `Section` names its file, its marker and its producer ("package.module:function", or
"tools/script.py:function" loaded from its file), called without arguments. The table of the
README's and docs/' sections, and the command that refreshes them, is `terra_nb.bench.docs`:

    python -m terra_nb.bench.docs            # rewrite every generated section from the result files
    python -m terra_nb.bench.docs --check    # exit 1 and name each section that is out of date
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from terra_nb.workbook.paths import REPO


@dataclass(frozen=True)
class Section:
    file: str        # relative to the repository
    name: str        # the marker's name: <!-- name:start --> ... <!-- name:end -->
    producer: str    # "package.module:function" or "tools/script.py:function", called without arguments

    @property
    def start(self) -> str:
        return f"<!-- {self.name}:start -->"

    @property
    def end(self) -> str:
        return f"<!-- {self.name}:end -->"


def producer(section: Section) -> Callable[[], str]:
    """The function named by `section.producer`; a script under tools/ is loaded from its file."""
    where, func = section.producer.split(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, REPO / where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, func)


def replace_section(text: str, start: str, end: str, body: str) -> str:
    """`text` with what lies between the markers `start` and `end` replaced by `body`."""
    for marker in (start, end):
        if text.count(marker) != 1:
            raise ValueError(f"expected the marker {marker} exactly once, found it {text.count(marker)} times")
    a, b = text.index(start) + len(start), text.index(end)
    if b < a:
        raise ValueError(f"{end} comes before {start}")
    return text[:a] + "\n" + body.strip() + "\n" + text[b:]


def section_text(text: str, section: Section) -> str:
    """What a file's text holds between the section's markers."""
    return text[text.index(section.start) + len(section.start):text.index(section.end)].strip()


def refresh(sections, root: Path = REPO, check: bool = False) -> list[str]:
    """Render every section and write those that differ (or, with `check`, only name them).
    Returns "file: name" for each section that was (or would be) rewritten."""
    changed = []
    for s in sections:
        path = Path(root) / s.file
        text = path.read_text()
        new = replace_section(text, s.start, s.end, producer(s)())
        if new != text:
            changed.append(f"{s.file}: {s.name}")
            if not check:
                path.write_text(new)
    return changed


def main(sections, argv=None) -> int:
    """The refresh command over `sections`: rewrite them, or with `--check` name the stale ones (exit 1)."""
    ap = argparse.ArgumentParser(description="rewrite the generated sections of the README and docs/")
    ap.add_argument("--check", action="store_true", help="only name the sections that are out of date (exit 1 if any)")
    args = ap.parse_args(argv)
    changed = refresh(sections, check=args.check)
    for c in changed:
        print(("stale: " if args.check else "rewritten: ") + c)
    if not changed:
        print(f"all {len(sections)} generated sections are up to date")
    return 1 if (args.check and changed) else 0
