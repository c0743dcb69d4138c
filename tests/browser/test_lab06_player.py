"""Lab 06's speculative-decoding player in a real browser: JupyterLab + headless Chromium; the buttons step
through the rounds and the readout follows.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import time

import pytest
from browser_support import open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "player.ipynb"
CELLS = [
    "import torch\ntorch.set_num_threads(1)\n"
    "from minigpt.checkpoint import load_model\nfrom minigpt.tokenizer import load_tokenizer\n"
    "from minigpt.sampling import SamplingParams\n"
    "from minigpt.teaching.speculative_player import SpeculativePlayer\n"
    "enc = load_tokenizer()\n"
    "player = SpeculativePlayer(load_model('target'), load_model('draft'), enc.encode('def main():\\n    '), enc, k=3,\n"
    "                           max_new_tokens=16, sampling=SamplingParams(temperature=0.8, seed=0))\nplayer",
]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    return open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="round 1 of", images=0,
                                what="the player")


def test_player_steps_through_rounds(opened):
    page = opened
    readout = page.locator(".widget-html-content").filter(has_text="of").first
    text0 = readout.inner_text()
    assert "round 1 of" in text0 and "min(1, p/q)" in text0 and "acceptance rate" in text0, text0
    assert any(word in text0 for word in ("accepted", "rejected", "bonus", "resampled"))
    page.locator("button", has_text="next").first.click()
    text1 = wait_for_change(readout.inner_text, text0)
    assert "round 2 of" in text1, text1
    assert "after 2 rounds" in text1, text1
    page.locator("button", has_text="previous").first.click()
    text2 = wait_for_change(readout.inner_text, text1)
    assert "round 1 of" in text2, text2
    time.sleep(0.2)
