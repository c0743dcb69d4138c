"""The shipped checkpoints: they load, reproduce their cards, and are good enough for the labs."""

import pytest
import torch

from minigpt.checkpoint import load_card, load_model
from minigpt.training.evaluate import greedy_agreement, validation_loss
from minigpt.generate import generate_naive
from minigpt.sampling import SamplingParams
from minigpt.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target():
    return load_model("target")


@pytest.fixture(scope="module")
def draft():
    return load_model("draft")


@pytest.mark.parametrize("name", ["target", "draft"])
def test_validation_perplexity_matches_the_card(name, target, draft):
    model = {"target": target, "draft": draft}[name]
    card = load_card(name)
    with torch.no_grad():
        measured = validation_loss(model)
    assert measured["tokens"] == card["validation"]["tokens"]
    assert measured["perplexity"] == pytest.approx(card["validation"]["perplexity"], rel=1e-3)


def test_target_is_clearly_better_than_draft():
    target_ppl = load_card("target")["validation"]["perplexity"]
    draft_ppl = load_card("draft")["validation"]["perplexity"]
    assert target_ppl < 0.9 * draft_ppl, f"target perplexity {target_ppl:.2f} is not clearly below draft's {draft_ppl:.2f}"


def test_draft_agrees_with_target_often_enough(target, draft):
    """Speculative decoding (a later lab) needs greedy agreement of at least 0.6."""
    agreement = greedy_agreement(draft, target, max_windows=32)
    assert agreement >= 0.6, f"draft/target greedy agreement {agreement:.3f} < 0.6"
    assert agreement == pytest.approx(load_card("draft")["greedy_agreement_with_target"], abs=0.03)


def test_samples_look_like_python(target):
    enc = load_tokenizer()
    prompt = enc.encode("import os\n\n\ndef ")
    text = enc.decode(generate_naive(target, prompt, 60, SamplingParams(temperature=0.8, top_k=50, seed=0)).tokens)
    assert "(" in text and ":" in text, f"a sample should contain Python syntax, got {text!r}"
    greedy = enc.decode(generate_naive(target, enc.encode("class Foo:\n    def __init__(self"), 20).tokens)
    assert greedy.startswith((")", ",", ":", "):")), f"greedy continuation of a signature looks wrong: {greedy!r}"


def test_checkpoints_load_and_run_on_cpu_in_every_dtype():
    tokens = torch.tensor([[1, 2, 3]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.isfinite(load_model("draft", dtype=dtype)(tokens).float()).all()
