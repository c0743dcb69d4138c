"""Lab 02's pool view in a real browser: JupyterLab + headless Chromium; moving a slider redraws the grid.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import pytest

from test_lab00_widgets import _move_slider, _run_all, _wait_for_change   # the shared JupyterLab helpers

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "pool_view.ipynb"
CELLS = ["from minigpt.teaching.pool_view import PoolView\nPoolView(block_size=16, num_seqs=3, shared_len=64)"]


@pytest.fixture(scope="module")
def view(lab_server, chromium_page, write_notebook):
    write_notebook(lab_server.root / NOTEBOOK, CELLS)
    page = chromium_page
    page.goto(lab_server.lab_url(NOTEBOOK))
    page.locator(".jp-Notebook").first.wait_for()
    for _ in range(3):      # a run request made while the kernel session is still connecting can be dropped: retry
        _run_all(page)
        try:
            page.locator(".widget-html-content", has_text="pool view").first.wait_for(timeout=60_000)
            return page
        except Exception:
            pass
    shot = lab_server.root.parent / "failure_lab02.png"
    page.screenshot(path=str(shot))
    raise AssertionError(f"the pool view did not render; screenshot: {shot}")


def test_pool_view_redraws_when_sliders_move(view):
    page = view
    output = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-html-content", has_text="pool view")).first
    readout = output.locator(".widget-html-content").filter(has_text="pool view").first
    text0 = readout.inner_text()
    assert "128 blocks of 16 tokens" in text0 and "seq 2:" in text0 and "seq 3:" not in text0, text0
    grid0 = output.screenshot()
    _move_slider(page, output, "sequences")
    text1 = _wait_for_change(readout.inner_text, text0)
    assert "seq 3:" in text1, text1
    _move_slider(page, output, "block size")
    text2 = _wait_for_change(readout.inner_text, text1)
    assert "64 blocks of 32 tokens" in text2, text2
    assert output.screenshot() != grid0, "the grid's pixels did not change"
