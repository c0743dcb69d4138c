"""Speculative decoding reference (minigpt.engine.speculative, ngram_draft, cache.rollback) and its calculator."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from minigpt_fixtures import TINY
from recorded_logprobs import Steps, assert_same_steps, record_sampling, with_logprobs

from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.engine import cached_generation
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.ngram_draft import PromptLookupDrafter, ngram_propose
from minigpt.engine.speculative import (SpeculativeGeneration, acceptance_by_position, generate_speculative,
                                        measured_alpha, sampling_probs, verify_draft)
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, filter_logits
from minigpt.teaching.goodness_of_fit import chi2_sf, chi_square_test
from minigpt.costmodel.speculative_calculator import (acceptance_rate, best_k, break_even_alpha, break_even_batch,
                                                     expected_tokens_per_round, speculative_speedup)


@pytest.fixture
def pair(tiny_model):
    draft = copy.deepcopy(tiny_model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        draft.tok_emb.weight.add_(torch.randn(draft.tok_emb.weight.shape, generator=g) * 0.02)
    return tiny_model, draft


@pytest.fixture
def disagreeing_pair():
    """A target whose small embeddings leave its attention and MLP a say (the tiny model mostly repeats its last
    token, and so does any copy of it: every draft accepted), and a draft with every weight moved by 0.3 of its
    spread: its drafts are accepted in full, in part and not at all."""
    with torch.random.fork_rng(devices=[]):          # GPT's initialisation draws from the global RNG: left as it was
        torch.manual_seed(0)
        target = GPT(TINY).eval()
    with torch.no_grad():
        target.tok_emb.weight.mul_(0.2)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3 * p.std())
    return target, draft


def test_truncate_cache_keeps_prefix_and_refuses_growth(tiny_config):
    cache = KVCache.for_model(tiny_config)
    k = torch.randn(1, 5, tiny_config.n_kv_heads, tiny_config.head_dim)
    for layer in cache:
        layer.update(k, k)
    truncate_cache(cache, 3)
    assert cache.length == 3
    for bad in (4, -1, 2.0, True):
        with pytest.raises(ValueError, match="3"):
            truncate_cache(cache, bad)
    assert cache.length == 3
    k2 = torch.randn(1, 1, tiny_config.n_kv_heads, tiny_config.head_dim)
    k_all, _ = cache[0].update(k2, k2)
    assert torch.equal(k_all, torch.cat([k[:, :3], k2], 1))


def test_sampling_probs_matches_the_sampler():
    logits = torch.randn(3, 20) * 2
    assert torch.equal(sampling_probs(logits, SamplingParams()), torch.nn.functional.one_hot(logits.argmax(-1), 20).float())
    s = SamplingParams(temperature=0.7, top_k=5, top_p=0.9)
    want = torch.softmax(filter_logits(logits / 0.7, 5, 0.9), -1)
    assert torch.allclose(sampling_probs(logits, s), want)
    assert sampling_probs(logits[None], s).shape == (1, 3, 20)


def test_verify_draft_accepts_everything_when_p_equals_q_and_adds_a_bonus():
    p = torch.softmax(torch.randn(4, 9), -1)
    emitted, accept = verify_draft([1, 2, 3], p[:3], p, torch.Generator().manual_seed(0))
    assert emitted[:3] == [1, 2, 3] and len(emitted) == 4
    assert torch.allclose(accept, torch.ones(3))


def test_verify_draft_greedy_and_shapes():
    eye = torch.eye(5)
    assert verify_draft([1, 2], eye[[1, 2]], eye[[1, 3, 0]])[0] == [1, 3]
    assert verify_draft([], torch.zeros(0, 5), eye[[4]])[0] == [4]
    with pytest.raises(ValueError, match="shape"):
        verify_draft([1, 2], eye[[1, 2]], eye[[1, 3]])


def test_verify_draft_first_token_has_the_target_distribution():
    """One position, exact: P(emit x) = p(x). Chi-square on 4000 draws."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    counts = torch.zeros(4)
    for _ in range(4000):
        t = int(torch.multinomial(q, 1, generator=g))
        emitted, accept = verify_draft([t], q[None], torch.stack([p, p]), g)
        counts[emitted[0]] += 1
        assert float(accept[0]) == pytest.approx(min(1.0, float(p[t] / q[t])))
    assert counts[3] == 0
    assert chi_square_test(counts, p).p_value > 1e-3


def test_chi2_sf_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, abs=1e-9)
    assert chi_square_test(torch.tensor([0, 10]), torch.tensor([1.0, 0.0])).p_value == 0.0


