"""Lab 10's grammar stepper in a real browser: JupyterLab + headless Chromium, the target model constrained by the
lab's shirt schema. Step adds a token, Run to end finishes with a document the grammar accepts, a schema the
compiler refuses is shown in the view, and no label is cut short.

The notebook is a small one written here (the lab's own notebook takes minutes to run to its view).
Run with `pytest -m browser tests/browser`. Needs Chromium (see conftest.py); about a minute.
"""

from __future__ import annotations

import pytest
from browser_support import assert_labels_whole, open_widget_notebook, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "grammar_stepper.ipynb"
CELLS = [
    "import torch\ntorch.set_num_threads(1)\n"
    "from minigpt.checkpoint import load_model\nfrom minigpt.tokenizer import load_tokenizer\n"
    "from minigpt.teaching.grammar_stepper import GrammarStepper\n"
    "SHIRT = {'type': 'object', 'properties': {\n"
    "    'color': {'enum': ['red', 'green', 'blue']},\n"
    "    'size': {'type': 'integer', 'minimum': 1, 'maximum': 12},\n"
    "    'price': {'type': 'number', 'minimum': 0},\n"
    "    'tags': {'type': 'array', 'items': {'type': 'string', 'maxLength': 8}, 'maxItems': 3}},\n"
    "    'required': ['color', 'size']}\n"
    "view = GrammarStepper(load_model('target'), load_tokenizer(), schema=SHIRT, prompt='The shirt, as JSON: ')\n"
    "view",
]


@pytest.fixture(scope="module")
def opened(lab_server, chromium_page):
    page = open_widget_notebook(chromium_page, lab_server, NOTEBOOK, CELLS, readout="after 0 of at most",
                                what="the grammar stepper")
    view = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-textarea")).first
    return page, view


def _readout(view):
    return view.locator(".widget-html-content").filter(has_text="at most").first


def test_step_and_run_to_end(opened):
    page, view = opened
    readout = _readout(view)
    text0 = readout.inner_text()
    assert "tokens allowed" in text0 and "renormalised" in text0 and "accepts here: no" in text0, text0
    view.get_by_role("button", name="Step", exact=True).click()
    text1 = wait_for_change(readout.inner_text, text0)
    assert "after 1 of at most" in text1 and "{" in text1.split("The shirt, as JSON:")[1], text1
    view.get_by_role("button", name="Run to end", exact=True).click()
    done = view.locator(".widget-html-content", has_text="the grammar accepts the document").first
    done.wait_for(timeout=60_000)
    assert "it parses as JSON" in done.inner_text(), done.inner_text()
    assert view.get_by_role("button", name="Step", exact=True).is_disabled()
    assert_labels_whole(page, "the grammar stepper after a run")


def test_a_refused_schema_is_shown(opened):
    page, view = opened
    view.locator(".widget-textarea textarea").first.fill('{"type": "string", "format": "email"}')
    view.get_by_role("button", name="Compile", exact=True).click()
    error = view.locator(".widget-html-content", has_text="does not compile").first
    error.wait_for(timeout=30_000)
    assert "format" in error.inner_text(), error.inner_text()
    assert view.get_by_role("button", name="Step", exact=True).is_disabled()
    view.locator(".widget-textarea textarea").first.fill('{"type": "boolean"}')
    view.get_by_role("button", name="Compile", exact=True).click()
    _readout(view).filter(has_text="after 0 of at most").wait_for(timeout=30_000)
    view.get_by_role("button", name="Run to end", exact=True).click()
    view.locator(".widget-html-content", has_text="the grammar accepts the document").first.wait_for(timeout=30_000)
    assert_labels_whole(page, "the grammar stepper after an error")
