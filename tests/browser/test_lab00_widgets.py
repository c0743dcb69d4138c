"""Lab 00's calculators in a real browser: JupyterLab + headless Chromium; moving a slider redraws the figure.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import pytest
from browser_support import move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "calculators.ipynb"
CELLS = [
    "from minigpt.teaching.widgets import KVCacheCalculator, RooflineCalculator\n"
    "kv = KVCacheCalculator(context_len=8192)\nkv",
    "roof = RooflineCalculator(batch=1)\nroof",
]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    return open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="max concurrent requests", images=2,
                                what="the calculators")


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
    move_slider(page, kv, "context")
    text1 = wait_for_change(readout.inner_text, text0)
    assert text1 != text0 and "16,384 tokens" in text1, text1
    src1 = wait_for_change(lambda: image.get_attribute("src"), src0)
    assert src1 != src0
    assert wait_for_change(image.screenshot, png0) != png0, "the figure's pixels did not change"


def test_roofline_calculator_redraws_when_the_batch_slider_moves(opened):
    page = opened
    _, roof = _calculators(page)
    readout = roof.locator(".widget-html-content").filter(has_text="ridge").first
    image = roof.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "batch 1," in text0
    move_slider(page, roof, "batch")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "batch 2," in text1, text1
    assert wait_for_change(image.screenshot, png0) != png0, "the figure's pixels did not change"
