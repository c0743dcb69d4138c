"""Lab 09's retrieval view in a real browser: JupyterLab + headless Chromium; choosing another policy changes the
table and the heatmap, comparing adds a row, and switching the metric to perplexity redraws the figure.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute. The grids are
synthetic (seeded), so no model runs.
"""

from __future__ import annotations

import re

import pytest
from browser_support import assert_labels_whole, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "retrieval_view.ipynb"
CELLS = [
    "import random\n"
    "from minigpt.teaching.retrieval_view import RetrievalView\n"
    "rng = random.Random(0)\n"
    "L, D, E = [512, 1024, 2048, 4096], [0.0, 0.25, 0.5, 0.75, 1.0], [0, 512, 1024, 2048, 4095]\n"
    "def grid(policy, drop, growth):\n"
    "    acc = [[min(1.0, max(0.0, 1 - drop * i + rng.uniform(-0.05, 0.05))) for _ in D] for i in range(len(L))]\n"
    "    return {'policy': policy, 'kind': 'passkey', 'lengths': L, 'depths': D, 'accuracy': acc, 'band_edges': E,\n"
    "            'band_perplexity': [20 * growth ** i for i in range(4)], 'seconds': 1.0}\n"
    "grids = [grid('none', 0.33, 3.0), grid('yarn', 0.1, 1.2), grid('4 sinks + window 124', 0.3, 1.0)]\n"
    "view = RetrievalView(grids, trained_len=512, policy='none')\nview",
]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="retrieval at length",
                                images=1, what="the retrieval view")
    return page, page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first


def _select(page, view, label: str, value: str) -> None:
    """Choose `value` in the ipywidgets Dropdown labelled exactly `label`."""
    dropdown = view.locator(".widget-dropdown").filter(
        has=page.locator(".widget-label", has_text=re.compile(rf"^{re.escape(label)}$"))).first
    dropdown.locator("select").select_option(label=value)


def test_choosing_policies_and_the_metric_updates_the_view(opened):
    page, view = opened
    readout = view.locator(".widget-html-content").filter(has_text="retrieval at length").first
    image = view.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert "none" in text0 and "yarn" not in text0 and "4,096" in text0 and "[2,048, 4,095)" in text0, text0
    assert "keeps the most retrieval" in text0, text0

    _select(page, view, "policy", "yarn")
    text1 = wait_for_change(readout.inner_text, text0)
    assert "yarn" in text1 and "none" not in text1, text1
    png1 = wait_for_change(image.screenshot, png0, 30)
    assert png1 != png0, "the heatmap did not change with the policy"

    _select(page, view, "compare with", "4 sinks + window 124")
    text2 = wait_for_change(readout.inner_text, text1)
    assert "yarn" in text2 and "4 sinks + window 124" in text2, text2
    png2 = wait_for_change(image.screenshot, png1, 30)
    assert png2 != png1, "comparing did not add a heatmap"

    view.get_by_role("button", name="perplexity", exact=True).click()
    png3 = wait_for_change(image.screenshot, png2, 30)
    assert png3 != png2, "the figure did not change with the metric"
    assert readout.inner_text() == text2, "the metric should change the figure, not the table"
    assert_labels_whole(page, "the retrieval view")
    stderr = page.locator('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')
    assert not stderr.count(), f"the notebook printed to stderr: {stderr.first.inner_text()[:500]}"
