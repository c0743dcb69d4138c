"""Lab 06's token-tree view in a real browser: JupyterLab + headless Chromium, the course target and its draft head.
"Next round" verifies the next tree (readout and picture follow), "Reset" goes back to round 1, and a shape slider
starts over with a tree of the new shape.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import pytest
from browser_support import assert_labels_whole, move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "tree_view.ipynb"
CELLS = [
    "import torch\ntorch.set_num_threads(1)\n"
    "from minigpt.teaching.tree_view import TreeView\n"
    "view = TreeView('def main():\\n    ', depth=3, width=2, branch=2, max_new_tokens=24)\nview",
]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="round 1", images=1,
                                what="the tree view")
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def test_next_round_reset_and_a_new_shape(opened):
    page, view = opened
    readout = view.locator(".widget-html-content").filter(has_text="tokens per round").first
    image = view.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "round 1:" in text0 and "nodes in one forward" in text0 and "depth 3, width 2, branch 2" in text0, text0

    view.get_by_role("button", name="Next round", exact=True).click()
    text1 = wait_for_change(readout.inner_text, text0)
    assert "round 2:" in text1 and "after 2 rounds" in text1, text1
    png1 = wait_for_change(image.screenshot, png0, 30)
    assert png1 != png0, "the tree did not change with the round"

    view.get_by_role("button", name="Reset", exact=True).click()
    text2 = wait_for_change(readout.inner_text, text1)
    assert "round 1:" in text2 and "after 1 round:" in text2, text2

    move_slider(page, view, "depth", key="ArrowRight")
    text3 = wait_for_change(readout.inner_text, text2)
    assert "round 1:" in text3 and "depth 4, width 2, branch 2" in text3, text3
    assert_labels_whole(page, "the tree view")
