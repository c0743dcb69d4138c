"""Lab 04's online-softmax stepper in a real browser: JupyterLab + headless Chromium; moving a slider
updates the table of running max / denominator and redraws the figure.

Run with `pytest -m browser tests/browser/test_lab04_stepper.py`. Needs Chromium (see conftest.py).
"""

from __future__ import annotations


import pytest
from browser_support import move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "stepper.ipynb"
CELLS = ["from minigpt.teaching.flash_stepper import OnlineSoftmaxStepper\nstepper = OnlineSoftmaxStepper(block=4)\nstepper"]


@pytest.fixture(scope="module")
def stepper(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="after tile 1 of 6", images=1,
                                what="the stepper")
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def test_stepping_a_tile_updates_the_table_and_the_figure(stepper):
    page, widget = stepper
    readout = widget.locator(".widget-html-content").filter(has_text="after tile").first
    image = widget.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "after tile 1 of 6" in text0
    move_slider(page, widget, "tiles read")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "after tile 2 of 6" in text1, text1
    assert wait_for_change(image.screenshot, png0, 30) != png0, "the figure's pixels did not change"


def test_changing_the_tile_size_changes_the_number_of_tiles(stepper):
    page, widget = stepper
    readout = widget.locator(".widget-html-content").filter(has_text="after tile").first
    text0 = readout.inner_text()
    move_slider(page, widget, "key tile")                 # 4 -> 5 keys per tile: 24 keys in 5 tiles
    text1 = wait_for_change(readout.inner_text, text0)
    assert "of 5 (tile of 5 keys)" in text1, text1
