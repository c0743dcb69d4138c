"""Lab 02's pool view in a real browser: JupyterLab + headless Chromium; moving a slider redraws the grid.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import pytest
from browser_support import move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "pool_view.ipynb"
CELLS = ["from minigpt.teaching.pool_view import PoolView\nPoolView(block_size=16, num_seqs=3, shared_len=64)"]


@pytest.fixture(scope="module")
def view(lab_server, chromium_page):
    return open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="pool view", images=0,
                                what="the pool view")


def test_pool_view_redraws_when_sliders_move(view):
    page = view
    output = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-html-content", has_text="pool view")).first
    readout = output.locator(".widget-html-content").filter(has_text="pool view").first
    text0 = readout.inner_text()
    assert "128 blocks of 16 tokens" in text0 and "seq 2:" in text0 and "seq 3:" not in text0, text0
    grid0 = output.screenshot()
    move_slider(page, output, "sequences")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "seq 3:" in text1, text1
    move_slider(page, output, "block size")
    text2 = wait_for_change(readout.inner_text, text1)
    assert "64 blocks of 32 tokens" in text2, text2
    assert wait_for_change(output.screenshot, grid0, 30) != grid0, "the grid's pixels did not change"
