"""Lab 09's retrieval view without a browser: synthetic grids (seeded), the readout's numbers, the controls set in
Python, and the errors for grids that cannot be shown."""

from __future__ import annotations

import copy
import random
import re

import pytest

from minigpt.teaching.retrieval_view import RetrievalView, accuracy_by_length, grids_by_policy, readout_table

LENGTHS = [512, 1024, 2048, 4096]
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
EDGES = [0, 512, 1024, 2048, 4095]


def make_grid(policy: str, drop: float, growth: float, seed: int) -> dict:
    """A RetrievalGrid.__dict__: retrieval falls by `drop` per length past the first, perplexity grows by `growth`
    per band, plus seeded noise."""
    rng = random.Random(seed)
    accuracy = [[min(1.0, max(0.0, 1 - drop * i + rng.uniform(-0.05, 0.05))) for _ in DEPTHS]
                for i in range(len(LENGTHS))]
    return {"policy": policy, "kind": "passkey", "lengths": list(LENGTHS), "depths": list(DEPTHS),
            "accuracy": accuracy, "band_edges": list(EDGES),
            "band_perplexity": [20.0 * growth ** i + rng.random() for i in range(len(EDGES) - 1)], "seconds": 1.5}


@pytest.fixture
def grids() -> list[dict]:
    return [make_grid("none", 0.33, 3.0, 0), make_grid("yarn", 0.1, 1.2, 1), make_grid("window 128", 0.3, 1.0, 2)]


def test_accuracy_by_length_is_the_mean_over_depths():
    grid = {"accuracy": [[1.0, 0.5, 0.0], [0.25, 0.25, 0.25]]}
    assert accuracy_by_length(grid) == pytest.approx([0.5, 0.25])


def test_readout_table_has_a_row_per_policy_and_names_the_best_past_the_trained_length(grids):
    by_name = grids_by_policy(grids)
    text = readout_table(by_name, ["none", "yarn"], trained_len=512)
    assert "class='retrieval-readout'" in text and text.count("<tr>") == 3, text
    assert "retrieval at length" in text and "<th>4,096</th>" in text and "[2,048, 4,095)" in text, text
    yarn = accuracy_by_length(by_name["yarn"])
    assert f"<td>{yarn[-1]:.0%}</td>" in text and f"<td>{by_name['none']['band_perplexity'][-1]:.1f}</td>" in text
    assert "<b>yarn</b> keeps the most retrieval" in text and "512 tokens" in text, text
    kept = sum(yarn[1:]) / 3
    assert f"{kept:.0%} of needles found" in text, text


def test_readout_table_says_when_nothing_was_measured_past_the_trained_length(grids):
    text = readout_table(grids_by_policy(grids), ["none"], trained_len=4096)
    assert "no measured length is past the trained context (4,096 tokens)" in text, text


def test_readout_table_names_every_policy_that_ties():
    a, b = make_grid("a", 0.0, 1.0, 0), make_grid("b", 0.0, 1.0, 1)
    for grid in (a, b):
        grid["accuracy"] = [[1.0] * len(DEPTHS)] * len(LENGTHS)
    text = readout_table(grids_by_policy([a, b]), ["a", "b"], 512)
    assert "<b>a</b> and <b>b</b> tie for the most retrieval: 100%" in text, text


def test_the_view_starts_on_the_chosen_policies(grids):
    view = RetrievalView(grids, policy="yarn", compare="none")
    assert view.shown() == ["yarn", "none"] and view.error.value == ""
    assert "<b>yarn</b>" in view.readout.value and "<b>none</b>" in view.readout.value
    assert view.image.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_controls_change_the_readout_and_the_figure(grids):
    view = RetrievalView(grids, trained_len=512)
    assert view.shown() == ["none"] and "<b>yarn</b>" not in view.readout.value
    text0, png0 = view.readout.value, view.image.value
    view.policy.value = "yarn"
    assert "<b>yarn</b>" in view.readout.value and "<b>none</b>" not in view.readout.value
    assert view.image.value != png0
    png1 = view.image.value
    view.compare.value = "window 128"
    assert "<b>window 128</b>" in view.readout.value and view.image.value != png1
    two = view.image.value
    view.metric.value = "perplexity"                # same readout, another figure
    assert "<b>window 128</b>" in view.readout.value and view.image.value not in (two, png1, png0)
    view.compare.value = "yarn"                     # the same policy twice is shown once
    assert view.shown() == ["yarn"]
    view.policy.value, view.compare.value, view.metric.value = "none", "(none)", "retrieval"
    assert (view.readout.value, view.image.value) == (text0, png0)


@pytest.mark.parametrize("change, message", [
    (lambda gs: gs.clear(), "no retrieval grids"),
    (lambda gs: gs[1].update(lengths=[512, 1024, 2048, 8192]), "all grids must share them"),
    (lambda gs: gs[1].update(depths=[0.0, 0.2, 0.5, 0.75, 1.0]), "all grids must share them"),
    (lambda gs: gs[1]["accuracy"].pop(), "accuracy must be 4 lengths x 5 depths"),
    (lambda gs: gs[1]["accuracy"][0].pop(), "accuracy must be 4 lengths x 5 depths"),
    (lambda gs: gs[1]["accuracy"][0].__setitem__(0, 1.5), "fractions in [0, 1]"),
    (lambda gs: gs[1]["band_perplexity"].pop(), "5 band edges need 4 band perplexities"),
    (lambda gs: gs.append(copy.deepcopy(gs[0])), "two grids for policy 'none'"),
])
def test_grids_that_cannot_be_shown_are_refused(grids, change, message):
    change(grids)
    with pytest.raises(ValueError, match=re.escape(message)):
        RetrievalView(grids)


@pytest.mark.parametrize("kwargs", [{"policy": "rope"}, {"compare": "alibi"}])
def test_an_unknown_policy_is_refused(grids, kwargs):
    with pytest.raises(ValueError, match="unknown policy .* the grids have"):
        RetrievalView(grids, **kwargs)
    with pytest.raises(ValueError, match="unknown policy 'rope'"):
        readout_table(grids_by_policy(grids), ["none", "rope"], 512)
    with pytest.raises(ValueError, match="at least one policy"):
        readout_table(grids_by_policy(grids), [], 512)