def speculative_with_logprobs(target: GPT, draft, prompt: list[int], max_new_tokens: int,
                              **kwargs) -> tuple[SpeculativeGeneration, Steps]:
    """generate_speculative, and its tokens with their log-probabilities under the target's logits that verified
    them (this random model mostly repeats its last token: the tokens alone would not show K/V read wrong)."""
    verified: list[torch.Tensor] = []
    hook = target.register_forward_hook(lambda module, args, logits: verified.append(logits[0]))
    try:
        got = generate_speculative(target, draft, prompt, max_new_tokens, **kwargs)
    finally:
        hook.remove()
    rows = [logits[-len(r.drafted) - 1:][:len(r.emitted)] for logits, r in zip(verified, got.rounds, strict=True)]
    emitted = [t for r in got.rounds for t in r.emitted]
    return got, with_logprobs(torch.cat(rows), emitted)[:len(got.tokens)] if rows else []


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("which", ["pair", "disagreeing_pair"])
def test_greedy_equals_target_greedy(which, k, monkeypatch, request):
    target, draft = request.getfixturevalue(which)
    emitted = []
    for seed in range(3):
        prompt = torch.randint(0, 64, (4 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        sampled = record_sampling(monkeypatch, cached_generation)
        want = generate_kv_cache(target, prompt, 20, stop_token_ids=())
        got, found = speculative_with_logprobs(target, draft, prompt, 20, k=k, stop_token_ids=())
        assert got.tokens == want.tokens and got.finish_reason == "length"
        assert_same_steps([found], sampled, f"speculative decoding (k={k}, seed {seed})")
        assert sum(len(r.emitted) for r in got.rounds) >= 20
        emitted += [len(r.emitted) for r in got.rounds if len(r.drafted) == k]
    if which == "disagreeing_pair":         # rejection exercised: drafts refused and accepted; in part at k = 5
        assert 1 in emitted and k + 1 in emitted and (k != 5 or any(1 < e < k + 1 for e in emitted)), emitted


def test_identical_draft_accepts_every_draft(tiny_model):
    got = generate_speculative(tiny_model, copy.deepcopy(tiny_model), [1, 2, 3], 20, SamplingParams(temperature=1.0),
                               k=3, stop_token_ids=())
    assert [len(r.emitted) for r in got.rounds] == [4] * 5
    assert measured_alpha(got.rounds) == 1.0 and acceptance_by_position(got.rounds, 3) == [1.0, 1.0, 1.0]


def test_stop_token_budget_and_k_zero(pair):
    target, draft = pair
    ref = generate_kv_cache(target, [5, 6], 20, stop_token_ids=())
    stop = ref.tokens[4]
    want = generate_kv_cache(target, [5, 6], 20, stop_token_ids=(stop,))
    got = generate_speculative(target, draft, [5, 6], 20, k=4, stop_token_ids=(stop,))
    assert (got.tokens, got.finish_reason) == (want.tokens, want.finish_reason)
    assert generate_speculative(target, draft, [5, 6], 7, k=0, stop_token_ids=()).tokens == ref.tokens[:7]
    assert generate_speculative(target, draft, [5, 6], 0, k=3).tokens == []
    with pytest.raises(ValueError, match="k"):
        generate_speculative(target, draft, [5, 6], 3, k=-1)
    S = target.config.max_seq_len
    assert len(generate_speculative(target, draft, [1] * (S - 5), 5, k=4, stop_token_ids=()).tokens) == 5


def test_prompt_lookup_drafting_is_lossless_in_greedy(tiny_model, monkeypatch):
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    sampled = record_sampling(monkeypatch, cached_generation)
    want = generate_kv_cache(tiny_model, prompt, 16, stop_token_ids=())
    got, found = speculative_with_logprobs(tiny_model, PromptLookupDrafter(tiny_model.config.vocab_size), prompt, 16,
                                           k=3, stop_token_ids=())
    assert got.tokens == want.tokens
    assert_same_steps([found], sampled, "speculative decoding with prompt lookup")


def test_ngram_propose_cases():
    assert ngram_propose([1, 2, 3, 4, 1, 2], 2) == [3, 4]
    assert ngram_propose([7, 1, 2, 9, 1, 2, 5, 5, 1, 2], 3) == [5, 5, 1]
    assert ngram_propose([1, 2, 3], 4) == []
    assert ngram_propose([3, 3, 3, 3], 4) == [3]          # n = 3 matches at 0; only one token follows it
    with pytest.raises(ValueError):
        ngram_propose([1, 2], 2, max_n=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=30), st.integers(0, 6), st.integers(1, 4))
def test_ngram_proposals_follow_an_earlier_match(context, k, max_n):
    out = ngram_propose(context, k, max_n)
    assert len(out) <= k
    if out:
        L = len(context)
        assert any(context[s + n:s + n + len(out)] == out and context[s:s + n] == context[L - n:]
                   for n in range(1, max_n + 1) for s in range(0, L - n))


def test_calculator_formula():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(sum(0.8 ** i for i in range(5)))
    p, q = torch.tensor([0.5, 0.3, 0.2, 0.0]), torch.tensor([0.1, 0.6, 0.2, 0.1])
    assert float(acceptance_rate(p, q)) == pytest.approx(0.6)
    s = speculative_speedup(0.62, 3, target_step_s=3.5, draft_step_s=0.7, verify_s=5.1)
    assert s == pytest.approx(expected_tokens_per_round(0.62, 3) * 3.5 / (3 * 0.7 + 5.1))
    k, best = best_k(0.62, target_step_s=3.5, draft_step_s=0.7, verify_s=lambda k: 3.5 + 0.4 * k)
    assert 1 <= k <= 8 and best >= s
    a = break_even_alpha(3, target_step_s=10, draft_step_s=2, verify_s=12)
    assert expected_tokens_per_round(a, 3) == pytest.approx(1.8)
    assert break_even_alpha(3, target_step_s=10, draft_step_s=0, verify_s=5) == 0.0
    assert math.isinf(break_even_alpha(1, target_step_s=1, draft_step_s=1, verify_s=2))
    assert break_even_batch(0.8, 4, memory_s=10, per_token_s=0.05) == 135
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.5, 2)
