"""The workbook as a reader uses it: `make lab`, JupyterLab in a real (headless) Chromium.

`make lab` is started on a free local port with a copy of the notebooks (so that JupyterLab's
autosave never writes into `notebooks/`), and Playwright drives the system's Chromium (Debian's
`chromium` package; Playwright's own browser download is never used). Two checks:

- notebook 01 renders (headings, code, stored outputs); a screenshot goes to
  `outputs/browser/01_hf_model.png`;
- notebook 08's steering widget runs in the browser, and dragging the curvature slider makes
  the widget roll the vLLM engine out again: the GIF and the reported errors change.

08 runs only the cells the widget needs (`WIDGET_NEEDS`: parameters, imports, the engine), each
selected and run from the Run menu as a reader would, then the widget cell: the scores, tables and
figures between them cost CPU time and are not what this test checks. It runs with fewer
frames per rollout than the default (`BROWSER_PARAMS`, injected as papermill would: 4 instead of
12), and the widget drives the notebook's real vLLM engine.

Skipped, saying why, where no Chromium is installed, except in CI (`CI=true`), where a missing
browser is an error: `.ci/run` installs it (and fails when it cannot), and `make test`'s setup
installs Playwright, a declared dependency imported plainly.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from terra_nb.workbook.paths import NOTEBOOKS, OUTPUTS, REPO

from playwright import sync_api  # declared (the dev extra): a broken install must fail, not skip

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
NO_CHROMIUM = "no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
if CHROMIUM is None and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    raise RuntimeError(f"CI=true but {NO_CHROMIUM}: the browser test must run in CI")
pytestmark = [pytest.mark.browser, pytest.mark.engine, pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)]

BROWSER_PARAMS = {"n_frames": 4}
"""08's parameters here: 4 generated frames per rollout (default 12)."""
WIDGET_NEEDS = (
    'device = "auto"',                       # the parameters cell
    "# Parameters",                          # BROWSER_PARAMS, injected after it
    "import os",                             # imports, N_CONTEXT, the resolved device
    "engine_fn = engine_rollout_fn(llm)",    # the vLLM engine the widget drives
)
"""Text that marks, in exactly one code cell each, the cells the widget needs, in notebook order."""
WIDGET_CELL = "steering_widget(engine_fn"
SCREENSHOTS = OUTPUTS / "browser"
RUN_TIMEOUT_S = 300       # 08's widget and the cells it needs (engine start included: under a minute)
ROLLOUT_TIMEOUT_S = 120   # one widget rollout (a few seconds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_notebooks(root: Path) -> None:
    """01 as committed; 08 with BROWSER_PARAMS injected after its parameters cell (papermill's way)."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    shutil.copy(NOTEBOOKS / "01_hf_model.ipynb", root)
    nb = load_notebook_node(str(NOTEBOOKS / "08_toy_world.ipynb"))
    nbformat.write(parameterize_notebook(nb, BROWSER_PARAMS), root / "08_toy_world.ipynb")


def _quiet_settings(settings: Path) -> None:
    """No news/update pop-up over the notebook (and no requests to the internet for them)."""
    target = settings / "@jupyterlab" / "apputils-extension"
    target.mkdir(parents=True)
    (target / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')


def _wait_for_url(proc: subprocess.Popen, log: Path, port: int, timeout: float = 90) -> str:
    """The URL (with its token) that `make lab` prints, as a reader would copy it."""
    pattern = re.compile(rf"http://(?:localhost|127\.0\.0\.1):{port}/lab\?token=\w+")
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = pattern.search(log.read_text(errors="replace"))
        if found:
            return found.group(0)
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    pytest.fail(f"`make lab` printed no URL for port {port}:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    """`make lab` (the README's command; its setup step is taken as done: this is the venv that
    runs pytest) serving a copy of the notebooks on a free port. Yields (base URL, token)."""
    tmp = tmp_path_factory.mktemp("lab")
    root, log = tmp / "notebooks", tmp / "lab.log"
    root.mkdir()
    _copy_notebooks(root)
    _quiet_settings(tmp / "settings")
    port = _free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    lab_args = f"--no-browser --port={port} --ServerApp.port_retries=0"
    command = ["make", "--no-print-directory", "-o", "setup", "lab", f"PY={sys.executable}", f"LAB_DIR={root}",
               f"LAB_ARGS={lab_args}"]
    with log.open("wb") as out:   # its own process group: _stop ends the server and its kernels together
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = _wait_for_url(proc, log, port)
        yield url.split("/lab?")[0], url.split("token=")[1]
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """Stop make, the server and the kernels it started (one process group)."""
    for sig, wait in ((15, 30), (9, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        # Chromium refuses to run as root without --no-sandbox.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield b
        b.close()


def _open_notebook(browser, lab_url, name: str):
    base, token = lab_url
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    # A workspace of its own per notebook: JupyterLab restores the default workspace's open tabs, and
    # a notebook a previous page opened would sit (hidden) beside this one, matching its selectors first.
    page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-RenderedMarkdown h1", timeout=30_000)
    assert page.locator(".jp-NotebookPanel").count() == 1, "another notebook is open beside this one"
    # Wait for the kernel: the status bar shows "Idle" once it has started.
    page.wait_for_selector(".jp-StatusBar-TextItem:has-text('Idle')", timeout=60_000)
    return page


def test_notebook_01_renders(browser, lab_url):
    page = _open_notebook(browser, lab_url, "01_hf_model.ipynb")
    try:
        assert page.locator(".jp-RenderedMarkdown h1").first.inner_text().startswith("01")
        assert page.locator(".jp-InputArea-editor .cm-content").count() > 5          # code cells
        assert page.locator(".jp-OutputArea-output").count() > 5                     # stored outputs
        figure = page.locator(".jp-OutputArea-output img").first                     # a stored figure
        figure.scroll_into_view_if_needed()
        assert figure.evaluate("img => img.complete && img.naturalWidth > 100")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = page.screenshot(path=str(SCREENSHOTS / "01_hf_model.png"))
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 50_000
    finally:
        page.close()


def _errors(page) -> list[str]:
    """Tracebacks shown in the notebook (JupyterLab renders errors as stderr outputs)."""
    stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    return [text for text in stderr if re.search(r"Traceback|\w+Error\b", text)]


def _code_cell(page, marker: str, timeout_s: float = 120):
    """The one code cell whose source holds `marker` (a second match would be run by mistake).
    Waits for it: JupyterLab renders the cells below the first screen later, in idle time (its
    deferred windowing), and on a loaded machine that can take a while."""
    cell = page.locator(".jp-CodeCell", has=page.locator(f".cm-content:has-text('{marker}')"))
    deadline = time.time() + timeout_s
    while cell.count() == 0 and time.time() < deadline:
        time.sleep(0.5)
    assert cell.count() == 1, f"{cell.count()} code cells hold {marker!r} after {timeout_s:.0f} s: pick text of one cell"
    return cell


def _run_cell(page, cell) -> None:
    """Select the cell (a click on its prompt: command mode) and 'Run Selected Cell' from the Run menu.
    The kernel queues the runs: the next cell can be issued before this one finishes."""
    cell.locator(".jp-InputPrompt").click()
    sync_api.expect(cell).to_have_class(re.compile(r"\bjp-mod-active\b"))   # the menu runs the active cell
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run Selected Cell$")).click()


def _prompt(cell) -> str:
    """The cell's run count, "[3]:" (text_content: innerText is empty for a cell scrolled off screen)."""
    return cell.locator(".jp-InputPrompt").text_content().strip()


