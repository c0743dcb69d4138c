"""Lab 11's goodput view in a real browser: JupyterLab + headless Chromium; moving the rate, the prompt length and the
prefill/decode split reruns the simulations and changes the readout and the figure.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute. The simulator prices
steps on lab 00's roofline, so no model runs.
"""

from __future__ import annotations

import pytest
from browser_support import assert_labels_whole, move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "goodput_view.ipynb"
CELLS = ["from minigpt.teaching.goodput_view import GoodputView\n"
         "view = GoodputView(rate=10.0, prompt_len=4096, output_len=128, n_gpus=4, prefill_gpus=3)\nview"]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="goodput = requests/s meeting",
                                images=1, what="the goodput view")
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def test_moving_the_rate_the_prompt_and_the_split_updates_the_view(opened):
    page, view = opened
    readout = view.locator(".widget-html-content").filter(has_text="goodput = requests/s meeting").first
    image = view.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "At 10 req/s per GPU (40 req/s on 4 GPUs)" in text0 and "disaggregated (3 + 1)" in text0, text0
    assert "wins" in text0 or "tie" in text0, text0

    move_slider(page, view, "rate (req/s per GPU)", key="ArrowLeft")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "At 8 req/s per GPU (32 req/s on 4 GPUs)" in text1, text1
    png1 = wait_for_change(image.screenshot, png0, 30)
    assert png1 != png0, "the figure did not change with the rate"

    move_slider(page, view, "prompt tokens", key="ArrowLeft")
    text2 = wait_for_change(readout.inner_text, text1)
    assert "prompts of 2,048 tokens" in text2, text2
    png2 = wait_for_change(image.screenshot, png1, 30)
    assert png2 != png1, "the figure did not change with the prompt length"

    move_slider(page, view, "prefill GPUs", key="ArrowLeft")
    text3 = wait_for_change(readout.inner_text, text2)
    assert "disaggregated (2 + 2)" in text3, text3
    assert wait_for_change(image.screenshot, png2, 30) != png2, "the figure did not change with the split"
    assert_labels_whole(page, "the goodput view")
    stderr = page.locator('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')
    assert not stderr.count(), f"the notebook printed to stderr: {stderr.first.inner_text()[:500]}"
