"""The player's readouts are pure functions of the rounds: tested without a browser."""

from __future__ import annotations

import copy

import pytest
import torch

from minigpt.engine.speculative import Round, generate_speculative
from minigpt.sampling import SamplingParams
from minigpt.teaching.speculative_player import SpeculativePlayer, round_html, round_rows, running_stats


def _decode(ids):
    return "".join(f"<{i}>" for i in ids)


ROUNDS = [Round([1, 2, 3], [1, 9], [0.5, 0.1, 0.2], [0.4, 0.3, 0.2], [1.0, 1 / 3, 1.0], 0.7),
          Round([4, 5], [4, 5, 6], [0.9, 0.8], [0.9, 0.4], [1.0, 1.0], 0.6)]


def test_round_rows_status():
    rows = round_rows(ROUNDS[0], _decode)
    assert [r["status"] for r in rows] == ["accepted", "rejected", "not checked", "resampled"]
    assert rows[1]["accept"] == pytest.approx(1 / 3) and rows[-1]["token"] == "<9>"
    assert [r["status"] for r in round_rows(ROUNDS[1], _decode)] == ["accepted", "accepted", "bonus"]


def test_running_stats():
    s = running_stats(ROUNDS, 2, target_step_s=1.0, draft_step_s=0.25, verify_s=lambda k: 1.0 + 0.1 * k)
    assert (s.rounds, s.tokens, s.drafted, s.accepted) == (2, 5, 5, 3)
    assert s.alpha == pytest.approx(3 / 4) and s.tokens_per_round == 2.5
    assert s.predicted_speedup == pytest.approx(5 / (3 * 0.25 + 1.3 + 2 * 0.25 + 1.2))
    with pytest.raises(ValueError):
        running_stats(ROUNDS, 3, target_step_s=1, draft_step_s=0, verify_s=lambda k: 1)
    html = round_html(1, 2, round_rows(ROUNDS[0], _decode), s, "a<b", "c")
    assert "round 1 of 2" in html and "a&lt;b" in html and "rejected" in html


def test_player_buttons_move_the_round(tiny_model):
    class Tok:
        decode = staticmethod(_decode)
    draft = copy.deepcopy(tiny_model)
    with torch.no_grad():
        draft.tok_emb.weight.add_(torch.randn(draft.tok_emb.weight.shape, generator=torch.Generator().manual_seed(0)) * 0.05)
    p = SpeculativePlayer(tiny_model, draft, [1, 2, 3], Tok(), k=3, max_new_tokens=12,
                          sampling=SamplingParams(temperature=1.0, seed=0))
    assert "round 1 of" in p.readout.value
    if len(p.rounds) > 1:
        p.next.click()
        assert p.slider.value == 2 and "round 2 of" in p.readout.value
    p.prev.click()
    p.prev.click()
    assert p.slider.value == 1
    want = generate_speculative(tiny_model, draft, [1, 2, 3], 12, SamplingParams(temperature=1.0, seed=0), k=3,
                                stop_token_ids=())
    assert p.gen.tokens == want.tokens
