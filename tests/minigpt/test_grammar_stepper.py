"""Lab 10's grammar stepper without a browser: a small random model over the course tokenizer's vocabulary, a schema
with a finite language (so greedy decoding must end), and the view's buttons pressed in Python."""

from __future__ import annotations

import json

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.teaching.grammar_stepper import GrammarStepper, next_choice
from minigpt.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "size": {"type": "integer", "minimum": 1, "maximum": 12},
                                           "color": {"enum": ["red", "green"]}},
          "required": ["ok", "size"]}
SMALL = ModelConfig(vocab_size=4096, max_seq_len=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)


@pytest.fixture(scope="module")
def model() -> GPT:
    with torch.random.fork_rng():          # the weights from a seed, the global RNG left as it was
        torch.manual_seed(0)
        return GPT(SMALL).eval()


@pytest.fixture(scope="module")
def enc():
    return load_tokenizer()


@pytest.fixture
def view(model, enc, trie) -> GrammarStepper:
    return GrammarStepper(model, enc, schema=SCHEMA, prompt="The settings, as JSON: ", trie=trie)


def test_run_to_end_gives_a_document_the_grammar_accepts(view):
    view.run_button.click()
    run = view.run
    assert run.finished == "end", f"a finite language must end with end-of-text, got {run.finished!r}: {run.text!r}"
    assert view.grammar.matches(run.text), run.text
    assert json.loads(run.text)["size"] in range(1, 13)
    assert "the grammar accepts the document" in view.readout.value
    assert view.step_button.disabled and view.run_button.disabled


def test_each_step_takes_one_token_and_stays_in_the_language(view):
    start = view.grammar.start_state()
    for n in range(1, 6):
        view.step_button.click()
        assert len(view.run.tokens) == n
        assert view.grammar.walk(start, view.run.text) == view.run.state is not None
        assert f"after {n} of at most" in view.readout.value


def test_the_allowed_count_is_the_masks_sum(view):
    while not view.run.finished:
        choice = view.choice()
        want = int(view.masks.mask(view.run.state).sum())
        assert choice.allowed_count == want, f"shown {choice.allowed_count} allowed, the mask allows {want}"
        assert f"{want:,} of 4,096" in view.readout.value
        assert all(row.allowed for row in choice.allowed_top) and len(choice.allowed_top) == min(8, want)
        view.step()


def test_a_broken_schema_is_shown_and_not_raised(view):
    view.schema.value = '{"type": "object", "properties": '
    view.compile_button.click()
    assert "JSONDecodeError" in view.error.value and view.run is None
    assert view.step_button.disabled and view.run_button.disabled
    view.step_button.click()                                   # nothing to step: no error either
    view.schema.value = json.dumps({"type": "string", "format": "email"})
    view.compile_button.click()
    assert "format" in view.error.value and "does not compile" in view.error.value
    view.schema.value = json.dumps(SCHEMA)
    view.compile_button.click()
    assert view.error.value == "" and not view.step_button.disabled


def test_a_committed_text_takes_effect_whatever_order_the_click_comes_in(view):
    """A browser may send Compile's click before the schema box's text (the box waits for an idle kernel): the click
    then compiles the old text, and the text arriving after must still win."""
    view.schema.value = json.dumps({"type": "string", "format": "email"})
    assert "does not compile" in view.error.value and view.run is None
    view.compile_button.click()                                # the stale click, after the text
    view.schema.value = json.dumps({"type": "boolean"})        # the text, after the click
    assert view.error.value == "" and "after 0 of at most" in view.readout.value
    view.run_to_end()
    assert view.run.text in ("true", "false"), view.run.text
    view.prompt.value = "Answer: "
    assert view.run.tokens == [] and "Answer: " in view.readout.value


def test_an_empty_prompt_is_shown_and_not_raised(view):
    view.prompt.value = ""
    view.reset_button.click()
    assert "prompt" in view.error.value and view.run is None and view.step_button.disabled
    view.prompt.value = "Settings: "
    view.reset_button.click()
    assert view.error.value == "" and view.run.tokens == [] and not view.step_button.disabled


def test_reset_returns_to_the_start(view):
    for _ in range(4):
        view.step()
    first = list(view.run.tokens)
    view.reset_button.click()
    assert view.run.tokens == [] and view.run.state == view.grammar.start_state()
    assert "after 0 of at most" in view.readout.value
    for _ in range(4):
        view.step()
    assert view.run.tokens == first, "greedy decoding after Reset should take the same tokens"


def test_sampling_is_seeded_and_stays_in_the_language(view):
    view.seed.value = 3
    view.sample.value = True                                   # starts over, sampling
    view.run_to_end()
    first = view.run.text
    view.reset()
    view.run_to_end()
    assert view.run.text == first and view.grammar.matches(first), first


def test_next_choice_renormalises_over_the_allowed_tokens(enc):
    logits = torch.full((4096,), -30.0)
    logits[[10, 11, 12]] = torch.tensor([2.0, 1.0, 0.0])
    allowed = torch.zeros(4096, dtype=torch.bool)
    allowed[[11, 12]] = True
    choice = next_choice(logits, allowed, enc, top=2)
    p = torch.softmax(logits, -1)
    assert [r.token for r in choice.model_top] == [10, 11] and [r.allowed for r in choice.model_top] == [False, True]
    assert [r.token for r in choice.allowed_top] == [11, 12]
    assert sum(r.p_renormalised for r in choice.allowed_top) == pytest.approx(1.0)
    assert choice.removed_mass == pytest.approx(float(1 - p[11] - p[12]), abs=1e-6)
    assert choice.allowed_count == 2 and choice.model_top[0].label == enc.decode([10])
