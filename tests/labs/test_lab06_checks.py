"""Lab 06 checks: the reference passes, the stub and each plausible wrong implementation fail.

The wrong speculative samplers below are the mistakes listed in the lab's issue. The distribution tests
are seeded, so pass/fail is deterministic; the `..._has_the_power_for_each_mistake` tests also assert that the
sample sizes in autograder/lab06 reject each wrong sampler with at least 99% power (so another seed would too).
"""

from __future__ import annotations

import copy
import inspect
import math
import textwrap

import pytest
import torch

from autograder import lab06
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.engine.ngram_draft import ngram_propose
from minigpt.engine.speculative import generate_speculative, sampling_probs, verify_draft
from minigpt.generate import Generation, StopRule, check_request
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator
from minigpt.teaching.goodness_of_fit import chi2_sf
from minigpt.costmodel.speculative_calculator import acceptance_rate, expected_tokens_per_round
from minigpt.tokenizer import EOT_ID


def _stub(*args, **kwargs):
    raise NotImplementedError()


def learner_copy(fn):
    """The reference's source pasted into a notebook cell: the learner's own function object (what the guard cannot
    tell apart, and `python -m autograder similarity` reports), calling the same helpers."""
    namespace = dict(inspect.unwrap(fn).__globals__)
    exec(compile(textwrap.dedent(inspect.getsource(fn)), "<learner cell>", "exec"), namespace)
    return namespace[fn.__name__]


own_truncate, own_probs, own_verify = learner_copy(truncate_cache), learner_copy(sampling_probs), learner_copy(verify_draft)
own_ngram, own_rate, own_tokens = (learner_copy(ngram_propose), learner_copy(acceptance_rate),
                                   learner_copy(expected_tokens_per_round))
own_generate = learner_copy(generate_speculative)


# --- wrong verify rules --------------------------------------------------------------------------

def _verify(accept_fn, residual_fn, p_row=lambda p, i: p[i], bonus=True, clip=True):
    """A verify_draft built from pieces, to make each mistake a one-line change."""
    def verify(drafted, q, p, generator=None):
        k = len(drafted)
        if k == 0:
            return [int(torch.multinomial(p[0], 1, generator=generator))], p.new_zeros(0)
        probs = []
        emitted = []
        for i, t in enumerate(drafted):
            pi = p_row(p, i)
            ratio = accept_fn(pi[t], q[i, t])
            probs.append(min(1.0, float(ratio)) if clip else float(ratio))
        u = torch.rand(k, generator=generator).tolist()
        for i, t in enumerate(drafted):
            if u[i] < probs[i]:
                emitted.append(int(t))
                continue
            emitted.append(residual_fn(p_row(p, i), q[i], generator))
            return emitted, torch.tensor(probs)
        if bonus:
            emitted.append(int(torch.multinomial(p[k - 1 if bonus == "previous position" else k], 1,
                                                 generator=generator)))
        return emitted, torch.tensor(probs)
    return verify


def _residual(p, q, g):
    r = (p - q).clamp_min(0)
    return int(torch.multinomial(r / r.sum(), 1, generator=g)) if r.sum() > 0 else int(torch.multinomial(p, 1, generator=g))


def _resample_from_p(p, q, g):
    return int(torch.multinomial(p, 1, generator=g))


def _unnormalised_residual(p, q, g):
    """Inverse-CDF sampling from max(0, p - q) without dividing by its sum: mass beyond the sum piles on the last token."""
    cdf = (p - q).clamp_min(0).cumsum(0)
    u = torch.rand(1, generator=g)
    return min(int(torch.searchsorted(cdf, u)), p.shape[0] - 1)


def _no_fallback(p, q, g):
    """The residual normalised with no fallback: an all-zero residual is 0 / 0 (issue 57: it survived)."""
    r = (p - q).clamp_min(0)
    return int(torch.multinomial(r / r.sum(), 1, generator=g))


def _residual_times_its_sum(p, q, g):
    """Multiplied by its sum instead of divided: a residual of tiny mass underflows to zeros (issue 57)."""
    r = (p - q).clamp_min(0)
    r = r * r.sum() if r.sum() > 0 else p
    return int(torch.multinomial(r / r.sum() if r.sum() > 0 else p, 1, generator=g))


p_over_q = lambda p, q: p / q           # noqa: E731
q_over_p = lambda p, q: q / p if p > 0 else torch.tensor(1.0)      # noqa: E731

WRONG_VERIFY = {
    "unclipped p/q": _verify(p_over_q, _residual, clip=False),
    "q/p": _verify(q_over_p, _residual),
    "resample from p": _verify(p_over_q, _resample_from_p),
    "unnormalised residual": _verify(p_over_q, _unnormalised_residual),
    "no bonus token": _verify(p_over_q, _residual, bonus=False),
    "off by one (p[i + 1] verifies draft i)": _verify(p_over_q, _residual, p_row=lambda p, i: p[i + 1]),
    "bonus token drawn from p[k - 1]": _verify(p_over_q, _residual, bonus="previous position"),
    "no fallback for an all-zero residual": _verify(p_over_q, _no_fallback),
}


def test_a_residual_of_tiny_mass_is_still_a_distribution():
    with pytest.raises(AssertionError, match="5e-31"):
        lab06.check_verify_draft(_verify(p_over_q, _residual_times_its_sum))


def one_uniform_per_round(drafted, q, p, generator=None):
    """Right accept probabilities and residuals, but one uniform for the whole round: the second draft is accepted
    whenever the first is. The distribution test needs about 20,000 samples to see it (measured: p = 1.9e-5 at
    20,000, p = 0.84 at the check's 1,500)."""
    k = len(drafted)
    if k == 0:
        return [int(torch.multinomial(p[0], 1, generator=generator))], p.new_zeros(0)
    probs = [min(1.0, float(p[i, t] / q[i, t])) for i, t in enumerate(drafted)]
    u = float(torch.rand(1, generator=generator))
    emitted = []
    for i, t in enumerate(drafted):
        if u >= probs[i]:
            return emitted + [_residual(p[i], q[i], generator)], torch.tensor(probs)
        emitted.append(int(t))
    return emitted + [int(torch.multinomial(p[k], 1, generator=generator))], torch.tensor(probs)


