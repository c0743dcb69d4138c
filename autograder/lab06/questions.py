"""Lab 06, interview questions."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer
from minigpt.teaching.speculative_calculator import break_even_alpha, break_even_batch, expected_tokens_per_round


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

Q1_P = [0.5, 0.3, 0.2, 0.0]
Q1_Q = [0.1, 0.6, 0.2, 0.1]


def check_q1_acceptance(answer: Any) -> None:
    """p = Q1_P, q = Q1_Q: probability that the drafted token is accepted."""
    expected = sum(min(a, b) for a, b in zip(Q1_P, Q1_Q))
    check_answer(answer, expected, "Q1 (acceptance probability)",
                 {1.0: "E_q[p/q] without the clip is always 1; the acceptance probability of token x is min(1, p(x)/q(x)).",
                  sum(min(1, a / b) for a, b in zip(Q1_P, Q1_Q)) / 4: "that is the plain average of min(1, p/q) over the "
                                                                     "tokens; weight each token by q(x), the chance it is drafted.",
                  sum(max(0.0, a - b) for a, b in zip(Q1_P, Q1_Q)): "that is the rejection probability sum max(0, p - q)."},
                 unit="probability", rel=1e-6,
                 hint="P(accept) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)).")


def check_q2_tokens_per_round(answer: Any) -> None:
    """alpha = 0.8, k = 4: expected tokens per round."""
    a, k = 0.8, 4
    check_answer(answer, expected_tokens_per_round(a, k), "Q2 (expected tokens per round)",
                 {expected_tokens_per_round(a, k) - 1: "that counts the accepted drafts only; every round also emits the "
                                                       "resampled or bonus token.",
                  expected_tokens_per_round(a, k - 1): "off by one: sum a^i for i = 0..k has k + 1 terms.",
                  a * k + 1: "the drafts are accepted only while no earlier one was rejected: not a * k."},
                 unit="tokens", rel=1e-4, hint="E = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a).")


Q3 = {"k": 3, "target_step_ms": 10.0, "draft_step_ms": 2.0, "verify_ms": 12.0}


def check_q3_break_even_alpha(answer: Any) -> None:
    """k = 3, target decode step 10 ms, draft step 2 ms, target verify of 4 positions 12 ms: the acceptance rate
    below which speculation is slower than plain decoding."""
    expected = break_even_alpha(Q3["k"], target_step_s=Q3["target_step_ms"], draft_step_s=Q3["draft_step_ms"],
                                verify_s=Q3["verify_ms"])
    check_answer(answer, expected, "Q3 (break-even acceptance rate)",
                 {break_even_alpha(3, target_step_s=10.0, draft_step_s=0.0, verify_s=12.0):
                      "you left out the 3 draft steps of each round.",
                  break_even_alpha(3, target_step_s=10.0, draft_step_s=2.0, verify_s=10.0):
                      "the verify pass costs 12 ms here, not one decode step."},
                 unit="probability", rel=2e-3,
                 hint="Speculation pays when E[tokens/round] * t_target > k t_draft + t_verify; solve "
                      "(1 - a^(k+1)) / (1 - a) = (k t_draft + t_verify) / t_target for a (bisection is fine).")


Q4 = {"alpha": 0.8, "k": 4, "memory_ms": 10.0, "per_token_ms": 0.05}


def check_q4_break_even_batch(answer: Any) -> None:
    """Roofline step time t(n) = max(10 ms, n * 0.05 ms) for n token positions; prompt lookup (free drafts),
    alpha = 0.8, k = 4: the smallest batch at which speculation is slower than plain decoding."""
    expected = break_even_batch(Q4["alpha"], Q4["k"], memory_s=Q4["memory_ms"], per_token_s=Q4["per_token_ms"])
    check_answer(answer, expected, "Q4 (break-even batch size)",
                 {200: "that is where plain decode becomes compute-bound; speculation already lost before, once the "
                       "verify pass over B (k + 1) positions costs more than E plain steps.",
                  40: "that is where the verify pass of B (k + 1) positions leaves the memory-bound regime; the speedup "
                      "is still E there, it drops below 1 later.",
                  expected - 1: "off by one: at that batch the speedup is still >= 1; give the first batch where it is < 1."},
                 unit="sequences",
                 hint="speedup(B) = E * t(B) / t(B (k + 1)); find the first integer B with speedup < 1.")