def _run_to_widget(page) -> None:
    """Run the cells the widget needs, then the widget's, in the fresh kernel; wait for its sliders."""
    cells = [_code_cell(page, marker) for marker in (*WIDGET_NEEDS, WIDGET_CELL)]
    for cell in cells:
        _run_cell(page, cell)
    widget = cells[-1]
    deadline = time.time() + RUN_TIMEOUT_S
    while time.time() < deadline:
        assert not _errors(page), f"notebook 08 failed in the browser:\n{_errors(page)}"
        # The run count as well as the handle: the notebook's stored output holds a widget view too.
        if _prompt(widget) == f"[{len(cells)}]:" and widget.locator(".noUi-handle").count():
            break
        time.sleep(1)
    else:
        pytest.fail(f"the steering widget did not appear within {RUN_TIMEOUT_S} s")
    # Each intended cell ran once, in order, and nothing else ran in between (the counts of a fresh kernel).
    assert [_prompt(cell) for cell in cells] == [f"[{i}]:" for i in range(1, len(cells) + 1)]


def _drag_to_right_end(page, slider) -> None:
    """Drag the slider's handle with the mouse to the right end of its track."""
    slider.scroll_into_view_if_needed()
    handle, track = slider.locator(".noUi-handle").bounding_box(), slider.locator(".noUi-base").bounding_box()
    page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
    page.mouse.down()
    page.mouse.move(track["x"] + track["width"] + 20, handle["y"] + handle["height"] / 2, steps=10)
    page.mouse.up()


def test_notebook_08_steering_widget_drives_the_rollout(browser, lab_url):
    page = _open_notebook(browser, lab_url, "08_toy_world.ipynb")
    try:
        _run_to_widget(page)
        widget = page.locator(".jp-CodeCell", has=page.locator(f".cm-content:has-text('{WIDGET_CELL}')"))
        curvature = widget.locator(".widget-slider", has_text="curvature")
        gif = widget.locator("img").first
        info = widget.locator(".widget-html-content", has_text="final position error")
        before_gif, before_info = gif.get_attribute("src"), info.inner_text()
        before_value = curvature.locator(".widget-readout").inner_text()
        _drag_to_right_end(page, curvature)
        assert curvature.locator(".widget-readout").inner_text() != before_value
        try:
            page.wait_for_function("([el, old]) => el.getAttribute('src') !== old",
                                   arg=[gif.element_handle(), before_gif], timeout=ROLLOUT_TIMEOUT_S * 1000)
            page.wait_for_function("([el, old]) => el.innerText !== old", arg=[info.element_handle(), before_info],
                                   timeout=30_000)
        except sync_api.TimeoutError:
            pytest.fail(f"the slider moved ({before_value} -> {curvature.locator('.widget-readout').inner_text()}) "
                        f"but the widget showed no new rollout within {ROLLOUT_TIMEOUT_S} s")
        assert not _errors(page), f"the widget's rollout failed:\n{_errors(page)}"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "08_steering_widget.png"))
    except Exception:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "08_failed.png"))   # what the reader would have seen
        raise
    finally:
        page.close()