def truncate_refusing_its_own_length(cache, length):
    """Raises for length >= cache.length: truncating to the current length (a round that accepted everything) fails."""
    if not 0 <= length < cache.length and length != 0:
        raise ValueError(f"length must be in [0, {cache.length}), got {length}")
    own_truncate(cache, length)


def test_truncating_to_the_current_length_is_allowed():
    with pytest.raises(AssertionError, match="its own length"):
        lab06.check_truncate_cache(truncate_refusing_its_own_length)


def test_one_uniform_per_round_is_caught():
    results = lab06.verify_distribution_test(one_uniform_per_round)     # no power against it at 1,500 samples...
    assert all(r.p_value > lab06.SIGNIFICANCE for r in results)
    with pytest.raises(AssertionError, match="fresh uniform for each draft"):
        lab06.check_verify_draft(one_uniform_per_round)            # ...the acceptance counts decide at once


def _unclipped_residual(p, q, g):
    r = p - q
    return int(torch.multinomial(r / r.sum(), 1, generator=g))


def _global_rng_verify(drafted, q, p, generator=None):
    """Right rule, but the uniforms come from the global RNG: the same generator seed gives different tokens."""
    return own_verify(drafted, q, p, None)


UNCLIPPED = _verify(p_over_q, _unclipped_residual)


# --- wrong generators: the reference loop with one mistake each -----------------------------------

def make_generator_fn(*, temperature_on_q=True, rollback_draft=True, off_by_one=False, bonus=True,
                      target_top_k=True, seeded=True, verify=own_verify, draft_cache=True, via_forward=False,
                      on_device=True):
    """The reference loop written out flat, with one mistake switched on (via_forward: no mistake, but the models
    are run through `model.forward(...)` instead of `model(...)`; on_device=False: tensors and the generator made
    without device=, right on a one-device machine only)."""
    @torch.inference_mode()
    def generate(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4,
                 stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None):
        run_target, run_draft = (target.forward, draft.forward) if via_forward else (target, draft)
        dev = target.device if on_device else None
        ids = check_request(target, prompt, max_new_tokens)
        stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
        gen = make_generator(sampling if seeded else SamplingParams(temperature=sampling.temperature), dev)
        p_params = sampling if target_top_k else SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p)
        # room for a draft cache that is never rolled back (k rejected drafts a round at most), within the context
        size = min(target.config.max_seq_len, len(ids) + (k + 1) * (max_new_tokens + 1))
        tc, dc = KVCache.for_model(target, 1, size), KVCache.for_model(draft, 1, size)
        context, reason, d_fed = list(ids), "length" if max_new_tokens == 0 else None, 0
        while reason is None:
            kr = min(k, max_new_tokens - len(stop.tokens) - 1)
            drafted, qs, x = [], [], context[d_fed:]
            for _ in range(kr):
                if draft_cache:
                    logits = run_draft(torch.tensor([x], device=dev), positions=dc.next_positions(len(x)), kv_caches=dc)[0, -1]
                else:                                   # the whole context again at every draft step
                    logits = run_draft(torch.tensor([context + drafted], device=dev))[0, -1]
                q_draw = sampling_probs(logits, sampling)
                t = int(q_draw.argmax()) if sampling.greedy else int(torch.multinomial(q_draw, 1, generator=gen))
                drafted.append(t)
                qs.append(q_draw if temperature_on_q or sampling.greedy else torch.softmax(logits.float(), -1))
                x = [t]
            feed = context[tc.length:] + drafted
            logits = run_target(torch.tensor([feed], device=dev), positions=tc.next_positions(len(feed)), kv_caches=tc)[0]
            rows = torch.cat([logits[-kr:], logits[-1:]]) if off_by_one and kr else logits[-(kr + 1):]
            p = sampling_probs(rows, p_params)
            q = torch.stack(qs) if qs else torch.zeros(0, p.shape[1], device=dev)
            emitted, _ = verify(drafted, q, p, gen)
            if not bonus and kr and len(emitted) == kr + 1:
                emitted = emitted[:-1]
            L = len(context)
            truncate_cache(tc, L + len(emitted) - 1)
            if kr:
                d_fed = L + min(len(emitted) - 1, kr - 1)
            if rollback_draft and draft_cache:
                truncate_cache(dc, d_fed)
            for t in emitted:
                reason = stop.add(t)
                context.append(t)
                if reason is not None:
                    break
        return Generation(stop.tokens, reason, prompt_tokens=len(ids))
    return generate


# The reference loop rebuilt from pieces must pass; it validates the harness that builds the wrong ones.
rebuilt_reference = make_generator_fn()

WRONG_GENERATORS = {
    "temperature applied to p but not q": make_generator_fn(temperature_on_q=False),
    "draft cache not rolled back": make_generator_fn(rollback_draft=False),
    "off by one (target logits of position i verify draft i + 1)": make_generator_fn(off_by_one=True),
    "no bonus token": make_generator_fn(bonus=False),
    "target distribution ignores top-k": make_generator_fn(target_top_k=False),
    "bonus token drawn from the last draft's position": make_generator_fn(verify=WRONG_VERIFY["bonus token drawn from p[k - 1]"]),
    "unseeded (global RNG)": make_generator_fn(seeded=False),
    "tensors and generator on torch's default device": make_generator_fn(on_device=False),
}


# --- tests ----------------------------------------------------------------------------------------

def test_reference_passes_every_check():
    lab06.check_truncate_cache(own_truncate)
    lab06.check_sampling_probs(own_probs)
    lab06.check_verify_draft(own_verify)
    lab06.check_ngram_propose(own_ngram)
    lab06.check_acceptance_stats(own_rate, own_tokens)


