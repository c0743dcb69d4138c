"""Lab 06, interview questions. Every key is computed here from first principles, not with
minigpt.costmodel.speculative_calculator (which the notebook imports: a learner could call it)."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer


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


# Q2: acceptance that decays with the draft position (a draft model drifts from the target as it runs ahead).
Q2 = {"first_alpha": 0.9, "decay": 0.85, "draft_cost": 0.15, "verify_slope": 0.02, "ks": range(1, 9)}


def q2_alphas(k: int) -> list[float]:
    """The conditional acceptance of drafts 1..k: alpha_i = 0.9 * 0.85^(i-1) (given drafts 1..i-1 accepted)."""
    return [Q2["first_alpha"] * Q2["decay"] ** i for i in range(k)]


def _tokens_chained(alphas: list[float]) -> float:
    """1 + sum_j prod_{i<=j} alpha_i: the resampled or bonus token plus the expected run of leading accepted drafts."""
    total, run = 1.0, 1.0
    for a in alphas:
        run *= a
        total += run
    return total


def _constant_tokens(alpha: float, k: int) -> float:
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _q2_best(tokens_per_round: Any, draft_cost: float, verify_slope: float) -> int:
    """The k in Q2["ks"] that maximises tokens_per_round(k) / (k * draft_cost + 1 + verify_slope * k)."""
    return max(Q2["ks"], key=lambda k: tokens_per_round(k) / (k * draft_cost + 1 + verify_slope * k))


def q2_best_k() -> int:
    return _q2_best(lambda k: _tokens_chained(q2_alphas(k)), Q2["draft_cost"], Q2["verify_slope"])


def q2_mistakes() -> dict[int, str]:
    """Each wrong pick one mistake in the model gives, those equal to the key left out and those that coincide merged
    (asserted distinct from the key in tests/labs/test_lab06_checks.py)."""
    c, s = Q2["draft_cost"], Q2["verify_slope"]
    chained = lambda k: _tokens_chained(q2_alphas(k))
    candidates = [
        (_q2_best(lambda k: _constant_tokens(Q2["first_alpha"], k), c, s),
         "that k treats every draft as accepted with 0.9 (the constant-alpha formula, or calc.best_k with alpha 0.9); "
         "here draft i is accepted with 0.9 * 0.85^(i-1), so the later drafts are worth much less."),
        (_q2_best(lambda k: 1 + sum(q2_alphas(k)), c, s),
         "that k adds the alpha_i as if each draft counted on its own; a draft is kept only if every earlier one was, "
         "so the j-th term is the product alpha_1 ... alpha_j."),
        (_q2_best(chained, 0.0, s),
         "that k ignores the draft's cost: every drafted token costs a draft step (0.15 target steps), accepted or not."),
        (_q2_best(chained, c, 0.0),
         "that k treats the verify pass as free of k: here it costs 1 + 0.02 k target steps."),
        (_q2_best(lambda k: chained(k) - 1, c, s),
         "that k counts the accepted drafts only; every round also emits the resampled or bonus token."),
    ]
    key, out = q2_best_k(), {}
    for wrong, why in candidates:
        if wrong != key:
            out[wrong] = f"{out[wrong]} Or: {why}" if wrong in out else why
    return out


def check_q2_best_k(answer: Any) -> None:
    """Draft i of a round is accepted (given drafts 1..i-1 were) with probability alpha_i = 0.9 * 0.85^(i-1); a draft
    step costs 0.15 target steps, the target's forward over k + 1 positions 1 + 0.02 k target steps: the k in 1..8 with
    the most tokens per second. The key is computed here from E(k) = 1 + sum_j prod_{i<=j} alpha_i; each wrong pick is
    what one mistake in the model gives (q2_mistakes)."""
    check_answer(answer, q2_best_k(), "Q2 (the best k when acceptance decays with the position)", q2_mistakes(),
                 unit="drafted tokens per round",
                 hint="E(k) = 1 + a1 + a1 a2 + ... + a1 a2 ... ak with a_i = 0.9 * 0.85^(i-1); speedup(k) = E(k) / "
                      "(0.15 k + 1 + 0.02 k); evaluate k = 1..8 and take the largest.")


# Q3: from what an engine logs (mean acceptance length at one k) to a prediction at another k.
Q3 = {"k_logged": 3, "mean_length": 2.8, "k_new": 5, "draft_cost": 0.05, "verify_slope": 0.04}


def _alpha_from_length(mean_length: float, k: int) -> float:
    """The constant alpha with (1 - alpha^(k+1)) / (1 - alpha) = mean_length, by bisection (E grows with alpha)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if _constant_tokens(mid, k) < mean_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _q3_speedup(alpha: float, k: int, draft_cost: float = Q3["draft_cost"]) -> float:
    return _constant_tokens(alpha, k) / (k * draft_cost + 1 + Q3["verify_slope"] * k)


