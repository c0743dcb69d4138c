"""Lab 06, exercises 5 and 6: prompt lookup (ngram_propose) and the acceptance statistics."""

from __future__ import annotations

from typing import Callable

import torch

from autograder.harness import call_learner, check_answer
from autograder.lab06.common import _watched
from autograder.checking.reference_guard import own_work
from minigpt.engine.ngram_draft import ngram_propose
from minigpt.costmodel.speculative_calculator import acceptance_rate, expected_tokens_per_round


# ---------------------------------------------------------------------------------------------------
# Exercise 5: prompt lookup
# ---------------------------------------------------------------------------------------------------

_NGRAM_CASES: list[tuple[list[int], int, int, str]] = [
    ([1, 2, 3, 4, 1, 2], 2, 3, "the last 2 tokens [1, 2] occurred at the start, followed by 3, 4"),
    ([7, 1, 2, 9, 1, 2, 5, 5, 1, 2], 3, 3, "[1, 2] occurs twice earlier: copy after the MOST RECENT one"),
    ([4, 5, 6, 8, 5, 6, 7, 9, 4, 5, 6], 3, 3, "the longest match wins: [4, 5, 6] (n = 3) over [5, 6] (n = 2)"),
    ([1, 2, 3], 4, 3, "no earlier occurrence of any suffix: no proposal"),
    ([3, 3, 3, 3], 4, 3, "repeats: the continuation may overlap the suffix"),
    ([9, 8, 7, 1, 8, 7], 5, 3, "copy at most what follows, here 2 tokens, even if k is larger"),
    ([5, 1, 5], 2, 3, "a single-token match (n = 1)"),
    ([4, 4], 2, 1, "the shortest context with a match: its last token occurred just before it (n = 1)"),
    ([1, 2, 3, 9, 7, 2, 3, 5, 1, 2, 3], 2, 2, "max_n = 2 bounds the suffix: [2, 3], not the older [1, 2, 3]"),
    ([1, 2, 1, 2, 1, 2], 0, 3, "k = 0: nothing to propose"),
    ([1, 2, 1, 2, 1, 2], 1, 3, "k = 1: one token"),
]


def check_ngram_propose(propose_fn: Callable) -> None:
    """propose_fn(context, k, max_n=3) -> up to k tokens that followed the most recent earlier occurrence of the
    longest suffix (n = max_n down to 1) of the context."""
    what = "Exercise 5 (ngram_propose)"
    own_work(propose_fn, ngram_propose, what=what)
    propose_fn = _watched(propose_fn, (ngram_propose,), what)
    for context, k, max_n, why in _NGRAM_CASES:
        got = call_learner(f"ngram_propose({context}, k={k}, max_n={max_n})", propose_fn, list(context), k, max_n)
        want = ngram_propose(context, k, max_n)
        got = [int(t) for t in got] if got is not None else got
        if got != want:
            raise AssertionError(f"ngram_propose({context}, k={k}, max_n={max_n}) should return {want} ({why}), got {got}")


# ---------------------------------------------------------------------------------------------------
# Exercise 6: acceptance statistics
# ---------------------------------------------------------------------------------------------------

def check_acceptance_stats(rate_fn: Callable, tokens_fn: Callable) -> None:
    """rate_fn(p, q) -> (...) acceptance probability sum_x min(p, q); tokens_fn(alpha, k) -> (1 - a^(k+1)) / (1 - a)."""
    what = "Exercise 6 (acceptance_rate, expected_tokens_per_round)"
    own_work(rate_fn, acceptance_rate, what=what)
    own_work(tokens_fn, expected_tokens_per_round, what=what)
    rate_fn = _watched(rate_fn, (acceptance_rate, expected_tokens_per_round), what)
    tokens_fn = _watched(tokens_fn, (acceptance_rate, expected_tokens_per_round), what)
    g = torch.Generator().manual_seed(9)
    p = torch.softmax(torch.randn(5, 11, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(5, 11, generator=g) * 2, -1)
    got = call_learner("acceptance_rate(p, q)", rate_fn, p.clone(), q.clone())
    want = acceptance_rate(p, q)
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"acceptance_rate on 5 random (p, q) pairs over 11 tokens must return a tensor of shape "
                             f"{tuple(want.shape)}, got {type(got).__name__}")
    got_t = got.float()
    if got_t.shape != want.shape or not torch.allclose(got_t, want, atol=1e-5):
        hint = ""
        if got_t.shape == want.shape and torch.allclose(got_t, torch.ones_like(want), atol=1e-4):
            hint = " You get 1: that is E_q[p/q] without the clip; the acceptance probability is E_q[min(1, p/q)]."
        raise AssertionError(f"acceptance_rate on 5 random (p, q) pairs over 11 tokens: expected {want.tolist()}, got "
                             f"{got_t.tolist() if got_t.numel() < 20 else got_t.shape}.{hint}")
    p3, q3 = (torch.softmax(torch.randn(2, 3, 11, generator=g) * 2, -1) for _ in range(2))
    got = call_learner("acceptance_rate(p, q) of shape (2, 3, 11)", rate_fn, p3.clone(), q3.clone())
    if not isinstance(got, torch.Tensor) or got.shape != (2, 3) or not torch.allclose(got, acceptance_rate(p3, q3),
                                                                                       atol=1e-5):
        raise AssertionError("acceptance_rate on p, q of shape (2, 3, 11) must sum over the LAST axis (the vocabulary) "
                             f"and return shape (2, 3), got {getattr(got, 'shape', type(got).__name__)}")
    for alpha, k in [(0.0, 3), (0.5, 1), (0.62, 3), (0.8, 4), (0.95, 8), (1.0, 5)]:
        got = call_learner(f"expected_tokens_per_round({alpha}, {k})", tokens_fn, alpha, k)
        check_answer(got, expected_tokens_per_round(alpha, k), f"expected_tokens_per_round({alpha}, {k})",
                     {expected_tokens_per_round(alpha, k) - 1: "that is the accepted drafts only; a round also emits one "
                                                              "token of its own (resampled or bonus).",
                      expected_tokens_per_round(alpha, k - 1) if k else -1: "off by one: the sum runs over i = 0..k "
                                                                           "(k + 1 terms)."},
                     unit="tokens", rel=1e-6, reveal=True,
                     hint="A round emits 1 + (number of leading accepted drafts): sum_{i=0..k} a^i; at a = 1 that is k + 1.")
