"""Lab 03's serving simulator in a real browser: JupyterLab + headless Chromium; moving a slider reruns the
simulation and redraws the goodput curve.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations


import pytest
from browser_support import move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "serving_simulator.ipynb"
CELLS = ["from minigpt.teaching.serving_widget import ServingSimulator\nsim = ServingSimulator(max_rate=20.0)\nsim"]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    return open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="goodput", images=1,
                                what="the simulator")


def test_simulator_reruns_when_the_rate_slider_moves(opened):
    page = opened
    widget = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first
    readout = widget.locator(".widget-html-content").filter(has_text="goodput").first
    image = widget.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "at 20 req/s" in text0 and "continuous" in text0, text0
    move_slider(page, widget, "max rate")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "at 40 req/s" in text1, text1
    assert wait_for_change(image.screenshot, png0, 30) != png0, "the figure's pixels did not change"
