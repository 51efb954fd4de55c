"""tools/gpu_runner.sh's plan and tools/gpu_report.py's report, from a real `reproduce` summary
(a throwaway notebook run here) plus the step records the runner writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from terra_nb.workbook import reproduce
from terra_nb.workbook.results import record_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import gpu_report  # noqa: E402
from nb import write_notebook  # noqa: E402

NOTEBOOKS = sorted(p.name[:2] for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TF = {"dtype": "bfloat16", "scored_codes": 3456, "top1_agreement": "3450/3456", "top1_disagreements": 6,
      "of_which_near_ties": 6, "max_abs_logprob_gap": 0.0625, "tolerance": 0.25,
      "positions_with_hf_top2_within_tolerance": 900, "passed": True}


def test_plan_covers_every_notebook_twice_and_fits_in_steps():
    r = subprocess.run(["bash", str(REPO / "tools" / "gpu_runner.sh"), "plan"], capture_output=True, text=True)
    steps = r.stdout.split("\n")
    assert r.returncode == 0 and steps[0] == "setup" and steps[-2] == "report"
    assert [s.split()[1] for s in steps if s.startswith("reproduce ")] == NOTEBOOKS
    assert [s.split()[1] for s in steps if s.startswith("nbval ")] == NOTEBOOKS
    assert "test fast" in steps and "test engine1" in steps


def test_lanes_run_every_step_of_the_plan_once(tmp_path):
    runner = ["bash", str(REPO / "tools" / "gpu_runner.sh")]
    plan = subprocess.run(runner + ["plan"], capture_output=True, text=True).stdout.split("\n")
    listed = subprocess.run(runner + ["lanes"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr   # a lane whose step list ends non-zero never starts
    lanes = listed.stdout.strip().split("\n")
    steps = [s for line in lanes for s in line.split(": ", 1)[1].split(";")]
    assert sorted(steps) == sorted(s for s in plan if s.split(" ")[0] in ("reproduce", "nbval", "test"))
    by_lane = dict(line.split(": ", 1) for line in lanes)
    assert all(s.startswith("reproduce ") for lane in ("papermill", "papermill2", "papermill3")
               for s in by_lane[lane].split(";"))
    assert "reproduce 07" in by_lane["papermill"] and "nbval 08" in by_lane["engines"]
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    env = {**os.environ, "GPU_SITE": str(tmp_path / "site"), "GPU_RUNNER_STATE": str(tmp_path / "state")}
    bad = subprocess.run(runner + ["lane", "nope"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown lane nope" in bad.stderr


def test_report_from_a_real_reproduce_summary(tmp_path):
    """A real `reproduce` run of a notebook 06 (its summary: status, parameters), then 06's result
    written where `record_result` writes it in that run's folder. Here, not in the notebook: a kernel
    that imports terra_nb imports torch (~9 s of CPU), and this notebook needs nothing of it."""
    nbs = tmp_path / "nbs"
    write_notebook(nbs / "06_p.ipynb", [
        ("md", "# p\nwhat you will learn"),
        ("params", 'device = "cpu"\npreset = "tiny"\nout_dir = None'),
        ("code", "print(device, preset)"),
        ("md", "summary, pitfalls"),
    ])
    state = tmp_path / "state"
    assert reproduce.main(["--notebooks", str(nbs), "--out", str(state / "reproduce" / "06"), "--device", "cpu"]) == 0
    record_result("06_parity", {"equal": 2184, "tokens": 3456, "frames": 6,
                                "first_mismatch": {"rollout": 0, "frame": 0, "index": 9}, "teacher_forced": TF},
                  state / "reproduce" / "06")
    env = reproduce.__dict__["json"].loads(json.dumps({"device": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "cpu_count": 16,
                                                       "python": "3.12.3", "torch": "2.11.0+cu130",
                                                       "transformers": "5.17.0", "vllm": "0.26.0", "date": "d"}))
    (state / "environment.json").write_text(json.dumps(env))
    (state / "steps").mkdir()
    (state / "steps" / "nbval_06.json").write_text(json.dumps({"step": "nbval_06", "rc": 0, "seconds": 95.5}))
    (state / "steps" / "test_fast.json").write_text(json.dumps({"step": "test_fast", "rc": 1, "seconds": 61.0}))
    (state / "steps" / "test_fast.log").write_text("....F\n===== 1 failed, 40 passed, 2 skipped in 60.1s =====\n")
    assert gpu_report.main([str(state), "--out", str(tmp_path / "out"), "--note", "nbval 06 re-run at abc123",
                            "--run", "H100 run 7", "--commit", "abc1234"]) == 0
    text = (tmp_path / "out" / "gpu_report_h100.md").read_text()
    assert "- commit: abc1234 (every result below is this commit's)" in text and "- run: H100 run 7" in text
    data = json.loads((tmp_path / "out" / "gpu_report_h100.json").read_text())
    assert data["commit"] == "abc1234" and data["run"] == "H100 run 7" and data["notebooks"][0]["nbval"] == "passed"
    para = gpu_report.docs_section(tmp_path / "out")
    assert "(NVIDIA H100 80GB HBM3, vLLM 0.26.0, commit abc1234, d)" in para and "1 of 1 passed" in para
    assert "top-1 agreement 3450/3456" in para and "H100 run 7" not in para
    assert "device: NVIDIA H100 80GB HBM3" in text and "vllm 0.26.0" in text and "torch 2.11.0+cu130" in text
    assert "| 06_p.ipynb | ok | tiny |" in text and "| passed | 95.5 |" in text
    assert "2184 of 3456 codes equal" in text and "top-1 agreement 3450/3456" in text and "0.0625" in text
    assert "| fast | 1 | 61 | 1 failed, 40 passed, 2 skipped in 60.1s |" in text
    assert "## Notes\n\n- nbval 06 re-run at abc123" in text


def test_gpu_slug():
    assert gpu_report.gpu_slug("NVIDIA H200") == "h200"
    assert gpu_report.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu_report.gpu_slug("Some GPU") == "some_gpu"


def test_committed_reports_each_name_one_commit():
    """docs/benchmarks.md's GPU paragraphs come from results/gpu_report_*.json (tests/test_docs.py),
    each report one commit and one run."""
    for path in sorted((REPO / "results").glob("gpu_report_*.json")):
        data = json.loads(path.read_text())
        assert data["commit"] not in ("", "unknown") and data["run"] != "run not named", path.name
        md = path.with_suffix(".md").read_text()
        assert f"- commit: {data['commit']}" in md and f"- run: {data['run']}" in md, path.name


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout


def test_tree_state_is_the_commit_whatever_a_copy_did_to_modes_and_index(tmp_path):
    """What reaches the GPU machine is a copy: file modes, the git index and ignored files beside the
    tree (an egg-info from `pip install -e .`) may differ; only the files' content counts."""
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "run.sh").write_text("echo run\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "a.txt").write_text("a\n")
    (repo / ".gitignore").write_text("*.egg-info/\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "c")
    head, head_tree = _git(repo, "rev-parse", "HEAD").strip(), _git(repo, "rev-parse", "HEAD^{tree}").strip()
    (repo / "run.sh").chmod(0o644)
    (repo / ".git" / "index").unlink()
    (repo / "x.egg-info").mkdir()
    (repo / "x.egg-info" / "PKG-INFO").write_text("x\n")
    assert _git(repo, "status", "--porcelain", "--untracked-files=no")  # git status calls this copy dirty
    tree = gpu_report.tree_state(repo)
    assert tree == {"commit": head, "short": head[:7], "clean": True, "changed": [], "tree": head_tree}
    assert gpu_report.commit_label(tree) == head[:7]
    assert gpu_report.tree_check(tree, head, repo) == f"files run: tree {head_tree[:12]}, the same as commit {head}'s"
    (repo / "new.py").write_text("print('not committed')\n")  # a file beside the commit's: other files ran
    tree = gpu_report.tree_state(repo)
    assert tree["clean"] and tree["tree"] != head_tree and "**DIFFERENT from**" in gpu_report.tree_check(tree, head, repo)
    (repo / "a.txt").write_text("edited\n")
    (repo / "run.sh").unlink()
    tree = gpu_report.tree_state(repo)
    assert not tree["clean"] and tree["changed"] == ["a.txt", "run.sh"]
    assert gpu_report.commit_label(tree) == f"{head[:7]}-dirty (2 tracked files differ from it: a.txt, run.sh)"


def test_report_header_checks_the_files_and_says_when_steps_are_of_several_checkouts(tmp_path):
    state = tmp_path / "state"
    (state / "steps").mkdir(parents=True)
    (state / "tree.json").write_text(json.dumps({"commit": "abc1234" + "0" * 33, "short": "abc1234", "clean": True,
                                                 "changed": [], "tree": "f" * 40}))
    for step, commit in (("nbval_01", "abc1234"), ("test_fast", "abc1234")):
        (state / "steps" / f"{step}.json").write_text(json.dumps({"step": step, "rc": 0, "seconds": 1.0,
                                                                  "commit": commit}))
    _, text = gpu_report.build_report(state)
    assert "- commit: abc1234 (every result below is this commit's)\n" in text and "more than one" not in text
    assert "- files run: tree ffffffffffff; the device's git: abc1234\n" in text
    _, text = gpu_report.build_report(state, commit="0" * 40)
    assert f"- commit: {'0' * 40} (every" in text and "is not in this repository: not checked" in text
    (state / "steps" / "test_engine1.json").write_text(json.dumps({"step": "test_engine1", "rc": 0, "seconds": 1.0,
                                                                   "commit": "def5678"}))
    _, text = gpu_report.build_report(state)
    assert "**steps from more than one checkout** (not one run): abc1234: nbval_01, test_fast; def5678: test_engine1" in text


def test_setup_records_the_tree_for_the_report(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_report.py"), str(tmp_path / "st"), "--record-tree"],
                       capture_output=True, text=True)
    tree = json.loads((tmp_path / "st" / "tree.json").read_text())
    assert r.returncode == 0 and tree["commit"] == _git(REPO, "rev-parse", "HEAD").strip()
    assert gpu_report.tree_check(tree, None) in r.stdout


def test_test_groups_cover_every_test_module_once_and_keep_shared_engines_together():
    """`test fast` + `test engine1..4` run every module of tests/ exactly once (but test_browser), and the modules that
    share a session engine (tests/conftest.py: SHARED_ENGINES) sit in one group, so each builds it once."""
    import ast
    import re

    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    shared = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", None) == "SHARED_ENGINES" for t in node.targets))
    r = subprocess.run(["bash", str(REPO / "tools" / "gpu_runner.sh"), "groups"], capture_output=True, text=True)
    groups = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    modules = {p.name for p in (REPO / "tests").glob("test_*.py")}
    ignored = set(re.findall(r"--ignore tests/(\S+\.py)", groups["fast"]))
    # vLLM's own model tests: out of the fast group, every 0.26 module of theirs in `models`
    assert "--ignore tests/vllm_model_tests" in groups.pop("fast")
    assert set(re.findall(r"tests/vllm_model_tests/(\S+\.py)", groups.pop("models"))) == {
        p.name for p in (REPO / "tests" / "vllm_model_tests").glob("test_*_v026.py")}
    in_groups = [m for args in groups.values() for m in re.findall(r"(?<!_)tests/(test_\w+\.py)", args)]
    # test_browser runs on CPU CI only (no Chromium on the GPU machine); every other module once
    assert r.returncode == 0 and sorted(in_groups) == sorted(ignored - {"test_browser.py"}) and ignored < modules
    named = {g: set(re.findall(r"tests/(test_\w+\.py)", args)) for g, args in groups.items()}
    for name in shared:
        users = {p.name for p in (REPO / "tests").glob("test_*.py") if re.search(rf"\b{name}\b", p.read_text())}
        holding = [g for g, mods in named.items() if users & mods]
        assert users and len(holding) == 1 and users <= named[holding[0]], (name, users, holding)


def test_lanes_run_in_a_snapshot_that_later_copies_of_the_checkout_do_not_touch(tmp_path):
    """`start` runs its lanes in `snapshot`'s copy: the same files (the tree the report names), its own
    .git, none of the ignored folders (the venv, the bundle), and a runner that works from there."""
    snap = tmp_path / "tree"
    r = subprocess.run(["bash", str(REPO / "tools" / "gpu_runner.sh"), "snapshot", str(snap)],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "GPU_RUNNER_STATE": str(tmp_path / "st")})
    assert r.returncode == 0, r.stderr
    here, there = gpu_report.tree_state(REPO), gpu_report.tree_state(snap)
    assert there["tree"] == here["tree"] and there["commit"] == here["commit"]
    assert (snap / "notebooks" / "08_toy_world.ipynb").is_file() and not (snap / ".venv").exists()
    lanes = subprocess.run(["bash", str(snap / "tools" / "gpu_runner.sh"), "lanes"], capture_output=True, text=True,
                           env={**os.environ, "GPU_RUNNER_STATE": str(tmp_path / "st")})
    assert lanes.returncode == 0 and "nbval 08" in lanes.stdout
    start = (REPO / "tools" / "gpu_runner.sh").read_text().split("\n  start)", 1)[1].split(";;", 1)[0]
    assert 'snapshot "$snap"' in start and 'bash "$snap/tools/gpu_runner.sh" lane' in start