def test_reference_generator_passes():
    lab06.check_generate_speculative(own_generate)


def _wrapper(reference):
    def wrapper(*args, **kwargs):
        return reference(*args, **kwargs)
    return wrapper


@pytest.mark.parametrize("run, message", [
    (lambda: lab06.check_truncate_cache(truncate_cache), "this is the course's reference"),
    (lambda: lab06.check_truncate_cache(_wrapper(truncate_cache)), r"calls the course's reference \(truncate_cache\)"),
    (lambda: lab06.check_sampling_probs(sampling_probs), "this is the course's reference"),
    (lambda: lab06.check_sampling_probs(_wrapper(sampling_probs)), r"reference \(sampling_probs\)"),
    (lambda: lab06.check_verify_draft(verify_draft), "this is the course's reference"),
    (lambda: lab06.check_verify_draft(_wrapper(verify_draft)), r"reference \(verify_draft\)"),
    (lambda: lab06.check_generate_speculative(generate_speculative), "this is the course's reference"),
    (lambda: lab06.check_generate_speculative(_wrapper(generate_speculative)), r"reference \(generate_speculative\)"),
    (lambda: lab06.check_ngram_propose(ngram_propose), "this is the course's reference"),
    (lambda: lab06.check_ngram_propose(_wrapper(ngram_propose)), r"reference \(ngram_propose\)"),
    (lambda: lab06.check_acceptance_stats(acceptance_rate, own_tokens), "this is the course's reference"),
    (lambda: lab06.check_acceptance_stats(own_rate, expected_tokens_per_round), "this is the course's reference"),
    (lambda: lab06.check_acceptance_stats(_wrapper(acceptance_rate), own_tokens), r"reference \(acceptance_rate\)"),
    (lambda: lab06.check_speculative_speedup(generate_speculative), "this is the course's reference"),
    (lambda: lab06.check_target_calls(generate_speculative), "this is the course's reference"),
    (lambda: lab06.check_target_calls(_wrapper(generate_speculative)), r"reference \(generate_speculative\)"),
], ids=["truncate", "truncate wrapper", "probs", "probs wrapper", "verify", "verify wrapper", "generate",
        "generate wrapper", "ngram", "ngram wrapper", "rate", "tokens", "rate wrapper", "speed", "target calls",
        "target calls wrapper"])
def test_the_reference_handed_in_is_refused(run, message):
    """(Every exercise of this lab is a function, so there is no subclass to try.)"""
    with pytest.raises(ReferenceHandedIn, match=message):
        run()


def test_unclipped_residual_is_named():
    """p - q without the clip has negative entries: torch's 'probability tensor contains ... < 0' becomes the mistake."""
    with pytest.raises(AssertionError, match=r"clipped at 0") as err:
        lab06.check_verify_draft(UNCLIPPED)
    assert "element < 0" not in str(err.value).split("(torch:")[0]


def test_verify_with_the_global_rng_is_rejected():
    with pytest.raises(AssertionError, match="from the `generator` argument"):
        lab06.check_verify_draft(_global_rng_verify)


def test_checks_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    lab06._tiny_pair()
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("check", [lab06.check_truncate_cache, lab06.check_verify_draft, lab06.check_ngram_propose,
                                   lab06.check_generate_speculative])
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(_stub)


def test_stub_fails_probs_and_stats():
    with pytest.raises(AssertionError, match="not implemented"):
        lab06.check_sampling_probs(_stub)
    with pytest.raises(AssertionError, match="not implemented"):
        lab06.check_acceptance_stats(_stub, own_tokens)
    with pytest.raises(AssertionError, match="not implemented"):
        lab06.check_acceptance_stats(own_rate, _stub)


@pytest.mark.parametrize("name", list(WRONG_VERIFY))
def test_wrong_verify_rejected(name):
    with pytest.raises(AssertionError):
        lab06.check_verify_draft(WRONG_VERIFY[name])


@pytest.mark.parametrize("name", list(WRONG_GENERATORS))
def test_wrong_generator_rejected(name):
    with pytest.raises(AssertionError):
        lab06.check_generate_speculative(WRONG_GENERATORS[name])


def test_a_loop_whose_tensors_follow_the_default_device_is_told_so():
    with pytest.raises(AssertionError, match="default device moved off"):
        lab06.check_generate_speculative(WRONG_GENERATORS["tensors and generator on torch's default device"])


def _samples_needed(results) -> int:
    """Samples the most sensitive of the tests needs to reject this wrong law with 99% power, its squared effect size
    estimated from the statistic observed (E[X] = dof + n w^2); 0 when a token of probability 0 was drawn."""
    return min(0 if math.isinf(r.statistic) else lab06.samples_for_power(max((r.statistic - r.dof) / r.n, 1e-12), r.dof)
               for r in results)


@pytest.mark.parametrize("name", ["q/p", "resample from p", "unnormalised residual", "off by one (p[i + 1] verifies draft i)",
                                  "bonus token drawn from p[k - 1]"])
def test_verify_sample_size_has_the_power_for_each_mistake(name):
    """VERIFY_SAMPLES gives 99% power (at SIGNIFICANCE) against each kept mistake, with room to spare."""
    needed = _samples_needed(lab06.verify_distribution_test(WRONG_VERIFY[name]))
    assert needed <= 0.7 * lab06.VERIFY_SAMPLES, f"{name}: 99% power needs {needed} samples"


@pytest.mark.parametrize("name", ["temperature applied to p but not q", "target distribution ignores top-k",
                                  "bonus token drawn from the last draft's position"])
def test_engine_sample_size_has_the_power_for_each_mistake(name):
    needed = _samples_needed(lab06.engine_distribution_test(WRONG_GENERATORS[name]))
    assert needed <= 0.7 * lab06.ENGINE_SAMPLES, f"{name}: 99% power needs {needed} samples"


