"""Lab 13's radix view in a real browser: JupyterLab + headless Chromium, the seeded conversation trace. "Next
request" serves the trace's requests one by one (the counters follow `replay_trace` on the requests so far), a pool
slider replays them with the new size, "Reset" goes back to none.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); under a minute (no model runs).
"""

from __future__ import annotations

import pytest
from browser_support import assert_labels_whole, move_slider, open_widget_notebook, wait_for_change

from minigpt.cache.trace_replay import replay_trace
from minigpt.serving.trace import conversation_trace

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "radix_view.ipynb"
CELLS = ["from minigpt.teaching.radix_view import RadixView\n"
         "view = RadixView(pool_blocks=48, host_blocks=16)\nview"]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="requests so far", images=0,
                                what="the radix view")
    return page, page.locator(".jp-OutputArea-output").filter(
        has=page.locator(".widget-html-content", has_text="requests so far")).first


def test_next_request_a_slider_and_reset(opened):
    page, view = opened
    readout = view.locator(".widget-html-content").filter(has_text="requests so far").first
    records = conversation_trace(0)
    text = readout.inner_text()
    assert f"requests so far: 0 of {len(records)}" in text and "no request yet" in text, text
    assert "the tree is empty" in text and "host tier: 0 of 16 blocks" in text, text

    for n in (1, 2, 3):
        view.get_by_role("button", name="Next request", exact=True).click()
        text = wait_for_change(readout.inner_text, text)
        want = replay_trace(records[:n], "radix", 48, host_blocks=16)
        assert f"requests so far: {n} of {len(records)}" in text and f"request {n} arrived" in text, text
        assert f"{want.gpu_hits} hit in the GPU pool" in text and f"{want.computed} computed" in text, text
        assert f"hit rate so far {want.hit_rate:.1%}" in text, text
    assert "root" in text and "last used" in text, text

    move_slider(page, view, "GPU pool")
    text = wait_for_change(readout.inner_text, text)
    assert "GPU pool: 49 blocks" in text and f"requests so far: 3 of {len(records)}" in text, text

    view.get_by_role("button", name="Reset", exact=True).click()
    text = wait_for_change(readout.inner_text, text)
    assert f"requests so far: 0 of {len(records)}" in text and "GPU pool: 49 blocks" in text, text
    assert_labels_whole(page, "the radix view")
