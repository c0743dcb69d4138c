"""Lab 12's timeline view in a real browser: JupyterLab + headless Chromium; choosing the H100 preset moves the
sliders, the readout and the Gantt rows follow; a slider changes them again.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); under a minute (no model runs).
"""

from __future__ import annotations

import re

import pytest
from browser_support import assert_labels_whole, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "timeline_view.ipynb"
CELLS = ["from minigpt.teaching.timeline_view import TimelineView\n"
         "view = TimelineView(model_ms=8.0, cpu_ms=0.4, handoff_ms=0.12)\nview"]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="time between tokens",
                                images=1, what="the timeline view")
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def test_a_preset_and_a_slider_redraw_the_timeline(opened):
    page, view = opened
    readout = view.locator(".widget-html-content").filter(has_text="time between tokens").first
    image = view.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "serial 8.40 ms, overlapped 8.12 ms" in text0 and "1.03x" in text0 and "model's step" in text0, text0

    view.locator(".widget-dropdown").filter(has=page.locator(".widget-label", has_text=re.compile("^preset$"))) \
        .first.locator("select").select_option(label="an H100, Llama-3.2-1B, batch 1")
    text1 = wait_for_change(readout.inner_text, text0)
    text1 = wait_for_change(readout.inner_text, text1) if "0.95 ms" not in text1 else text1
    assert "serial 1.64 ms, overlapped 0.95 ms" in text1 and "CPU's work sets the pace" in text1, text1
    png1 = wait_for_change(image.screenshot, png0, 30)
    assert png1 != png0, "the Gantt rows did not change with the preset"

    slider = view.locator(".widget-slider").filter(has=page.locator(".widget-label", has_text="CPU work")).first
    slider.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowLeft")
    text2 = wait_for_change(readout.inner_text, text1)
    assert "serial 1.59 ms" in text2, text2
    assert_labels_whole(page, "the timeline view")