def q3_speedup() -> float:
    return _q3_speedup(_alpha_from_length(Q3["mean_length"], Q3["k_logged"]), Q3["k_new"])


def check_q3_speedup_from_logs(answer: Any) -> None:
    """An engine running k = 3 logs a mean acceptance length of 2.8 tokens per round (the resampled or bonus token
    included). With a constant, independent alpha, a draft step of 0.05 target steps and a verify pass over k + 1
    positions of 1 + 0.04 k target steps: the predicted speedup at k = 5. The key inverts E(alpha, 3) = 2.8 by
    bisection, then prices k = 5."""
    L, k0, k1 = Q3["mean_length"], Q3["k_logged"], Q3["k_new"]
    alpha = _alpha_from_length(L, k0)
    check_answer(answer, q3_speedup(), "Q3 (speedup at k = 5 predicted from the logs at k = 3)",
                 [(_q3_speedup((L - 1) / k0, k1),
                   "(2.8 - 1) / 3 = 0.6 is accepted drafts per drafted token, not alpha: a draft after a rejection is "
                   "never tested, so that ratio sits below alpha. Recover alpha from E(alpha, 3) = 2.8."),
                  (_q3_speedup(L / k0, k1), "2.8 / 3 is not alpha either: solve (1 - a^4) / (1 - a) = 2.8 for a."),
                  (_q3_speedup(_alpha_from_length(L + 1, k0), k1),
                   "the 2.8 tokens already include the resampled or bonus token: E(alpha, 3) = 2.8, not 3.8."),
                  (_q3_speedup(alpha, k0), "that is the speedup at k = 3; the question asks for k = 5."),
                  (_q3_speedup(alpha, k1, draft_cost=0.0), "left out the 5 draft steps (0.05 target steps each)."),
                  (_constant_tokens(alpha, k1), "that is tokens per round at k = 5; divide by the round's cost in "
                                                "target steps (5 * 0.05 + 1 + 0.04 * 5).")],
                 unit="x (a ratio)", rel=2e-3,
                 hint="First alpha: solve (1 - a^4) / (1 - a) = 2.8 (bisection). Then speedup = E(a, 5) / (5 * 0.05 + "
                      "1 + 0.04 * 5).")


# Q4: a step time that adds the weight reads and the per-token work (not a max), and a draft that costs a share of it.
Q4 = {"alpha": 0.75, "k": 3, "fixed_ms": 10.0, "per_token_ms": 0.04, "draft_fraction": 0.1}


def _q4_first_losing_batch(tokens: float, step: Any, draft: Any, verify: Any) -> int:
    """The smallest B with tokens * step(B) / (k * draft(B) + verify(B)) < 1."""
    return next(b for b in range(1, 1 << 20) if tokens * step(b) / (Q4["k"] * draft(b) + verify(b)) < 1.0)


def q4_break_even_batch() -> int:
    k, f = Q4["k"], Q4["draft_fraction"]
    t = lambda n: Q4["fixed_ms"] + Q4["per_token_ms"] * n
    return _q4_first_losing_batch(_constant_tokens(Q4["alpha"], k), t, lambda b: f * t(b), lambda b: t(b * (k + 1)))


def check_q4_break_even_batch(answer: Any) -> None:
    """A target forward over n token positions takes t(n) = 10 ms + 0.04 ms * n (weights read once, plus per-token
    work); the draft model's step over a batch costs 0.1 t(B); alpha = 0.75, k = 3. A round over B sequences costs
    3 draft steps and t(B (k + 1)) and emits E(0.75, 3) tokens per sequence; a plain step costs t(B). The smallest B at
    which speculation is slower than plain decoding. The key scans B from 1 here."""
    k, f, a = Q4["k"], Q4["draft_fraction"], Q4["alpha"]
    fixed, per = Q4["fixed_ms"], Q4["per_token_ms"]
    t = lambda n: fixed + per * n
    roof = lambda n: max(fixed, per * n)
    e = _constant_tokens(a, k)
    expected = q4_break_even_batch()
    check_answer(answer, expected, "Q4 (break-even batch size)",
                 {_q4_first_losing_batch(e, roof, lambda b: f * roof(b), lambda b: roof(b * (k + 1))):
                      "that is the max() roofline (calc.break_even_batch); here the step ADDS the weight reads and the "
                      "per-token work, t(n) = 10 + 0.04 n ms, so the extra positions cost time from the first one on.",
                  _q4_first_losing_batch(e, t, lambda b: 0.0, lambda b: t(b * (k + 1))):
                      "you left out the 3 draft steps per round (0.1 t(B) each).",
                  _q4_first_losing_batch(e, t, lambda b: f * t(b), lambda b: b * t(k + 1)):
                      "the verify pass is one forward over all B (k + 1) positions, t(B (k + 1)), not B separate "
                      "forwards of k + 1: the weights are read once per step.",
                  _q4_first_losing_batch(e - 1, t, lambda b: f * t(b), lambda b: t(b * (k + 1))):
                      "a round also emits the resampled or bonus token: E = 1 + a + a^2 + a^3.",
                  expected - 1: "off by one: at that batch the speedup is still >= 1; give the first batch where it is < 1."},
                 unit="sequences",
                 hint="speedup(B) = E * t(B) / (3 * 0.1 t(B) + t(4B)) with t(n) = 10 + 0.04 n; find the first integer B "
                      "with speedup < 1 (the inequality is linear in B).")