def test_a_small_bias_needs_many_samples():
    """The issue's example: a TV distance of 0.009 between the target's law after token 2 (T = 1) and a wrong one.
    Moved into the rarest cell it needs about 2,300 samples for 99% power; moved between the two likeliest cells
    about 113,000: far more than 1,500, which is why the tests are sized per mistake (above), not per TV distance."""
    p = sampling_probs(lab06._toy_tables(0)[0], SamplingParams(temperature=1.0))[2]
    order = p.argsort()
    def needed(src, dst):
        q = p.clone()
        q[src] -= 0.009
        q[dst] += 0.009
        return lab06.samples_for_power((((q - p) ** 2) / p).sum().item(), p.numel() - 1)
    rare, common = needed(int(order[-1]), int(order[0])), needed(int(order[-1]), int(order[-2]))
    assert 1_500 < rare < 5_000 and common > 50_000, (rare, common)


def test_rebuilt_reference_passes_the_distribution_test():
    results = lab06.engine_distribution_test(rebuilt_reference)
    assert min(r.p_value for r in results) >= lab06.SIGNIFICANCE


def test_wrong_ngram_rejected():
    def first_occurrence(context, k, max_n=3):
        L = len(context)
        for n in range(min(max_n, L - 1), 0, -1):
            for s in range(0, L - n):
                if context[s:s + n] == context[L - n:]:
                    return context[s + n:s + n + k]
        return []
    with pytest.raises(AssertionError, match="MOST RECENT"):
        lab06.check_ngram_propose(first_occurrence)

    def n_below_l_minus_1(context, k, max_n=3):
        """n from min(max_n, L - 2): a 2-token context never tries n = 1 (issue 57: it survived)."""
        L = len(context)
        for n in range(min(max_n, L - 2), 0, -1):
            for s in range(L - n - 1, -1, -1):
                if context[s:s + n] == context[L - n:]:
                    return context[s + n:s + n + k]
        return []
    with pytest.raises(AssertionError, match="shortest context"):
        lab06.check_ngram_propose(n_below_l_minus_1)

    def one_past_max_n(context, k, max_n=3):
        """n from min(max_n, L - 1) + 1: a suffix one token longer than max_n allows (a mutant that survived)."""
        L = len(context)
        for n in range(min(max_n, L - 1) + 1, 0, -1):
            for s in range(L - n - 1, -1, -1):
                if context[s:s + n] == context[L - n:]:
                    return context[s + n:s + n + k]
        return []
    with pytest.raises(AssertionError, match="max_n = 2 bounds"):
        lab06.check_ngram_propose(one_past_max_n)


def test_wrong_stats_rejected():
    with pytest.raises(AssertionError, match="without the clip"):
        lab06.check_acceptance_stats(lambda p, q: (q * (p / q)).sum(-1), own_tokens)
    with pytest.raises(AssertionError, match="accepted drafts only"):
        lab06.check_acceptance_stats(own_rate, lambda a, k: own_tokens(a, k) - 1)


def test_wrong_truncate_rejected():
    def first_layer_only(cache, length):
        cache.layers[0].length = length

    def no_bounds(cache, length):
        for layer in cache:
            layer.length = length
    for fn in (first_layer_only, no_bounds):
        with pytest.raises(AssertionError):
            lab06.check_truncate_cache(fn)


def test_interview_answers():
    lab06.check_q1_acceptance(0.6)
    lab06.check_q2_best_k(3)
    lab06.check_q4_break_even_batch(230)
    with pytest.raises(AssertionError, match="clip"):
        lab06.check_q1_acceptance(1.0)
    with pytest.raises(AssertionError):
        lab06.check_q4_break_even_batch(200)


# Q2: acceptance decays with the position; each wrong pick is what one mistake in the model gives.
Q2_MISTAKES = {7: "constant-alpha", 6: "product", 5: "ignores the draft's cost", 4: "accepted drafts only"}


@pytest.mark.parametrize("wrong", sorted(Q2_MISTAKES))
def test_q2_each_wrong_pick_is_diagnosed(wrong):
    with pytest.raises(AssertionError, match=Q2_MISTAKES[wrong]):
        lab06.check_q2_best_k(wrong)


def test_q2_mistakes_are_distinct_and_the_answer_is_not_close():
    from autograder.lab06.questions import Q2, q2_alphas, q2_best_k, q2_mistakes
    assert q2_best_k() == 3 and set(q2_mistakes()) == set(Q2_MISTAKES) and q2_best_k() not in q2_mistakes()

    def tokens(k):                                   # by simulation of the definition, not the check's closed form
        total, run = 1.0, 1.0
        for a in q2_alphas(k):
            run *= a
            total += run
        return total
    speedup = {k: tokens(k) / (k * Q2["draft_cost"] + 1 + Q2["verify_slope"] * k) for k in Q2["ks"]}
    best, second = sorted(speedup.values(), reverse=True)[:2]
    assert max(speedup, key=speedup.get) == 3 and best / second > 1.015     # a learner's rounding cannot flip the pick


def test_q2_is_not_one_call_to_the_notebooks_calculator():
    """calc.best_k with the first draft's alpha (the shortcut the notebook's import offers) gives a diagnosed wrong k."""
    from minigpt.costmodel.speculative_calculator import best_k
    k, _ = best_k(0.9, target_step_s=1.0, draft_step_s=0.15, verify_s=lambda k: 1 + 0.02 * k)
    assert k != 3
    with pytest.raises(AssertionError, match="constant-alpha"):
        lab06.check_q2_best_k(k)


# Q3: alpha from a logged mean acceptance length at k = 3, then the speedup at k = 5.
def _q3_reference():
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_round(mid, 3) < 2.8 else (lo, mid)
    a = (lo + hi) / 2
    return a, expected_tokens_per_round(a, 5) / (5 * 0.05 + 1 + 0.04 * 5)


