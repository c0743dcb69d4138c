"""Lab 08's live dashboard in a real browser: JupyterLab + headless Chromium. A server runs in the kernel; pressing
"run load test" drives a load test while the dashboard polls /metrics, and the readout and the figure update.

Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py).
"""

from __future__ import annotations

import re

import pytest
from browser_support import open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "serving_dashboard.ipynb"
CELLS = ["""\
import contextlib
from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.load_generator import benchmark, corpus_prompts
from minigpt.teaching.serving_dashboard import ServingDashboard
from minigpt.tokenizer import load_tokenizer

servers = contextlib.ExitStack()
engine = LLMEngine.from_checkpoint("draft", EngineConfig(num_blocks=128), tokenizer=load_tokenizer(), model_name="draft")
url = servers.enter_context(serve_in_thread(create_app(AsyncLLMEngine(engine))))
prompts = corpus_prompts(24, prompt_tokens=32, seed=0)
dash = ServingDashboard(url, load=lambda: benchmark(url, prompts, rate=24.0, max_tokens=16))
dash"""]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    return open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="batch size", images=1,
                                what="the serving dashboard")


def _finished(text: str) -> int:
    match = re.search(r"finished (\d+)", text)
    assert match, f"the readout does not say how many requests finished: {text!r}"
    return int(match.group(1))


def test_load_test_updates_the_dashboard(opened):
    page = opened
    widget = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-image")).first
    readout = widget.locator(".widget-html-content").filter(has_text="batch size").first
    status = widget.locator(".widget-html-content").nth(0)
    image = widget.locator("img").first
    text0, png0 = readout.inner_text(), image.screenshot()
    assert _finished(text0) == 0, text0
    widget.get_by_role("button", name="run load test").click()
    wait_for_change(lambda: "done" in status.inner_text(), False, timeout_s=120)
    assert "load test done" in status.inner_text(), status.inner_text()
    text1 = readout.inner_text()
    assert _finished(text1) == 24, text1
    assert "TTFT p50" in text1 and "–" not in text1.split("TTFT")[1], text1
    assert wait_for_change(image.screenshot, png0, 30) != png0, "the figure's pixels did not change"
