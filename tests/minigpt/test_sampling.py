"""Sampling: greedy, top-k, top-p, seeds."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.sampling import SamplingParams, filter_logits, make_generator, sample_next


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 0.0, 4.9]])
    assert sample_next(logits, SamplingParams()).tolist() == [1, 0]


@settings(max_examples=50, deadline=None)
@given(k=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_top_k_only_draws_from_the_k_best(k, seed):
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(seed))
    allowed = set(torch.topk(logits[0], k).indices.tolist())
    params = SamplingParams(temperature=1.5, top_k=k, seed=seed)
    gen = make_generator(params)
    draws = {int(sample_next(logits, params, gen)) for _ in range(40)}
    assert draws <= allowed


@settings(max_examples=50, deadline=None)
@given(p=st.floats(0.05, 0.999), seed=st.integers(0, 2**31))
def test_top_p_keeps_the_smallest_nucleus(p, seed):
    logits = torch.randn(1, 30, generator=torch.Generator().manual_seed(seed)) * 3
    kept = torch.isfinite(filter_logits(logits, top_p=p))[0]
    probs = logits.softmax(-1)[0]
    order = probs.argsort(descending=True)
    n = int(kept.sum())
    assert kept[order[:n]].all(), "kept tokens must be the most likely ones"
    assert probs[order[:n]].sum() >= p - 1e-6, "the nucleus must reach top_p"
    assert n == 1 or probs[order[: n - 1]].sum() < p + 1e-6, "the nucleus must be the smallest that reaches top_p"


def test_seeded_sampling_repeats_and_seeds_differ():
    logits = torch.zeros(1, 1000)
    draw = lambda seed: [int(sample_next(logits, SamplingParams(1.0, seed=seed), g)) for g in [make_generator(SamplingParams(seed=seed))] for _ in range(10)]
    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_temperature_sharpens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    params = SamplingParams(temperature=0.05, seed=1)
    gen = make_generator(params)
    assert {int(sample_next(logits, params, gen)) for _ in range(50)} == {0}


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_top_p_one_keeps_every_token():
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(filter_logits(logits, top_p=1.0), logits)


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-39, 1e-30])
def test_tiny_temperature_is_greedy_never_nan(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g) * 10
    got = sample_next(logits, SamplingParams(temperature=temperature, seed=1), torch.Generator().manual_seed(1))
    assert torch.equal(got, logits.argmax(-1))


@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 1e-10])
def test_tiny_top_p_keeps_the_most_likely_token(top_p):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 40, generator=g)
    got = sample_next(logits, SamplingParams(temperature=1.0, top_p=top_p), torch.Generator().manual_seed(2))
    assert torch.equal(got, logits.argmax(-1))


def test_non_finite_logits_raise_instead_of_sampling_nan():
    logits = torch.full((1, 8), float("nan"))
    with pytest.raises(ValueError, match="not finite"):
        sample_next(logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
