"""Lab 06, exercise 3: the accept / resample rule (verify_draft), and its distribution test."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from autograder.harness import at_least, call_learner, quiet, within
from autograder.lab06.common import SIGNIFICANCE, VERIFY_SAMPLES, _chi2_report, _toy_tables, three_token_tests
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.engine.speculative import sampling_probs, verify_draft
from minigpt.sampling import SamplingParams
from minigpt.teaching.goodness_of_fit import ChiSquareResult, chi_square_test


# ---------------------------------------------------------------------------------------------------
# Exercise 3: the accept / resample rule
# ---------------------------------------------------------------------------------------------------

def verify_distribution_test(verify_fn: Callable, n: int = VERIFY_SAMPLES, k: int = 2, seed: int = 0
                             ) -> tuple[ChiSquareResult, ChiSquareResult, ChiSquareResult]:
    """Emulate speculative sampling on the bigram toy with verify_fn as the accept/resample rule, n times, and
    test the first emitted token, the first two, and the second and third (the first round's bonus token when
    both drafts are accepted) against the target's exact distribution."""
    t_table, d_table = _toy_tables(seed)
    s = SamplingParams(temperature=1.0)
    P, Q = sampling_probs(t_table, s), sampling_probs(d_table, s)
    g = torch.Generator().manual_seed(1000 + seed)
    contexts = []
    for _ in range(n):
        context = [2]
        while len(context) < 4:
            last = context[-1]
            drafted, q_rows = [], []
            for _ in range(k):
                q = Q[last]
                t = int(torch.multinomial(q, 1, generator=g))
                drafted.append(t)
                q_rows.append(q)
                last = t
            p = P[torch.tensor([context[-1]] + drafted)]          # p rows at the k + 1 positions
            out = verify_fn(list(drafted), torch.stack(q_rows), p, g)
            emitted = _token_ids(out[0] if isinstance(out, tuple) else out, "verify_draft")
            if not 1 <= len(emitted) <= k + 1:
                raise AssertionError(f"verify_draft returned {len(emitted)} tokens for {k} drafts; it must return the "
                                     f"accepted drafts plus exactly one more token (1 to {k + 1} tokens)")
            context += emitted
        contexts.append(context)
    return three_token_tests(contexts, t_table, s)


def check_verify_draft(verify_fn: Callable) -> None:
    """verify_fn(draft_tokens (k ints), q (k, V), p (k + 1, V), generator) -> (emitted tokens, accept_probs (k,))."""
    what = "Exercise 3 (verify_draft)"
    own_work(verify_fn, verify_draft, what=what)
    with no_calls_into(verify_draft, what=what):
        _check_verify_draft(verify_fn)


def _residual_hint(err: BaseException) -> str | None:
    """torch's multinomial error on a negative or zero-sum row, as the mistake that causes it here."""
    text = str(err)
    if "probability tensor contains" in text or "invalid multinomial distribution" in text:
        return ("verify_draft drew from a row that is not a distribution (torch: " + text.splitlines()[0][:120] + "). "
                "At a rejection draw from the residual max(0, p - q), clipped at 0 (p - q alone has negative "
                "entries), divided by its sum; where the residual is all zeros (p - q nowhere positive once "
                "rounded), draw from p.")
    return None


def _token_ids(emitted: Any, what: str) -> list[int]:
    """The emitted tokens as ints; AssertionError naming the first that is not a token id (None, a tensor of many)."""
    try:
        items = list(emitted)
    except TypeError:
        raise AssertionError(f"{what}: the emitted tokens must be a list of token ids, got "
                             f"{type(emitted).__name__}") from None
    out = []
    for i, t in enumerate(items):
        try:
            out.append(int(t))
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"{what}: emitted token {i} is {t!r}, not a token id (an int)") from None
    return out


