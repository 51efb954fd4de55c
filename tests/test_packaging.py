"""environment.yml installs what pyproject.toml declares (the conda route == the `make` route)."""
import re
import tomllib

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


def test_gpu_extra_covers_the_gpu_machine_release():
    gpu = _pyproject()["optional-dependencies"]["gpu"]
    assert gpu == ["vllm>=0.26,<1"]


def test_vllm_plugin_entry_point_declared():
    eps = _pyproject()["entry-points"]["vllm.general_plugins"]
    assert eps == {"terra_nb": "terra_nb.port.vllm_plugin:register"}


def test_the_readme_links_only_files_that_exist():
    import re

    readme = REPO / "README.md"
    links = re.findall(r"\]\(((?!https?://|#)[^)\s]+)\)", readme.read_text())
    assert "results/gpu_report_h200.md" in links
    missing = [link for link in links if not (REPO / link.split("#")[0]).exists()]
    assert not missing, f"README links to missing files: {missing}"
