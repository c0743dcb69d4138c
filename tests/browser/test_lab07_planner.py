"""Lab 07's parallelism planner in a real browser: JupyterLab + headless Chromium; changing the link, the TP size
and the GPU count updates the readout (and the figure), and an inconsistent plan shows an error.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py).
"""

from __future__ import annotations

import re
import time

import pytest
from browser_support import move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "planner.ipynb"
CELLS = ["from minigpt.teaching.parallel_planner import ParallelismPlanner\n"
         "planner = ParallelismPlanner(model='Llama-3-70B', n_gpus=8, tp=8, pp=1)\nplanner"]


@pytest.fixture(scope="module")
def planner(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="estimated time per token", images=1,
                                what="the planner")
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def _select(page, widget, label: str, value: str) -> None:
    """Choose `value` in the ipywidgets Dropdown labelled exactly `label`."""
    dropdown = widget.locator(".widget-dropdown").filter(
        has=page.locator(".widget-label", has_text=re.compile(rf"^{re.escape(label)}$"))).first
    dropdown.locator("select").select_option(label=value)


def test_planner_updates_when_the_plan_changes(planner):
    page, widget = planner
    readout = widget.locator(".widget-html-content").filter(has_text="estimated time per token").first
    image = widget.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "TP=8, PP=1" in text0 and "NVLink 4" in text0 and "4,587,520 bytes" in text0, text0

    _select(page, widget, "link", "PCIe Gen5 x16")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "PCIe Gen5 x16" in text1 and text1 != text0, text1
    assert wait_for_change(image.screenshot, png0, 30) != png0, "the figure's pixels did not change"

    _select(page, widget, "TP", "4")                      # 4 x 1 != 8 GPUs: an error, the controls stay
    error = widget.locator(".widget-html-content").filter(has_text="TP x PP").first
    error.wait_for(timeout=30_000)
    assert "8 are selected" in error.inner_text()

    _select(page, widget, "GPUs", "4")
    text2 = wait_for_change(readout.inner_text, text1)
    assert "TP=4, PP=1" in text2 and "4 x H100-SXM" in text2, text2

    move_slider(page, widget, "batch")
    text3 = wait_for_change(readout.inner_text, text2)
    assert "batch 2 x" in text3, text3