def test_q3_answer_inverts_the_logged_length():
    a, speedup = _q3_reference()
    assert abs(expected_tokens_per_round(a, 3) - 2.8) < 1e-9 and 0.76 < a < 0.77
    lab06.check_q3_speedup_from_logs(speedup)
    lab06.check_q3_speedup_from_logs(round(speedup, 3))


@pytest.mark.parametrize("which, note", [("ratio", "accepted drafts per drafted token"), ("plain", "not alpha either"),
                                         ("bonus", "already include"), ("k3", "speedup at k = 3"),
                                         ("nodraft", "draft steps"), ("tokens", "tokens per round at k = 5")])
def test_q3_each_mistake_is_diagnosed(which, note):
    from autograder.lab06.questions import _alpha_from_length, _constant_tokens, _q3_speedup
    a, _ = _q3_reference()
    wrong = {"ratio": _q3_speedup(1.8 / 3, 5), "plain": _q3_speedup(2.8 / 3, 5),
             "bonus": _q3_speedup(_alpha_from_length(3.8, 3), 5), "k3": _q3_speedup(a, 3),
             "nodraft": _q3_speedup(a, 5, draft_cost=0.0), "tokens": _constant_tokens(a, 5)}[which]
    with pytest.raises(AssertionError, match=note):
        lab06.check_q3_speedup_from_logs(wrong)


def test_q3_mistakes_are_distinct_from_the_key():
    from autograder.lab06.questions import _alpha_from_length, _constant_tokens, _q3_speedup, q3_speedup
    a, key = _q3_reference()
    wrongs = [_q3_speedup(1.8 / 3, 5), _q3_speedup(2.8 / 3, 5), _q3_speedup(_alpha_from_length(3.8, 3), 5),
              _q3_speedup(a, 3), _q3_speedup(a, 5, draft_cost=0.0), _constant_tokens(a, 5)]
    assert math.isclose(q3_speedup(), key, rel_tol=1e-9)
    assert all(abs(w / key - 1) > 0.01 for w in wrongs)
    assert all(abs(x / y - 1) > 0.005 for i, x in enumerate(wrongs) for y in wrongs[i + 1:])


# Q4: t(n) = 10 + 0.04 n ms (additive), a draft step of 0.1 t(B), alpha 0.75, k 3.
def test_q4_key_solves_the_linear_inequality():
    """E (10 + 0.04 B) < 3 * 0.1 (10 + 0.04 B) + 10 + 0.16 B is linear in B: B > (10 E - 13) / (0.172 - 0.04 E)."""
    e = expected_tokens_per_round(0.75, 3)
    assert math.floor((10 * e - 13) / (0.172 - 0.04 * e)) + 1 == 230
    lab06.check_q4_break_even_batch(230)


@pytest.mark.parametrize("wrong, note", [(153, "max\\(\\) roofline"), (343, "draft steps"), (3, "B separate"),
                                         (43, "bonus token"), (229, "off by one")])
def test_q4_each_mistake_is_diagnosed(wrong, note):
    with pytest.raises(AssertionError, match=note):
        lab06.check_q4_break_even_batch(wrong)


def test_q4_roofline_shortcut_is_a_diagnosed_mistake():
    """calc.break_even_batch (the max() roofline the notebook imports) gives 153, not the key."""
    from minigpt.costmodel.speculative_calculator import break_even_batch
    assert break_even_batch(0.75, 3, memory_s=10.0, per_token_s=0.04, draft_fraction=0.1) == 153


# --- exercise 4 is graded alone; the speed grades (prompt lookup) ----------------------------------

def _broken_pieces_generate():
    """A correct loop (the reference's source) whose notebook's exercises 1-3 are still stubs."""
    namespace = dict(inspect.unwrap(generate_speculative).__globals__)
    namespace.update(truncate_cache=_stub, sampling_probs=_stub, verify_draft=_stub)
    exec(compile(textwrap.dedent(inspect.getsource(generate_speculative)), "<learner cell>", "exec"), namespace)
    return namespace["generate_speculative"]


def test_exercise_4_is_graded_without_exercises_1_to_3():
    fn = _broken_pieces_generate()
    with pytest.raises(NotImplementedError):       # on its own it cannot run...
        fn(*lab06.toy_pair(), [1, 2], 3, k=2, stop_token_ids=())
    lab06.check_generate_speculative(fn)         # ...but its check passes the package's pieces
    lab06.check_target_calls(fn)


def test_with_reference_pieces_leaves_the_learners_namespace_alone():
    fn = _broken_pieces_generate()
    lab06.with_reference_pieces(fn)(*lab06.toy_pair(), [1, 2], 3, k=2, stop_token_ids=())
    assert inspect.unwrap(fn).__globals__["verify_draft"] is _stub


def test_prompt_lookup_model_drafts_like_the_drafter():
    from minigpt.engine.ngram_draft import PromptLookupDrafter, PromptLookupModel
    target, _ = lab06._tiny_pair()
    prompt = [5, 9, 2, 7, 5, 9, 2, 7, 5, 9]
    as_model = generate_speculative(target, PromptLookupModel(48), prompt, 20, k=3, stop_token_ids=())
    as_drafter = generate_speculative(target, PromptLookupDrafter(48), prompt, 20, k=3, stop_token_ids=())
    assert as_model.tokens == as_drafter.tokens == generate_speculative(target, lab06._tiny_pair()[1], prompt, 20, k=3,
                                                                        stop_token_ids=()).tokens
    assert as_model.rounds[0].drafted == ngram_propose(prompt, 3)


def test_target_calls_pass_the_reference_and_reject_one_call_per_token():
    calls = lab06.check_target_calls(own_generate)
    assert calls["prompt lookup"]["learner"] < 0.5 and calls["draft model"]["learner"] < 1.0
    per_token = make_generator_fn()

    def verify_each_token(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4, **kw):
        return per_token(target, draft, prompt, max_new_tokens, sampling, k=0, **kw)       # never drafts
    with pytest.raises(AssertionError, match="called the target"):
        lab06.check_target_calls(verify_each_token)


