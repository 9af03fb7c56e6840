"""The course as a learner meets it: `./course lab`, driven in headless Chromium.

Lesson 01's exercise notebook is opened twice in JupyterLab and run with Run → Run All
Cells: once with a wrong answer in its exercise cell (the grid rounds down), where the
check's report must show ✗ and the hint about the grid, and once solved, where the
check shows ✓. Screenshots of both go to browser-screenshots/.

Needs Debian's chromium (`apt-get install chromium`), JupyterLab and Playwright's Python
package (`.venv/bin/pip install -e ".[lab,browser]"`); skipped where any is missing.
Run it alone with `./course test -m browser`. Playwright drives the system Chromium:
it downloads no browser of its own.
"""

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course_lib import builder

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = builder.ROOT / "browser-screenshots"
LESSON = "01_vector_add.ipynb"
RIGHT_GRID = "grid = (triton.cdiv(n_elements, BLOCK_SIZE),)"
WRONG_GRID = "grid = (n_elements // BLOCK_SIZE,)"


def _missing() -> str | None:
    if CHROMIUM is None:
        return "no Chromium installed"
    for module in ("playwright", "jupyterlab"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed"
    return None


pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(_missing() is not None, reason=f"browser test: {_missing()}"),
]


def _answered(wrong: bool) -> nbformat.NotebookNode:
    """The exercise notebook of lesson 01 with its exercise cells answered."""
    exercise = nbformat.read(builder.NOTEBOOKS / LESSON, as_version=4)
    solved = nbformat.read(builder.SOLUTIONS / LESSON, as_version=4)
    for mine, answer in zip(exercise.cells, solved.cells):
        if mine.metadata.get("nbgrader", {}).get("solution"):
            source = answer.source.replace(RIGHT_GRID, WRONG_GRID) if wrong else answer.source
            assert source != answer.source or not wrong, "the lesson's grid line changed"
            mine.source = source
    return exercise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`./course lab` serving a folder with the two answered notebooks."""
    root = tmp_path_factory.mktemp("lab")
    settings = tmp_path_factory.mktemp("lab-settings")
    # every cell in the page, even far below the fold, so the check cell can be found;
    # and a settings folder of its own, so that the learner's settings stay out of it
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')
    nbformat.write(_answered(wrong=True), root / "wrong.ipynb")
    nbformat.write(_answered(wrong=False), root / "solved.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "COURSE_ENV": "current",  # this Python, which has JupyterLab: no installs
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(builder.ROOT),
    }
    log = open(root / "lab.log", "w")  # noqa: SIM115  (closed below)
    server = subprocess.Popen(
        [
            str(builder.ROOT / "course"), "lab", "--no-browser", "--ip=127.0.0.1",
            f"--port={port}", f"--IdentityProvider.token={token}", f"--notebook-dir={root}",
            f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={settings}",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"./course lab did not start:\n{(root / 'lab.log').read_text()}")
                time.sleep(0.5)
        yield url, token
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync",
            ],
        )  # fmt: skip
        yield chromium
        chromium.close()


def _run_all(browser, lab, name: str):
    """Open a notebook in JupyterLab, run every cell from the Run menu, and return the page
    once the check cell has an output."""
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    # a workspace per notebook, so that JupyterLab does not reopen the other one beside it
    workspace = name.removesuffix(".ipynb")
    page.goto(f"{url}/lab/workspaces/{workspace}/tree/{name}?token={token}&reset")
    page.locator(".jp-Notebook").first.wait_for(timeout=120_000)
    # JupyterLab may ask which kernel to start; a learner takes the preferred one
    select = page.locator(".jp-Dialog button", has_text="Select")
    with contextlib.suppress(Exception):
        select.first.wait_for(timeout=15_000)
        select.first.click()
    # the kernel must be up before Run All, or the cells queue behind its start
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
        timeout=120_000
    )
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    check = page.locator(".jp-CodeCell", has_text="course_lib.check_vector_add(add)").first
    output = check.locator(".jp-OutputArea-output").first
    try:
        output.wait_for(state="attached", timeout=180_000)
        check.scroll_into_view_if_needed()
        output.wait_for(state="visible", timeout=10_000)
    except Exception:
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=SHOTS / f"timeout-{name.removesuffix('.ipynb')}.png")
        raise
    return page, check


def test_a_wrong_answer_shows_the_cross_and_the_hint(browser, lab):
    page, check = _run_all(browser, lab, "wrong.ipynb")
    report = check.locator(".jp-OutputArea-output").first
    text = report.inner_text()
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / "wrong-answer.png")
    assert "✗ vector_add" in text
    assert "hint: the grid is too small" in text and "cdiv" in text
    assert report.get_by_text("hint: the grid is too small").first.is_visible()
    page.close()


def test_a_solved_notebook_shows_the_tick(browser, lab):
    page, check = _run_all(browser, lab, "solved.ipynb")
    text = check.locator(".jp-OutputArea").first.inner_text()
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / "solved-answer.png")
    assert "✓ vector_add: every case passed" in text
    assert "✗" not in text
    assert check.get_by_text("cases").first.is_visible()  # the collapsed list of cases
    page.close()
