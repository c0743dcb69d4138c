"""Lab 00's calculators in a real browser: JupyterLab + headless Chromium; moving a slider redraws the figure.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "calculators.ipynb"
CELLS = [
    "from minigpt.teaching.widgets import KVCacheCalculator, RooflineCalculator\n"
    "kv = KVCacheCalculator(context_len=8192)\nkv",
    "roof = RooflineCalculator(batch=1)\nroof",
]


def _wait_for_change(get, before, timeout_s: float = 60) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = get()
        if now != before:
            return now
        time.sleep(0.25)
    return get()


def _move_slider(page, calculator, label: str, presses: int = 1) -> None:
    """Focus the noUiSlider handle of the slider labelled `label` and press the right arrow key."""
    slider = calculator.locator(".widget-slider").filter(has=page.locator(".widget-label", has_text=label)).first
    handle = slider.locator(".noUi-handle").first
    handle.focus()
    for _ in range(presses):
        page.keyboard.press("ArrowRight")


def _accept_dialogs(page) -> None:
    """Accept any modal JupyterLab dialog (e.g. the kernel selector shown while a session starts)."""
    dialog = page.locator(".jp-Dialog")
    for _ in range(3):
        if not dialog.count() or not dialog.first.is_visible():
            return
        print("JupyterLab dialog:", dialog.first.inner_text()[:200].replace("\n", " | "))
        dialog.first.locator(".jp-Dialog-button.jp-mod-accept").first.click()
        time.sleep(0.5)


def _run_all(page, attempts: int = 4) -> None:
    """Run > Run All Cells ("runmenu:run-all" in JupyterLab 4); retried, since a click made while the
    kernel session is still connecting can be dropped. Done once the first cell has started ([*] or [1])."""
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
def opened(lab_server, chromium_page, write_notebook):
    write_notebook(lab_server.root / NOTEBOOK, CELLS)
    page = chromium_page
    page.goto(lab_server.lab_url(NOTEBOOK))
    page.locator(".jp-Notebook").first.wait_for()
    _run_all(page)
    try:
        page.locator(".widget-html-content", has_text="max concurrent requests").first.wait_for(timeout=120_000)
        page.locator(".widget-image").nth(1).wait_for(timeout=120_000)
    except Exception:
        shot = lab_server.root.parent / "failure.png"
        page.screenshot(path=str(shot))
        raise AssertionError(f"the calculators did not render; screenshot: {shot}, server log: "
                             f"{lab_server.root.parent / 'server.log'}") from None
    return page


def _calculators(page):
    outputs = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image"))
    return outputs.nth(0), outputs.nth(1)


def test_kv_calculator_redraws_when_the_context_slider_moves(opened):
    page = opened
    kv, _ = _calculators(page)
    readout = kv.locator(".widget-html-content").filter(has_text="max concurrent requests").first
    image = kv.locator("img").first
    text0, src0, png0 = readout.inner_text(), image.get_attribute("src"), image.screenshot()
    assert "8,192 tokens" in text0
    _move_slider(page, kv, "context")
    text1 = _wait_for_change(readout.inner_text, text0)
    assert text1 != text0 and "16,384 tokens" in text1, text1
    src1 = _wait_for_change(lambda: image.get_attribute("src"), src0)
    assert src1 != src0
    assert _wait_for_change(image.screenshot, png0) != png0, "the figure's pixels did not change"


def test_roofline_calculator_redraws_when_the_batch_slider_moves(opened):
    page = opened
    _, roof = _calculators(page)
    readout = roof.locator(".widget-html-content").filter(has_text="ridge").first
    image = roof.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "batch 1," in text0
    _move_slider(page, roof, "batch")
    text1 = _wait_for_change(readout.inner_text, text0)
    assert "batch 2," in text1, text1
    assert _wait_for_change(image.screenshot, png0) != png0, "the figure's pixels did not change"