def test_a_draft_model_without_its_kv_cache_is_caught_by_the_positions_it_is_fed():
    """Right tokens and the same target calls: only the work done by the draft model tells this one apart, in
    exercise 4's check (positions fed on the tiny pair) and in the target-calls check."""
    no_draft_cache = make_generator_fn(draft_cache=False)
    with pytest.raises(AssertionError, match="the draft model was fed .* without its KV cache"):
        lab06.check_generate_speculative(no_draft_cache)
    calls = lab06.check_target_calls(own_generate)
    assert calls["draft model"]["draft_positions"] == calls["draft model"]["reference_draft_positions"]
    with pytest.raises(AssertionError, match="fed the draft model"):
        lab06.check_target_calls(no_draft_cache)


def test_speed_check_reference_passes_and_recomputation_fails():
    from autograder.gpu_tier.slow_implementations import recompute_everything    # also measured by `make calibrate`
    result = lab06.check_speculative_speedup(own_generate)
    assert result["speedup"] > 1
    with pytest.raises(AssertionError, match="called the target 12 times for 12 tokens"):
        lab06.check_speculative_speedup(learner_copy(recompute_everything), new_tokens=12, repeats=1)


def test_speed_check_refuses_plain_decoding_before_timing_it(monkeypatch):
    """Plain cached decoding handed in (right tokens, one target call per token) is refused by the call count of the
    correctness run, deterministically: nothing is timed (timed against itself it lands anywhere near 1x)."""
    from autograder.lab06 import speed

    def plain(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4, **kw):
        from minigpt.engine.cached_generation import generate_kv_cache
        return generate_kv_cache(target, prompt, max_new_tokens, **kw)

    def never_timed(*args, **kwargs):
        raise RuntimeError("timed")
    monkeypatch.setattr(speed, "check_speedup", never_timed)
    with pytest.raises(AssertionError, match=r"called the target 32 times for 32 tokens \(1.00 per token\)"):
        lab06.check_speculative_speedup(learner_copy(plain))


def test_speed_check_wants_a_real_speedup(monkeypatch):
    """Reaching the calibrated fraction of the reference is not enough: the speedup over plain decoding must reach
    MIN_OVER_PLAIN in a round (harness.check_speedup's floor, test_harness.py), and the message says why."""
    from autograder.lab06 import speed

    floors = []

    def as_fast_as_plain(*args, min_speedup=0.0, **kwargs):
        floors.append(min_speedup)
        raise AssertionError("your speedup over the baseline is 1.02x")
    monkeypatch.setattr(speed, "check_speedup", as_fast_as_plain)
    with pytest.raises(AssertionError, match="1.02x .*must beat plain decoding"):
        lab06.check_speculative_speedup(own_generate)
    assert floors == [lab06.common.MIN_OVER_PLAIN] and lab06.common.MIN_OVER_PLAIN >= 1.0


def test_speed_check_gives_each_timed_call_a_prompt_of_its_own(monkeypatch):
    """A generator that hands back the answer it computed first (instant, and right for the speed check's first
    run) has its speed refused: every timed call gets a prompt of its own, and its tokens are checked."""
    kept: list = []

    def answer_kept_from_the_first_call(*args, **kwargs):
        if not kept:
            kept.append(own_generate(*args, **kwargs))
        return kept[0]
    with pytest.raises(AssertionError, match="timed call #0"):
        lab06.check_speculative_speedup(answer_kept_from_the_first_call, repeats=2)


# --- the tiny models' weights: a secret when judged -----------------------------------------------

def _own_copy_of_the_target(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4, **kw):
    """One target call per token (k = 0, the mistake), made on its own copy of the tiny target rebuilt from the
    check's seed, and as many calls of the handed-in target as a right loop would make: the counts the check sees
    are forged."""
    with torch.device("cpu"):                                     # the check may move the default device
        mine, _ = lab06._tiny_pair(0)
    if target.config.vocab_size != mine.config.vocab_size:        # another part's models: the same mistake on them
        return make_generator_fn()(target, draft, prompt, max_new_tokens, sampling, k=0, **kw)
    out = make_generator_fn()(mine, mine, prompt, max_new_tokens, sampling, k=0, **kw)
    for _ in range(math.ceil(len(out.tokens) / (k + 1))):
        target(torch.tensor([[0]], device=target.device), positions=torch.tensor([0], device=target.device))
    return out


def test_the_tiny_models_verdict_does_not_depend_on_their_seed():
    for seed in (123_456,):
        lab06.generator._check_generate(own_generate, seed=seed)
        with pytest.raises(AssertionError):
            lab06.generator._check_generate(WRONG_GENERATORS["no bonus token"], seed=seed)


def test_a_copy_of_the_target_passes_only_where_its_weights_are_known():
    lab06.generator._check_generate(_own_copy_of_the_target, seed=0)      # public weights: the forged counts pass
    with pytest.raises(AssertionError, match="greedy output differs"):
        lab06.generator._check_generate(_own_copy_of_the_target, seed=123_456)


# --- near ties: the tiny pair's seed is drawn until no greedy step the check compares is one -------------------

NEAR_TIE_SEED = 1008        # two of its target's greedy logits 2e-6 apart (found by scanning seeds from 1000)


def _smallest_gap(seed):
    """The smallest top-two logit gap over the greedy steps clear_tiny_pair looks at (the target's along both work
    runs, the draft's at each of the reference's drafts)."""
    from autograder.lab06.generator import TINY_RUN, WORK_RUNS
    from autograder.lab06.near_ties import greedy_gaps
    from minigpt.engine.cached_generation import generate_kv_cache
    target, draft = lab06._tiny_pair(seed)
    gaps = [greedy_gaps(target, run.prompt, generate_kv_cache(target, list(run.prompt), run.new_tokens,
                                                              stop_token_ids=()).tokens).min() for run in WORK_RUNS]
    context = list(TINY_RUN.prompt)
    for r in generate_speculative(target, draft, context, TINY_RUN.new_tokens, k=TINY_RUN.k, stop_token_ids=()).rounds:
        gaps += [greedy_gaps(draft, context, r.drafted).min()] if r.drafted else []
        context += r.emitted
    return min(float(g) for g in gaps)


