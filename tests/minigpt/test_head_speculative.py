"""Speculative decoding with a draft head: greedy output is the target's, for chains and trees; the head's cache."""

import pytest
import torch

from autograder.lab06.head_chain import tiny_target_and_head
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.draft_head import head_cache, load_draft_head, target_features
from minigpt.engine.head_speculative import TreeShape, draft_chain, generate_with_head
from minigpt.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return tiny_target_and_head(3)


@pytest.mark.parametrize("shape", [TreeShape(0), TreeShape(1), TreeShape(3), TreeShape(3, 2, 2), TreeShape(2, 3, 3)])
@pytest.mark.parametrize("prompt_len", [1, 2, 9])
def test_greedy_output_is_the_targets(tiny, shape, prompt_len):
    target, head = tiny
    prompt = list(range(5, 5 + prompt_len))
    want = generate_kv_cache(target, prompt, 20, stop_token_ids=()).tokens
    out = generate_with_head(target, head, prompt, 20, shape=shape, stop_token_ids=())
    assert out.tokens == want and out.finish_reason == "length"


def test_the_trained_head_drafts_what_the_target_says():
    from minigpt.checkpoint import load_model
    from minigpt.training.data import load_tokens
    target, head = load_model("target"), load_draft_head()
    prompt = load_tokens("val")[:48].tolist()
    want = generate_kv_cache(target, prompt, 24, stop_token_ids=()).tokens
    out = generate_with_head(target, head, prompt, 24, shape=TreeShape(3, 2, 2), stop_token_ids=())
    assert out.tokens == want
    assert out.tokens_per_round > 2.0           # measured 3.3 on held-out text


def test_sampling_is_seeded_and_stops(tiny):
    target, head = tiny
    s = SamplingParams(temperature=1.0, seed=7)
    a = generate_with_head(target, head, [1, 2, 3], 16, s, shape=TreeShape(2, 2, 2), stop_token_ids=())
    b = generate_with_head(target, head, [1, 2, 3], 16, s, shape=TreeShape(2, 2, 2), stop_token_ids=())
    assert a.tokens == b.tokens and len(a.tokens) == 16
    stop = a.tokens[4]
    c = generate_with_head(target, head, [1, 2, 3], 16, s, shape=TreeShape(2, 2, 2), stop_token_ids=(stop,))
    assert c.tokens == a.tokens[:a.tokens.index(stop)] and c.finish_reason == "stop_token"


def test_draft_chain_feeds_its_own_features(tiny):
    target, head = tiny
    prompt = [4, 9, 1, 7, 3, 8]
    with torch.inference_mode():
        f, _ = target_features(target, torch.tensor([prompt]))
        cache = head_cache(head, 32)
        drafts = draft_chain(head, target, cache, f[0, :5], prompt[1:], 4)
        assert cache.length == 5 + 3
        # the same chain, one pair at a time, without the cache
        feats, toks, again = f[0, :5], prompt[1:], []
        for _ in range(4):
            pred, logits = head(feats[None], torch.tensor([toks]), target, torch.arange(1, len(toks) + 1))
            again.append(int(logits[0, -1].argmax()))
            feats, toks = torch.cat([feats, pred[0, -1:]]), toks + [again[-1]]
    assert drafts == again
