"""Lab 09's perplexity-against-position view in a real browser: JupyterLab + headless Chromium; choosing other
curves changes the table, and moving the bucket slider redraws the figure.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute. The curves are
synthetic (seeded), so no model runs.
"""

from __future__ import annotations


import pytest
from browser_support import move_slider, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "long_context_view.ipynb"
CELLS = [
    "import torch\n"
    "from minigpt.teaching.long_context_view import LongContextView\n"
    "g = torch.Generator().manual_seed(0)\n"
    "pos = torch.arange(2047).float()\n"
    "curves = {'none': 3.5 + torch.relu(pos - 512) / 600 + 0.1 * torch.rand(2047, generator=g),\n"
    "          'yarn x4': 3.6 + 0.1 * torch.rand(2047, generator=g),\n"
    "          'window 128': 3.55 + 0.1 * torch.rand(2047, generator=g)}\n"
    "view = LongContextView(curves, trained_len=512, show=['none'])\nview",
]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="perplexity at positions",
                                images=1, what="the long-context view")
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def test_choosing_curves_and_buckets_updates_the_view(opened):
    page, view = opened
    readout = view.locator(".widget-html-content").filter(has_text="perplexity at positions").first
    image = view.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "none" in text0 and "yarn x4" not in text0 and "[1,024, 2,047)" in text0, text0

    view.locator(".widget-select-multiple select").first.select_option(["none", "yarn x4"])
    text1 = wait_for_change(readout.inner_text, text0)
    assert "yarn x4" in text1 and "none" in text1, text1
    png1 = wait_for_change(image.screenshot, png0, 30)
    assert png1 != png0, "the figure did not change with the curves"

    move_slider(page, view, "bucket", key="ArrowLeft")
    assert wait_for_change(image.screenshot, png1, 30) != png1, "the figure did not change with the bucket width"