@pytest.mark.slow
def test_accepted_tiny_pairs_give_every_run_its_greedy_tokens_and_rounds():
    """100 seeds (seeded draw): on each one clear_tiny_pair accepts, the reference loop's greedy tokens are
    generate_kv_cache's on both work runs and the twin takes ceil(n / (k + 1)) rounds (every draft accepted, a bonus
    token each round); the seeds it rejects are near ties, and among them real ones such as NEAR_TIE_SEED, a gap
    below the float noise between the two paths (about 1e-5), where a correct loop could fail the check (the CI
    failure of the flaky check). About 2 minutes on the shared 2-core machine under load, hence `slow`."""
    from autograder.lab06.generator import WORK_RUNS, clear_tiny_pair
    from minigpt.engine.cached_generation import generate_kv_cache
    seeds = torch.randint(0, 2**62, (100,), generator=torch.Generator().manual_seed(606)).tolist() + [NEAR_TIE_SEED]
    rejected = []
    for seed in seeds:
        if not clear_tiny_pair(seed):
            rejected.append(seed)
            continue
        target, draft = lab06._tiny_pair(seed)
        for run in WORK_RUNS:
            other = copy.deepcopy(target) if run.twin else draft
            want = generate_kv_cache(target, list(run.prompt), run.new_tokens, stop_token_ids=()).tokens
            got = generate_speculative(target, other, list(run.prompt), run.new_tokens, k=run.k, stop_token_ids=())
            assert got.tokens == want, (seed, run.label)
            if run.twin:
                assert len(got.rounds) == math.ceil(run.new_tokens / (run.k + 1)), seed
    assert NEAR_TIE_SEED in rejected and len(rejected) < 12, rejected
    assert all(_smallest_gap(seed) < 1e-3 for seed in rejected) and _smallest_gap(NEAR_TIE_SEED) < 1e-5


def test_the_check_uses_clear_seeds_only(monkeypatch):
    """The seed the check uses is the first clear one it draws: a near tie drawn first is passed over."""
    from autograder.lab06 import generator
    assert _smallest_gap(NEAR_TIE_SEED) < 1e-5
    monkeypatch.setattr(generator, "drawn_seeds", lambda fn: iter([NEAR_TIE_SEED, 7]))
    assert generator.tiny_pair_seed(own_generate) == 7


def test_same_greedy_forgives_a_first_difference_only_at_a_near_tie():
    """The speed check's comparison of a timed output with plain decoding's: the runner-up taken at a near tie (and
    whatever follows) passes; the runner-up at a clear step, or a sequence cut short, does not."""
    from autograder.lab06.generator import TINY_RUN
    from autograder.lab06.near_ties import greedy_gaps, same_greedy
    from minigpt.engine.cached_generation import generate_kv_cache
    target, _ = lab06._tiny_pair(NEAR_TIE_SEED)
    prompt = list(TINY_RUN.prompt)
    want = generate_kv_cache(target, prompt, TINY_RUN.new_tokens, stop_token_ids=()).tokens
    gaps = greedy_gaps(target, prompt, want)
    tie, clear = int(gaps.argmin()), int(gaps.argmax())

    def runner_up_at(i):
        with torch.inference_mode():
            second = int(target(torch.tensor([prompt + want[:i]]))[0, -1].topk(2).indices[1])
        return want[:i] + [second] + want[i + 1:]
    assert same_greedy(target, prompt, want, want) and same_greedy(target, prompt, runner_up_at(tie), want)
    assert not same_greedy(target, prompt, runner_up_at(clear), want)
    assert not same_greedy(target, prompt, want[:-1], want)


# --- what the judge draws stays the judge's -------------------------------------------------------

def test_judged_seeds_are_secrets_drawn_apart(monkeypatch):
    """Judged, every seed is drawn with `secrets` (never 0, 1, 2, ... as in one process), and the tiny pair built in
    the kernel has a seed of its own."""
    from autograder.lab06 import common, generator
    monkeypatch.setattr(common, "is_remote", lambda fn: True)
    monkeypatch.setattr(generator, "is_remote", lambda fn: True)
    draws = [next(common.drawn_seeds(own_generate)) for _ in range(3)]
    assert len(set(draws)) == 3 and min(draws) > 2**32
    judge, kernel = generator.tiny_pair_seeds(own_generate)
    assert judge != kernel and generator.clear_tiny_pair(judge) and generator.clear_tiny_pair(kernel)


_SEEDS_SENT: list = []


def spy_on_tiny_pairs():
    """(Kernel side.) What a notebook can do in its own process: wrap the lab's `_tiny_pair`, which the check's
    run_where looks up there, and keep every seed the judge sends it."""
    from autograder.lab06 import generator
    real = generator._tiny_pair

    def spy(seed=0):
        _SEEDS_SENT.append(seed)
        return real(seed)
    generator._tiny_pair = spy


def seeds_sent():
    """(Kernel side.) The seeds the spy saw."""
    return list(_SEEDS_SENT)


def own_copy_of_the_trained_target(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4, **kw):
    """Decodes on its own copy of the course's trained target (load_model, in its own process) and never calls the
    target it is handed: the judge counts zero calls, and before the judge's target was secretly perturbed its
    tokens were right."""
    from minigpt.engine.cached_generation import generate_kv_cache
    return generate_kv_cache(_own("target"), prompt, max_new_tokens, sampling, **kw)


_OWN_MODELS: dict = {}


def _own(name):
    """(Learner side.) Its own copy of one of the course's trained models, loaded once."""
    from minigpt.checkpoint import load_model
    if name not in _OWN_MODELS:
        _OWN_MODELS[name] = load_model(name)
    return _OWN_MODELS[name]