# Q5: four draft nodes spent as a chain or as a tree (greedy verification, a head whose k-th likeliest token is the
# target's argmax with a fixed probability at every level, independently).
Q5 = {"top1": 0.6, "top2": 0.2}


def _chain_tokens(top1: float, depth: int) -> float:
    """Expected tokens a round emits with a greedy chain of `depth` drafts: 1 + sum_i top1^i."""
    return 1 + sum(top1 ** i for i in range(1, depth + 1))


def _forked_tokens(top1: float, top2: float) -> float:
    """Root with its two likeliest tokens as children, each child with its own likeliest token below it."""
    return 1 + (top1 + top2) + (top1 + top2) * top1


def q5_best_tokens() -> float:
    return max(_chain_tokens(Q5["top1"], 4), _forked_tokens(Q5["top1"], Q5["top2"]))


def check_q5_chain_or_tree(answer: Any) -> None:
    """The expected tokens per round of the better use of four draft nodes."""
    t1, t2 = Q5["top1"], Q5["top2"]
    check_answer(answer, q5_best_tokens(), "Q5 (four draft nodes: chain or tree)",
                 {_forked_tokens(t1, t2): "that is the forked tree's; compare it with the chain of four: on these numbers "
                                          "the chain's deeper levels are worth more than the second branch.",
                  _chain_tokens(t1, 2): "that is a chain of two drafts; the chain of four uses all four nodes.",
                  _chain_tokens(t1, 4) - 1: "count the token every round emits after the last accepted draft (+1).",
                  1 + (t1 + t2) + (t1 + t2) ** 2: "a child's own child is its likeliest token only: the level below a "
                                                  "fork accepts with top1, not top1 + top2."},
                 unit="tokens per round", rel=1e-6,
                 hint="Expected tokens = 1 + sum over depths of P(the walk reaches that depth); a level with the top two "
                      "tokens as siblings is passed with probability top1 + top2.")


# Q6: an EAGLE-3-style head for Llama 3.1 8B, with an LM head of its own over a 32,000-token draft vocabulary: what one
# head step reads, as a share of what a target decode step reads.
Q6 = {"d": 4096, "d_ff": 14336, "layers": 32, "kv_dim": 1024, "vocab": 128_256, "draft_vocab": 32_000}


def _layer_params(d: int, d_ff: int, kv_dim: int) -> int:
    return 2 * d * d + 2 * d * kv_dim + 3 * d * d_ff        # wq, wo; wk, wv; gate, up, down


def _q6_parts() -> tuple[int, int, int, int, int]:
    d, ff, kv, L = Q6["d"], Q6["d_ff"], Q6["kv_dim"], Q6["layers"]
    return d, _layer_params(d, ff, kv), L, Q6["vocab"], Q6["draft_vocab"]


def q6_head_share() -> float:
    d, layer, L, V, Vd = _q6_parts()
    return (2 * d * d + layer + d * Vd) / (L * layer + d * V)   # fc, one layer, its own LM head / layers and LM head


def check_q6_head_share(answer: Any) -> None:
    d, layer, L, V, Vd = _q6_parts()
    target = L * layer + d * V
    check_answer(answer, q6_head_share(), "Q6 (a head step's share of a target step)",
                 {(2 * d * d + layer + d * V) / target: "that is a head reading the target's LM head (128,256 rows, as "
                                                        "this lab's does); this head has its own over 32,000 tokens.",
                  (2 * d * d + layer) / target: "the head's LM head is read at every step too: d x 32,000 weights.",
                  (layer + d * Vd) / target: "the head's first matrix, [feature ; embedding] (2d) -> d, is read too.",
                  (2 * d * d + layer + d * Vd) / (target + d * V): "a decode step reads one row of the embedding "
                                                                    "table, not all of it.",
                  (2 * d * d + layer + d * Vd) / (L * layer): "the target's step reads its LM head too.",
                  1 / L: "one layer of 32 is not the share: the LM heads weigh in both steps."},
                 unit="fraction of a target step", rel=1e-7,
                 hint="Count what each step reads, in parameters: the head's input matrix, its layer and its own LM "
                      "head, against the target's 32 layers and its LM head.")
