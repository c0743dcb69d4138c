"""Speculative decoding with a draft head: greedy output is the target's, for chains and trees; the head's cache.

Two heads for one small random target: a random one, whose drafts the target never accepts (every round emits the
target's one token), and an echoing one, whose drafts it accepts in full, in part or not at all (so accepted paths,
the cache entries they keep and the bonus token are exercised too)."""

import pytest
import torch

from autograder.lab06.head_chain import tiny_target_and_head
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.draft_head import head_cache, load_draft_head, target_features
from minigpt.engine.head_speculative import TreeShape, draft_chain, generate_with_head, grow_tree
from minigpt.engine.token_tree import tree_depths
from minigpt.sampling import SamplingParams


SHAPES = [TreeShape(0), TreeShape(1), TreeShape(3), TreeShape(3, 2, 2), TreeShape(2, 3, 3)]
PROMPT_LENGTHS = [1, 2, 9]


@pytest.fixture(scope="module")
def tiny():
    return tiny_target_and_head(3)


def echoing_head(target, head, scale: float = 0.3):
    """The head made to pass the token's embedding on (its fc an identity on the token half), the feature half, the
    attention and the MLP scaled by `scale`: it mostly drafts "the same token again", which this target often says."""
    d = target.config.d_model
    with torch.no_grad():
        head.fc.weight[:, d:] = torch.eye(d)
        head.fc.weight[:, :d] *= scale
        head.block.attn.wo.weight *= scale
        head.block.mlp.w_down.weight *= scale
    return head


@pytest.fixture(scope="module")
def heads(tiny):
    target, head = tiny
    _, another = tiny_target_and_head(3)                 # the same random head, to be made an echoing one
    return {"random": (target, head), "echoing": (target, echoing_head(target, another))}


def chain_without_cache(head, target, features, tokens, n: int) -> list[int]:
    """The head's greedy chain of n drafts, one pair at a time, without a cache: each step rereads every pair
    (f_{t-1}, x_t) and appends its own predicted feature and draft."""
    feats, toks, drafts = features, list(tokens), []
    for _ in range(n):
        pred, logits = head(feats[None], torch.tensor([toks]), target, torch.arange(1, len(toks) + 1))
        drafts.append(int(logits[0, -1].argmax()))
        feats, toks = torch.cat([feats, pred[0, -1:]]), toks + [drafts[-1]]
    return drafts


def _runs(target, head, shape, prompt_len):
    prompt = list(range(5, 5 + prompt_len))
    want = generate_kv_cache(target, prompt, 20, stop_token_ids=()).tokens
    return want, generate_with_head(target, head, prompt, 20, shape=shape, stop_token_ids=())


@pytest.mark.parametrize("head_kind", ["random", "echoing"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("prompt_len", PROMPT_LENGTHS)
def test_greedy_output_is_the_targets(heads, head_kind, shape, prompt_len):
    want, out = _runs(*heads[head_kind], shape, prompt_len)
    assert out.tokens == want and out.finish_reason == "length"


def test_the_two_heads_exercise_rejection_and_acceptance(heads):
    """What makes the test above mean something: the random head's drafts are all rejected; the echoing head's are
    accepted in full (depth + 1 tokens a round), in part and not at all."""
    rounds = {kind: [(shape, r) for shape in SHAPES if shape.depth for n in PROMPT_LENGTHS
                     for r in _runs(*heads[kind], shape, n)[1].rounds] for kind in heads}
    assert {len(r.emitted) for _, r in rounds["random"]} == {1}
    echoed = [(len(r.emitted), shape.depth + 1) for shape, r in rounds["echoing"]]
    assert any(e == full for e, full in echoed) and any(e == 1 for e, _ in echoed) \
        and any(1 < e < full for e, full in echoed)


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
        assert drafts == chain_without_cache(head, target, f[0, :5], prompt[1:], 4)


@pytest.mark.parametrize("prompt_len", PROMPT_LENGTHS)
def test_each_round_drafts_what_the_head_drafts_from_the_whole_context(heads, prompt_len):
    """The features a round hands on (the target's, at the root and the accepted nodes) decide the next drafts but
    never the output: each chain round's drafts equal the head's chain drafted afresh, without caches, from the
    target's features of everything emitted so far."""
    target, head = heads["echoing"]
    prompt = list(range(5, 5 + prompt_len))
    out = generate_with_head(target, head, prompt, 20, shape=TreeShape(3), stop_token_ids=())
    context = list(prompt)
    with torch.inference_mode():
        for r in out.rounds:
            if len(context) > 1:                       # a one-token context has no (feature, token) pair to read
                f, _ = target_features(target, torch.tensor([context]))
                drafts = chain_without_cache(head, target, f[0, :len(context) - 1], context[1:], len(r.tokens) - 1)
                assert r.tokens[1:] == drafts, (len(context), r.tokens, drafts)   # 3 drafts, fewer at the budget's end
            context += r.emitted


@pytest.mark.parametrize("shape", [TreeShape(3, 2, 2), TreeShape(2, 3, 3)])
def test_each_tree_is_the_tree_grown_afresh_from_the_whole_context(heads, shape):
    """Trees: what a round hands the next (the target's features at the root and the accepted nodes, the pairs its
    head cache keeps) leaves each round's tree equal to `grow_tree` run with a fresh head cache on the target's
    features of everything emitted so far."""
    target, head = heads["echoing"]
    prompt = list(range(5, 14))
    out = generate_with_head(target, head, prompt, 20, shape=shape, stop_token_ids=())
    assert any(r.path and r.path != list(range(1, len(r.path) + 1)) for r in out.rounds), "no path off the first nodes"
    context = list(prompt)
    with torch.inference_mode():
        for r in out.rounds:
            f, _ = target_features(target, torch.tensor([context]))
            depth = max(tree_depths(r.parents))
            fresh = grow_tree(head, target, head_cache(head, 64), f[0, :len(context) - 1], context[1:],
                              TreeShape(depth, shape.width, shape.branch))
            assert (r.tokens, r.parents) == (fresh.tokens, fresh.parents), len(context)
            context += r.emitted