def _verify_call(verify_fn: Callable, what: str, *args: Any) -> Any:
    """verify_fn(*args), its errors told as the check's; the emitted tokens (out[0]) as ints."""
    out = _run_verify(verify_fn, what, *args)
    if isinstance(out, tuple) and len(out) == 2:
        return _token_ids(out[0], what), out[1]
    return out


def _run_verify(verify_fn: Callable, what: str, *args: Any) -> Any:
    try:
        with quiet():
            return verify_fn(*args)
    except NotImplementedError:
        raise AssertionError("verify_draft is not implemented yet (NotImplementedError)") from None
    except AssertionError:
        raise
    except Exception as err:
        hint = _residual_hint(err)
        if hint is None:
            raise AssertionError(f"{what} raised {type(err).__name__}: {str(err)[:300]}") from None
        raise AssertionError(f"{what}: {hint}") from None


def _check_verify_draft(verify_fn: Callable) -> None:
    g = torch.Generator().manual_seed(5)
    # 1. p == q: every draft is accepted, and a bonus token follows.
    V, k = 7, 3
    probs = torch.softmax(torch.randn(k + 1, V, generator=g), -1)
    drafted = [int(torch.multinomial(probs[i], 1, generator=g)) for i in range(k)]
    out = _verify_call(verify_fn, "verify_draft", drafted, probs[:k].clone(), probs.clone(), g)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AssertionError(f"verify_draft must return a tuple (emitted_tokens, accept_probs), got {type(out).__name__}")
    emitted, accept = out
    emitted = [int(t) for t in emitted]
    if emitted[:k] != drafted or len(emitted) != k + 1:
        raise AssertionError(f"with p == q every draft must be accepted (min(1, p/q) = 1) and a bonus token drawn from "
                             f"p[k] appended: expected {drafted} + [one token], got {emitted}."
                             + (" The bonus token is missing: when all k drafts are accepted, the target's distribution at "
                                "position k + 1 is already computed, so one more token comes for free."
                                if emitted == drafted else ""))
    accept = torch.as_tensor(accept, dtype=torch.float32)
    if accept.shape != (k,) or not torch.allclose(accept, torch.ones(k)):
        raise AssertionError(f"with p == q accept_probs should be {k} ones, got {accept.tolist()}")
    # 2. accept_probs = min(1, p/q): clipped.
    q = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    p = torch.tensor([[0.4, 0.3, 0.3], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]])
    _, accept = _verify_call(verify_fn, "verify_draft", [0, 1], q.clone(), p.clone(), torch.Generator().manual_seed(0))
    accept = torch.as_tensor(accept, dtype=torch.float32).flatten().tolist()
    want = [1.0, 1.0]
    if len(accept) != 2 or not within([abs(a - b) for a, b in zip(accept, want)], 1e-6):
        hint = ""
        if len(accept) == 2 and within(abs(accept[0] - 4.0), 1e-5):
            hint = " p/q = 0.4/0.1 = 4 is not a probability: clip it, min(1, p/q)."
        elif len(accept) == 2 and within(abs(accept[0] - 0.25), 1e-5):
            hint = " You used q/p: the ratio is target over draft, p/q."
        raise AssertionError(f"draft tokens [0, 1] with p(t)/q(t) = 0.4/0.1 and 0.6/0.25: accept_probs should be "
                             f"min(1, p/q) = {want}, got {accept}.{hint}")
    _, accept = _verify_call(verify_fn, "verify_draft", [1, 0], q.clone(), p.clone(), torch.Generator().manual_seed(0))
    accept = torch.as_tensor(accept, dtype=torch.float32).flatten().tolist()
    want = [0.5, 0.4]
    if len(accept) != 2 or not within([abs(a - b) for a, b in zip(accept, want)], 1e-6):
        raise AssertionError(f"draft tokens [1, 0] with p/q = 0.3/0.6 and 0.2/0.5: accept_probs should be {want}, got {accept}")
    # 3. Greedy: one-hot p and q.
    eye = torch.eye(5)
    out = _verify_call(verify_fn, "verify_draft", [1, 2, 3], eye[[1, 2, 3]], eye[[1, 4, 0, 0]], torch.Generator().manual_seed(0))
    if [int(t) for t in out[0]] != [1, 4]:
        raise AssertionError(f"greedy (one-hot p and q): drafts [1, 2, 3], target argmaxes [1, 4, 0, 0]: the first draft "
                             f"matches, the second does not and is replaced by the target's argmax 4, so [1, 4] is emitted; "
                             f"got {[int(t) for t in out[0]]}")
    # 3b. Residuals at the edge of float32: all zeros at a rejection (q = softmax([0, -20]) is [1.0, 2e-9], p = [1, 0]:
    # p - q is nowhere positive once rounded) falls back to p; a residual of tiny mass (5e-31 on one token) is still
    # a distribution once divided by its sum (issue 57: both survived).
    edge_cases = [
        ([1], torch.softmax(torch.tensor([0.0, -20.0]), -1), torch.tensor([[1.0, 0.0], [0.5, 0.5]]), [0],
         "q = softmax([0, -20]) (1.0 and 2e-9 in float32), p = [1, 0], draft [1]: rejected for sure, and max(0, p - q) "
         "is all zeros; draw from p then"),
        ([2], torch.softmax(torch.tensor([0.0, 0.0, -69.0, -math.inf]), -1),
         torch.stack([torch.softmax(torch.tensor([0.0, 0.0, -math.inf, -69.0]), -1), torch.full((4,), 0.25)]), [3],
         "q = softmax([0, 0, -69, -inf]), p = softmax([0, 0, -inf, -69]), draft [2]: rejected for sure, and the "
         "residual holds 5e-31 on token 3 alone; divided by its sum it draws token 3"),
    ]
    for draft, q_row, p_rows, want, case in edge_cases:
        out = _verify_call(verify_fn, "verify_draft", draft, q_row[None].clone(), p_rows.clone(),
                           torch.Generator().manual_seed(0))
        if [int(t) for t in out[0]] != want:
            raise AssertionError(f"{case}: expected {want}, got {[int(t) for t in out[0]]}")
    # 4. k = 0: one token from p[0].
    out = _verify_call(verify_fn, "verify_draft with no drafts", [], torch.zeros(0, 5), eye[[3]], torch.Generator().manual_seed(0))
    if [int(t) for t in out[0]] != [3]:
        raise AssertionError(f"with no draft tokens verify_draft should return one token drawn from p[0] (here one-hot on "
                             f"3), got {out[0]}")
    if tuple(torch.as_tensor(out[1]).shape) != (0,):
        raise AssertionError(f"with no draft tokens accept_probs has one entry per draft: shape (0,), got "
                             f"{tuple(torch.as_tensor(out[1]).shape)}")
    flat = torch.full((1, 8), 1 / 8)

    def lone(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return [int(_verify_call(verify_fn, "verify_draft with no drafts", [], torch.zeros(0, 8), flat.clone(), gen)[0][0])
                for _ in range(12)]
    if lone(11) != lone(11):            # 12 draws of 8 outcomes: a global RNG repeats with probability 8^-12
        raise AssertionError("verify_draft with no drafts, 12 times on a generator seeded 11, twice, gave different "
                             "tokens: draw every random number from the `generator` argument "
                             "(torch.multinomial(p[0], 1, generator=generator))")
    # 5. The same generator state gives the same tokens (every draw from the generator passed in): 16 rounds on one
    # generator, twice; drafts that are rejected often, a residual with 7 outcomes (a global RNG repeats by chance
    # with a probability far below 1e-6).
    p_rows = torch.full((3, 8), 1 / 8)
    q_rows = torch.tensor([[0.65] + [0.05] * 7, [0.05, 0.65] + [0.05] * 6])

    def rounds(seed: int) -> list[list[int]]:
        gen = torch.Generator().manual_seed(seed)
        return [[int(t) for t in _verify_call(verify_fn, "verify_draft", [0, 1], q_rows.clone(), p_rows.clone(), gen)[0]]
                for _ in range(16)]
    first, second = rounds(11), rounds(11)
    if first != second:
        raise AssertionError(f"verify_draft run 16 times on a generator seeded 11, twice, gave {first[:4]}... and "
                             f"{second[:4]}...: draw every random number (the acceptance test and the residual sample) "
                             "from the `generator` argument, e.g. torch.rand(1, generator=generator)")
    # 6. The distribution.
    r1, r2, r3 = call_learner("verify_draft", verify_distribution_test, _explained(verify_fn),
                              context="in the distribution test")
    for res, what in ((r1, "first emitted token"), (r2, "first two emitted tokens"),
                      (r3, "second and third emitted tokens (the third is the bonus token when both drafts are accepted)")):
        if not at_least(res.p_value, SIGNIFICANCE):
            raise AssertionError(
                f"the {what} do not follow the target's distribution ({_chi2_report(res, what)}, below the significance "
                f"{SIGNIFICANCE}). Accept t with probability min(1, p(t)/q(t)) (target over draft); at the first rejection "
                "draw from the residual max(0, p - q) normalised to sum 1 (not from p); verify draft i with p[i], the "
                "target's distribution at the SAME position; draw the bonus token from p[k], the position after the "
                "last draft.")
    # 7. One uniform per draft: two drafts each accepted with probability exactly 1/2 (p = 0.4, q = 0.8), 600 rounds:
    # both accepted 1/4 of the time, only the first 1/4, neither 1/2. One uniform shared by the round accepts the
    # second whenever it accepts the first (1/2, 0, 1/2); the distribution test above needs about 20,000 samples
    # to see that, this one is decided at once.
    _check_independent_acceptance(verify_fn)


INDEPENDENCE_ROUNDS = 600


def _check_independent_acceptance(verify_fn: Callable) -> None:
    """Rounds of two drafts accepted with probability 1/2 each: how many drafts each round accepts must follow
    (1/2, 1/4, 1/4) for (0, 1, 2), which needs a fresh uniform per draft."""
    q_rows = torch.tensor([[0.8, 0.2, 0.0, 0.0], [0.8, 0.0, 0.2, 0.0]])
    p_rows = torch.tensor([[0.4, 0.2, 0.2, 0.2], [0.4, 0.2, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]])
    gen = torch.Generator().manual_seed(23)
    counts = torch.zeros(3, dtype=torch.long)
    for _ in range(INDEPENDENCE_ROUNDS):
        emitted = [int(t) for t in _verify_call(verify_fn, "verify_draft", [0, 0], q_rows.clone(), p_rows.clone(),
                                                gen)[0]]
        accepted = 0                    # the drafts are token 0; a rejection emits a residual token, never 0
        for token in emitted[:2]:
            if token != 0:
                break
            accepted += 1
        counts[accepted] += 1
    result = chi_square_test(counts, torch.tensor([0.5, 0.25, 0.25]))
    if not at_least(result.p_value, SIGNIFICANCE):
        raise AssertionError(
            f"two drafts, each accepted with probability min(1, 0.4 / 0.8) = 1/2, over {INDEPENDENCE_ROUNDS} rounds: "
            f"none accepted {int(counts[0])} times, only the first {int(counts[1])}, both {int(counts[2])}; expected "
            "about 1/2, 1/4, 1/4 (p-value {:.2g}). Draw a fresh uniform for each draft: one uniform shared by the "
            "round accepts the second draft whenever it accepts the first.".format(result.p_value))


def _explained(verify_fn: Callable) -> Callable:
    """verify_fn, with torch's multinomial error on a bad residual turned into the mistake's name."""
    def call(*args: Any) -> Any:
        return _verify_call(verify_fn, "verify_draft (in the distribution test)", *args)
    return call
