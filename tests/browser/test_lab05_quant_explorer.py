"""Lab 05's quantization explorer in a real browser: JupyterLab + headless Chromium; moving the bits slider
and picking another layer update the readout and redraw the histogram.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations


import pytest
from browser_support import move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "quant_explorer.ipynb"
CELLS = [
    "from minigpt.checkpoint import load_model\n"
    "from minigpt.teaching.quant_explorer import QuantizationExplorer\n"
    "explorer = QuantizationExplorer(load_model('target'), bits=4, group_size=128)\nexplorer",
]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    return open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="bits/weight", images=1,
                                what="the explorer")


def _explorer(page):
    return page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def test_bits_slider_updates_readout_and_histogram(opened):
    page = opened
    explorer = _explorer(page)
    readout = explorer.locator(".widget-html-content").filter(has_text="bits/weight").first
    image = explorer.locator("img").first
    text0, src0, png0 = readout.inner_text(), image.get_attribute("src"), image.screenshot()
    assert "4.25 bits/weight" in text0, text0
    move_slider(page, explorer, "bits")                     # 4 -> 8
    text1 = wait_for_change(readout.inner_text, text0)
    assert "8.25 bits/weight" in text1, text1
    assert wait_for_change(lambda: image.get_attribute("src"), src0) != src0, "the histogram was not redrawn"
    assert wait_for_change(image.screenshot, png0, 30) != png0, "the histogram's pixels did not change"


def test_layer_dropdown_switches_the_layer(opened):
    page = opened
    explorer = _explorer(page)
    readout = explorer.locator(".widget-html-content").filter(has_text="bits/weight").first
    text0 = readout.inner_text()
    assert "layers.0.attn.wq" in text0
    explorer.locator("select").first.select_option("layers.0.mlp.w_down")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "layers.0.mlp.w_down" in text1, text1
