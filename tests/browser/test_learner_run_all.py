"""A learner's Run All in a real browser, with one deliberately wrong answer: the failing check names its exercise.

One lab of each check layout: lab 00 (its checks are one module, autograder/lab00.py) and lab 03 (a package,
autograder/lab03/). The released notebook (stubs in place) gets one exercise written wrongly, is opened in
JupyterLab (headless Chromium) and run with Run > Run All Cells. Asserted: Run All reaches the last cell, the wrong
exercise's check cell names that exercise, a stub's check says it is not implemented yet, and an exercise's
output never shows a traceback into the course's files.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from browser_support import run_all

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]

REPO_ROOT = Path(__file__).resolve().parents[2]

# lab, the exercise's code cell, (solution text, wrong text), the exercise's check cell, what it must say
CASES = {
    "00_token_factory": ("ex1_code", ("[:, -1]", "[:, 0]"), "ex1_check", "Exercise 1"),
    "03_continuous_batching": ("ex4_code", ("/ (len(t) - 1)", "/ len(t)"), "ex4_check", "Exercise 4"),
}


def _wrong_notebook(lab: str, folder: Path) -> Path:
    """The released notebook with one exercise's cell replaced by the solution's, made wrong by one edit."""
    code_id, (right, wrong), _, _ = CASES[lab]
    released = json.loads((REPO_ROOT / "labs" / lab / f"{lab}.ipynb").read_text())
    solution = json.loads((REPO_ROOT / "solutions" / lab / f"{lab}.ipynb").read_text())
    source = next("".join(c["source"]) for c in solution["cells"]
                  if c["metadata"].get("nbgrader", {}).get("grade_id") == code_id)
    assert right in source, f"{lab}: the solution's {code_id} no longer contains {right!r}; update CASES"
    for cell in released["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == code_id:
            cell["source"] = "".join(line for line in source.replace(right, wrong).splitlines(keepends=True)
                                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)
    (folder / lab).mkdir(exist_ok=True)
    path = folder / lab / f"{lab}.ipynb"
    path.write_text(json.dumps(released, indent=1))
    return path


def _wait_until_run_all_ends(page, timeout_s: float = 420) -> None:
    """Until the last code cell shows an execution count and no cell is still queued or running."""
    prompts = page.locator(".jp-CodeCell .jp-InputArea-prompt")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        texts = [t.strip() for t in prompts.all_text_contents()]
        if texts and any(ch.isdigit() for ch in texts[-1]) and not any("*" in t for t in texts):
            return
        time.sleep(1)
    raise AssertionError(f"Run All did not reach the last cell in {timeout_s:.0f} s; prompts: {texts[-5:]}")


def _output_of(page, grade_id: str, notebook: dict) -> str:
    """The text output of the code cell with this grade_id (the n-th code cell in the notebook's order)."""
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    index = next(i for i, c in enumerate(code_cells) if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    output = page.locator(".jp-CodeCell").nth(index).locator(".jp-OutputArea")
    output.scroll_into_view_if_needed()
    return output.text_content() or ""


@pytest.mark.parametrize("lab", sorted(CASES))
def test_run_all_with_a_wrong_answer_names_the_exercise(lab, lab_server, chromium_page):
    page = chromium_page
    path = _wrong_notebook(lab, lab_server.root)
    notebook = json.loads(path.read_text())
    page.goto(lab_server.lab_url(f"{lab}/{path.name}"))
    page.locator(".jp-Notebook .jp-RenderedMarkdown h1").first.wait_for()
    try:
        run_all(page)
        _wait_until_run_all_ends(page)
        _, _, check_id, says = CASES[lab]
        failed = _output_of(page, check_id, notebook)
        assert says in failed and "AssertionError" in failed, f"{lab}: the wrong exercise's check said:\n{failed}"
        stubs = [c["metadata"]["nbgrader"]["grade_id"] for c in notebook["cells"]
                 if c["metadata"].get("nbgrader", {}).get("grade_id", "").endswith("_check")
                 and c["metadata"]["nbgrader"]["grade_id"] != check_id]
        stub_says = _output_of(page, stubs[0], notebook)
        assert "is not implemented yet" in stub_says and "Exercise" in stub_says, (
            f"{lab}: a stub's check ({stubs[0]}) said:\n{stub_says}")
        every_output = "\n".join(page.locator(".jp-OutputArea").all_text_contents())
        assert "autograder/" not in every_output and "site-packages" not in every_output, (
            f"{lab}: a traceback into the course's files was shown")
    except AssertionError:
        shot = lab_server.root.parent / f"failure_run_all_{lab}.png"
        page.screenshot(path=str(shot))
        page.keyboard.press("Control+s")
        page.wait_for_timeout(2000)
        ran = [(c.get("execution_count"), "".join(c["source"])[:40], [o.get("ename") for o in c.get("outputs", [])])
               for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        print(f"screenshot: {shot}; code cells as saved: {ran[:12]}")
        raise
