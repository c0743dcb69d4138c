"""Lab 04's online-softmax stepper in a real browser: JupyterLab + headless Chromium; moving a slider
updates the table of running max / denominator and redraws the figure.

Run with `pytest -m browser tests/browser/test_lab04_stepper.py`. Needs Chromium (see conftest.py).
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "stepper.ipynb"
CELLS = ["from minigpt.teaching.flash_stepper import OnlineSoftmaxStepper\nstepper = OnlineSoftmaxStepper(block=4)\nstepper"]


def _wait_for_change(get, before, timeout_s: float = 60) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = get()
        if now != before:
            return now
        time.sleep(0.25)
    return get()


def _press(page, widget, label: str, key: str = "ArrowRight") -> None:
    """Focus the noUiSlider handle of the slider labelled `label` and press an arrow key."""
    slider = widget.locator(".widget-slider").filter(has=page.locator(".widget-label", has_text=label)).first
    slider.locator(".noUi-handle").first.focus()
    page.keyboard.press(key)


def _accept_dialogs(page) -> None:
    dialog = page.locator(".jp-Dialog")
    for _ in range(3):
        if not dialog.count() or not dialog.first.is_visible():
            return
        dialog.first.locator(".jp-Dialog-button.jp-mod-accept").first.click()
        time.sleep(0.5)


def _run_all(page, attempts: int = 4) -> None:
    first_prompt = page.locator(".jp-InputArea-prompt").first
    for _ in range(attempts):
        page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(timeout=60_000)
        _accept_dialogs(page)
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').first.click()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if first_prompt.inner_text().strip() not in ("[ ]:", ""):
                return
            time.sleep(0.25)
    raise AssertionError("JupyterLab did not start running the cells")


@pytest.fixture(scope="module")
def stepper(lab_server, chromium_page, write_notebook):
    write_notebook(lab_server.root / NOTEBOOK, CELLS)
    page = chromium_page
    page.goto(lab_server.lab_url(NOTEBOOK))
    page.locator(".jp-Notebook").first.wait_for()
    # a kernel switch (JupyterLab's kernel dialog accepted while the session connects) can drop the first
    # run: run again until the widget shows up
    for attempt in range(3):
        _run_all(page)
        try:
            page.locator(".widget-html-content", has_text="after tile 1 of 6").first.wait_for(timeout=60_000)
            page.locator(".widget-image").first.wait_for(timeout=60_000)
            break
        except Exception:
            if attempt == 2:
                shot = lab_server.root.parent / "failure.png"
                page.screenshot(path=str(shot))
                raise AssertionError(f"the stepper did not render; screenshot: {shot}") from None
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def test_stepping_a_tile_updates_the_table_and_the_figure(stepper):
    page, widget = stepper
    readout = widget.locator(".widget-html-content").filter(has_text="after tile").first
    image = widget.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "after tile 1 of 6" in text0
    _press(page, widget, "tiles read")
    text1 = _wait_for_change(readout.inner_text, text0)
    assert "after tile 2 of 6" in text1, text1
    time.sleep(0.5)
    assert image.screenshot() != png0, "the figure's pixels did not change"


def test_changing_the_tile_size_changes_the_number_of_tiles(stepper):
    page, widget = stepper
    readout = widget.locator(".widget-html-content").filter(has_text="after tile").first
    text0 = readout.inner_text()
    _press(page, widget, "key tile")                 # 4 -> 5 keys per tile: 24 keys in 5 tiles
    text1 = _wait_for_change(readout.inner_text, text0)
    assert "of 5 (tile of 5 keys)" in text1, text1
