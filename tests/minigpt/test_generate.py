"""The naive generation baseline: stopping rules, seeds, context limits."""

import pytest
import torch

from minigpt.generate import StopRule, check_request, generate_naive
from minigpt.sampling import SamplingParams
from minigpt.tokenizer import load_tokenizer


def test_greedy_matches_manual_argmax_loop(tiny_model):
    prompt = [1, 2, 3]
    out = generate_naive(tiny_model, prompt, 5, stop_token_ids=())
    ids = list(prompt)
    for _ in range(5):
        ids.append(int(tiny_model(torch.tensor([ids]))[0, -1].argmax()))
    assert out.tokens == ids[3:] and out.finish_reason == "length" and out.prompt_tokens == 3


def test_seeded_sampling_repeats(tiny_model):
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=11)
    a = generate_naive(tiny_model, [5], 12, params, stop_token_ids=())
    b = generate_naive(tiny_model, [5], 12, params, stop_token_ids=())
    c = generate_naive(tiny_model, [5], 12, SamplingParams(temperature=1.0, seed=12), stop_token_ids=())
    assert a.tokens == b.tokens != c.tokens


def test_stops_on_stop_token(tiny_model):
    first = generate_naive(tiny_model, [1, 2], 1, stop_token_ids=()).tokens[0]
    out = generate_naive(tiny_model, [1, 2], 10, stop_token_ids=(first,))
    assert out.tokens == [] and out.finish_reason == "stop_token"


def test_stop_strings():
    enc = load_tokenizer()
    rule = StopRule(100, stop_token_ids=(), stop_strings=["return"], tokenizer=enc)
    reasons = [rule.add(t) for t in enc.encode("x = 1\n    return")]
    assert reasons[-1] == "stop_string" and all(r is None for r in reasons[:-1])
    with pytest.raises(ValueError, match="tokenizer"):
        StopRule(5, stop_strings=["x"])


def test_prompt_that_fills_the_context_exactly(tiny_model, tiny_config):
    prompt = [3] * (tiny_config.max_seq_len - 2)
    assert len(generate_naive(tiny_model, prompt, 2, stop_token_ids=()).tokens) == 2
    with pytest.raises(ValueError, match="exceeds the context"):
        generate_naive(tiny_model, prompt, 3)


@pytest.mark.parametrize("prompt,n,match", [([], 3, "empty"), ([1, 999], 3, "outside the vocabulary"), ([1], -1, ">= 0")])
def test_bad_requests(tiny_model, prompt, n, match):
    with pytest.raises(ValueError, match=match):
        check_request(tiny_model, prompt, n)


def test_zero_new_tokens(tiny_model):
    assert generate_naive(tiny_model, [1], 0).tokens == []
