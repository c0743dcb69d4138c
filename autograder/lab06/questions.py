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


Q2 = {"alpha": 0.8, "draft_cost": 0.2, "verify_slope": 0.1, "ks": range(1, 9)}


def _q2_best(tokens_per_round: Any, draft_cost: float, verify_slope: float) -> int:
    """The k in Q2["ks"] that maximises tokens_per_round(k) / (k * draft_cost + 1 + verify_slope * k)."""
    return max(Q2["ks"], key=lambda k: tokens_per_round(k) / (k * draft_cost + 1 + verify_slope * k))


def q2_best_k() -> int:
    a = Q2["alpha"]
    return _q2_best(lambda k: expected_tokens_per_round(a, k), Q2["draft_cost"], Q2["verify_slope"])


def check_q2_best_k(answer: Any) -> None:
    """alpha = 0.8, a draft step costs 0.2 target steps, the target's forward over k + 1 positions costs 1 + 0.1 k target
    steps: the k in 1..8 with the highest speedup. Each wrong pick below is what one mistake in the cost model gives
    (asserted distinct in tests/labs/test_lab06_checks.py)."""
    a, c, s = Q2["alpha"], Q2["draft_cost"], Q2["verify_slope"]
    mistakes = {
        _q2_best(lambda k: expected_tokens_per_round(a, k), 0.0, s):
            "that k ignores the draft's cost: every drafted token costs a draft step (0.2 target steps), whether it is "
            "accepted or not.",
        _q2_best(lambda k: expected_tokens_per_round(a, k), c, 0.0):
            "that k treats the verify pass as free of k: here it costs 1 + 0.1 k target steps.",
        _q2_best(lambda k: expected_tokens_per_round(a, k) - 1, c, s):
            "that k counts the accepted drafts only; every round also emits the resampled or bonus token.",
        max(Q2["ks"]):
            "the largest k maximises tokens per round (or a linear 1 + a k), not tokens per second: the drafts are accepted "
            "only while no earlier one was rejected, so E = sum a^i saturates while the round's cost keeps growing.",
    }
    check_answer(answer, q2_best_k(), "Q2 (the best k)", mistakes, unit="drafted tokens per round",
                 hint="speedup(k) = E(a, k) / (k c + 1 + 0.1 k) with E = (1 - a^(k+1)) / (1 - a); evaluate k = 1..8 and "
                      "take the largest.")


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