def verifies_more_than_k(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4, **kw):
    """The right tokens, from the target it is handed, but drafting with its own copy of the public target and
    verifying up to max_new_tokens drafts a call: fewer calls than k + 1 tokens a call allows."""
    return own_generate(target, _own("target"), prompt, max_new_tokens, sampling, k=max_new_tokens, **kw)


def drafts_with_its_own_draft(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4, **kw):
    """No KV cache for the draft model, on its own copy of the public draft (never the one handed in): the judge
    sees zero positions fed to its draft, below the twice-the-reference bar that catches a missing cache."""
    from minigpt.engine.ngram_draft import PromptLookupModel
    mine = draft if isinstance(draft, PromptLookupModel) else _own("draft")
    return make_generator_fn(draft_cache=False)(target, mine, prompt, max_new_tokens, sampling, k=k, **kw)


through_forward = make_generator_fn(via_forward=True)


def no_bonus_through_forward(target, draft, prompt, max_new_tokens, sampling=SamplingParams(), *, k=4, **kw):
    """No bonus token, its every forward through `model.forward(...)` (which a forward pre-hook never saw), then as many
    one-token calls of `target(...)` as a right loop makes: the counts a pre-hook saw were forged."""
    out = make_generator_fn(bonus=False, via_forward=True)(target, draft, prompt, max_new_tokens, sampling, k=k, **kw)
    for _ in range(math.ceil(len(out.tokens) / (k + 1))):
        target(torch.tensor([[0]], device=target.device), positions=torch.tensor([0], device=target.device))
    return out



def test_the_judges_target_gives_tokens_no_copy_gives(monkeypatch):
    """A generator decoding on its own copy of the trained target (the judge counts zero calls, which passed the old
    check) gives other tokens than the judge's target, secretly perturbed; were the judge's target the public one, its
    tokens would be right, and the floor on the calls (a call emits at most k + 1 tokens) would still refuse it."""
    from autograder.lab06 import speed
    from autograder.lab06.judge_target import SecretTarget
    with pytest.raises(AssertionError, match="differs from the greedy output of the target it was handed"):
        lab06.check_target_calls(own_copy_of_the_trained_target)
    from minigpt.engine.cached_generation import generate_kv_cache

    def public_target(public, seeds, kind, new_tokens, **kw):
        prompt = lab06.code_edit_prompts()[0 if kind == "argparse" else 1]
        return SecretTarget(public, prompt, generate_kv_cache(public, prompt, new_tokens, stop_token_ids=()).tokens)
    monkeypatch.setattr(speed, "secret_target", public_target)
    with pytest.raises(AssertionError, match="called the target it was handed 0 times .* at least 7 calls are needed"):
        lab06.check_target_calls(own_copy_of_the_trained_target)


def test_target_calls_need_at_least_a_call_per_k_plus_one_tokens():
    with pytest.raises(AssertionError, match=r"at least 7 calls are needed"):
        lab06.check_target_calls(verifies_more_than_k)


def test_the_draft_model_counted_is_the_one_handed_in():
    with pytest.raises(AssertionError, match="fed the draft model it was handed 0 token positions"):
        lab06.check_target_calls(drafts_with_its_own_draft)


def test_calls_through_forward_are_counted(monkeypatch):
    """A right loop calling `model.forward(...)` is counted like one calling `model(...)` (both are what a judged
    handle serves); a wrong one that did its work through `forward` and showed forged calls, which passed when the
    checks counted with forward pre-hooks, is caught."""
    from autograder.lab06 import generator, speed
    lab06.check_generate_speculative(through_forward)
    calls = lab06.check_target_calls(through_forward)
    assert 0 < calls["prompt lookup"]["learner"] < 0.5
    with pytest.raises(AssertionError):
        generator._check_generate(no_bonus_through_forward)

    def pre_hook(model, before):                 # how the checks watched models before
        return model.register_forward_pre_hook(lambda module, args, kwargs: before(args, kwargs), with_kwargs=True).remove
    monkeypatch.setattr(generator, "watch_forward", pre_hook)
    monkeypatch.setattr(speed, "watch_forward", pre_hook)
    with pytest.raises(AssertionError, match="ran 0 times"):
        generator._check_generate(through_forward)            # with pre-hooks a right loop failed, and the wrong one
    generator._check_generate(no_bonus_through_forward)       # passed on its forged calls


# --- judged: the learner's functions in another process, as in a graded notebook ------------------

@pytest.fixture(scope="module")
def learner():
    from tests.labs.judged import learner_process
    served = ["rebuilt_reference", "spy_on_tiny_pairs", "seeds_sent", "own_copy_of_the_trained_target"]
    with learner_process("tests.labs.test_lab06_checks", served) as names:
        yield names


def test_judged_the_kernel_is_never_sent_the_judges_seed(learner, monkeypatch):
    """The kernel wraps the lab's `_tiny_pair` in its own process and keeps every seed it is sent: it sees the seed of
    the pair built there, never the one of the judge's pair whose forwards are counted (before, part 4 sent it)."""
    from autograder.lab06 import generator
    drawn = []
    real = generator.tiny_pair_seeds
    monkeypatch.setattr(generator, "tiny_pair_seeds", lambda fn: drawn.append(real(fn)) or drawn[-1])
    learner["spy_on_tiny_pairs"]()
    lab06.check_generate_speculative(learner["rebuilt_reference"])
    [(judge_seed, kernel_seed)] = drawn
    assert list(learner["seeds_sent"]()) == [kernel_seed] and judge_seed != kernel_seed


def test_judged_target_calls_pass_the_solution_and_refuse_a_copy_of_the_target(learner):
    calls = lab06.check_target_calls(learner["rebuilt_reference"])
    assert calls["prompt lookup"]["learner"] == calls["prompt lookup"]["reference"]
    with pytest.raises(AssertionError, match="differs from the greedy output of the target it was handed"):
        lab06.check_target_calls(learner["own_copy_of_the_trained_target"])
