"""Lab 06 part two (exercises 7-10): the references, pasted as a learner would, pass; the stub and each plausible wrong
implementation fail; the references handed in are refused."""

from __future__ import annotations

import pytest
import torch

from autograder.lab06.head_chain import check_draft_chain
from autograder.lab06.trees import (check_keep_path, check_tree_attention_inputs, check_verify_tree,
                                    tree_distribution_test)
from minigpt.engine.head_speculative import draft_chain
from minigpt.engine.token_tree import keep_path, tree_attention_inputs, verify_tree
from tests.labs.test_lab06_checks import learner_copy

own_mask, own_verify, own_keep, own_chain = (learner_copy(tree_attention_inputs), learner_copy(verify_tree),
                                             learner_copy(keep_path), learner_copy(draft_chain))
CHECKS = {"mask": (check_tree_attention_inputs, own_mask, tree_attention_inputs),
          "verify": (check_verify_tree, own_verify, verify_tree), "keep": (check_keep_path, own_keep, keep_path),
          "chain": (check_draft_chain, own_chain, draft_chain)}


def _stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_reference_passes_stub_and_reference_refused(name):
    check, own, reference = CHECKS[name]
    check(own)
    with pytest.raises(AssertionError, match="not implemented"):
        check(_stub)
    with pytest.raises(AssertionError, match="course's reference"):
        check(reference)


# --- wrong tree masks ----------------------------------------------------------------------------

def _mask(parents, past_len, *, positions="depth", ancestors=True, self_=True, cache=True, validate=True):
    n = len(parents)
    if validate and (not n or parents[0] != -1 or any(not 0 <= q < i for i, q in enumerate(parents[1:], 1))):
        raise ValueError("bad parent")
    depth = [0] * n
    mask = torch.zeros(n, past_len + n, dtype=torch.bool)
    mask[:, :past_len] = cache
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    for i in range(n):
        if i and ancestors:
            mask[i, past_len:] = mask[parents[i], past_len:]
        elif i:
            mask[i, past_len + parents[i]] = True
        mask[i, past_len + i] = self_
    if positions == "depth":
        pos = past_len + torch.tensor(depth)
    else:
        pos = past_len + torch.arange(n)
    return mask, pos


WRONG_MASKS = {
    "position = past + index": lambda p, L: _mask(p, L, positions="index"),
    "parent only, not every ancestor": lambda p, L: _mask(p, L, ancestors=False),
    "a node does not see itself": lambda p, L: _mask(p, L, self_=False),
    "the cache is hidden": lambda p, L: _mask(p, L, cache=False),
    "the causal mask whatever the tree": lambda p, L: (torch.ones(len(p), L + len(p), dtype=torch.bool).tril(L),
                                                       L + torch.arange(len(p))),
    "bad parents accepted": lambda p, L: _mask(p, L, validate=False),
}


@pytest.mark.parametrize("name", sorted(WRONG_MASKS))
def test_wrong_masks_rejected(name):
    with pytest.raises(AssertionError):
        check_tree_attention_inputs(WRONG_MASKS[name])


# --- wrong verification --------------------------------------------------------------------------

def _verify(tokens, parents, p, q=None, *, greedy, generator=None, first_child_only=False, keep_r=False,
            last_from_p=False, q_of_child=False, leaf_argmax=False, global_rng=False, residual_ge=False):
    if global_rng:
        generator = None
    n = len(parents)
    kids = [[i for i in range(n) if parents[i] == node] for node in range(n)]
    path, node = [], 0
    while True:
        if greedy:
            best = int(p[node].argmax())
            options = kids[node][:1] if first_child_only else kids[node]
            match = next((c for c in options if tokens[c] == best), None)
            if match is None:
                return path, [tokens[c] for c in path] + [best]
            path.append(match)
            node = match
            continue
        r = p[node].float()
        if not kids[node] and leaf_argmax:
            return path, [tokens[c] for c in path] + [int(r.argmax())]
        for c in kids[node]:
            qq = q[c] if q_of_child else q[node]
            x = tokens[c]
            if float(torch.rand((), generator=generator)) < min(1.0, float(r[x] / qq[x].clamp_min(1e-30))):
                path.append(c)
                node = c
                break
            if not keep_r:
                res = (r - qq).clamp_min(0)
                if res.sum() > 0 or (residual_ge and res.sum() >= 0):
                    r = res / res.sum()
        else:
            last = p[node] if last_from_p else r
            return path, [tokens[c] for c in path] + [int(torch.multinomial(last, 1, generator=generator))]


WRONG_VERIFY = {
    "greedy looks at the first child only": dict(first_child_only=True),
    "the residual is not updated between siblings": dict(keep_r=True),
    "the last token drawn from p, not the residual": dict(last_from_p=True),
    "the child's q instead of its parent's": dict(q_of_child=True),
    "an accepted leaf emits the argmax": dict(leaf_argmax=True),
    "draws from torch's global generator": dict(global_rng=True),
    "a residual that rounds to zero divided by its sum": dict(residual_ge=True),
}


@pytest.mark.parametrize("name", sorted(WRONG_VERIFY))
def test_wrong_verify_rejected(name):
    options = WRONG_VERIFY[name]

    def wrong(tokens, parents, p, q=None, *, greedy, generator=None):
        return _verify(tokens, parents, p, q, greedy=greedy, generator=generator, **options)
    with pytest.raises(AssertionError):
        check_verify_tree(wrong)


@pytest.mark.parametrize("name", ["the residual is not updated between siblings",
                                  "the last token drawn from p, not the residual", "an accepted leaf emits the argmax"])
def test_the_distribution_test_rejects_sampling_mistakes_under_other_seeds(name):
    """The judged check draws no seed for the distribution test, but its verdict must not hang on seed 0."""
    options = WRONG_VERIFY[name]

    def wrong(tokens, parents, p, q=None, *, greedy, generator=None):
        return _verify(tokens, parents, p, q, greedy=greedy, generator=generator, **options)
    for seed in (1, 2):
        assert min(r.p_value for r in tree_distribution_test(wrong, seed=seed)) < 1e-3


# --- wrong cache rollbacks -----------------------------------------------------------------------

def _keep(cache, start, nodes, *, copy=True, values=True, shift=0, all_layers=True, validate=True):
    if validate and nodes and start + max(nodes) >= cache.length:
        raise ValueError(f"nodes past the cache's {cache.length} positions")
    layers = list(cache) if all_layers else list(cache)[:1]
    for layer in layers:
        if copy:
            idx = torch.tensor([start + n + shift for n in nodes], dtype=torch.long)
            if len(nodes):
                layer.k[:, start:start + len(nodes)] = layer.k[:, idx.clamp(max=layer.k.shape[1] - 1)]
                if values:
                    layer.v[:, start:start + len(nodes)] = layer.v[:, idx.clamp(max=layer.v.shape[1] - 1)]
        layer.length = start + len(nodes)


WRONG_KEEP = {
    "only the length set": dict(copy=False), "keys moved, values left": dict(values=False),
    "off by one": dict(shift=1), "the first layer only": dict(all_layers=False), "no check": dict(validate=False),
}


@pytest.mark.parametrize("name", sorted(WRONG_KEEP))
def test_wrong_keep_path_rejected(name):
    options = WRONG_KEEP[name]
    with pytest.raises(AssertionError):
        check_keep_path(lambda cache, start, nodes: _keep(cache, start, nodes, **options))


# --- wrong chains --------------------------------------------------------------------------------

def _chain(head, target, cache, features, tokens, k, *, own_feature=True, shift=1, feed_last=False, no_cache=False):
    f, x = features[None], torch.tensor([list(tokens)])
    drafts = []
    with torch.inference_mode():
        if no_cache:
            feats, toks, base = features, list(tokens), cache.length
            for i in range(k):
                pred, logits = head(feats[None], torch.tensor([toks]), target, base + 1 + torch.arange(len(toks)))
                drafts.append(int(logits[0, -1].argmax()))
                feats, toks = torch.cat([feats, pred[0, -1:]]), toks + [drafts[-1]]
            if k:
                head(features[None], torch.tensor([list(tokens)]), target, base + 1 + torch.arange(len(tokens)), cache)
            return drafts
        for i in range(k):
            predicted, logits = head(f, x, target, cache.length + shift + torch.arange(x.shape[1]), cache)
            drafts.append(int(logits[0, -1].argmax()))
            if i < k - 1 or feed_last:
                f = predicted[:, -1:] if own_feature else features[None, -1:]
                x = torch.tensor([[drafts[-1]]])
        if feed_last and k:
            head(f, x, target, cache.length + 1 + torch.arange(1), cache)
    return drafts


WRONG_CHAINS = {
    "the target's last feature fed again": dict(own_feature=False), "positions from cache.length": dict(shift=0),
    "the last draft fed too": dict(feed_last=True), "the pairs re-read every step, no cache": dict(no_cache=True),
}


@pytest.mark.parametrize("name", sorted(WRONG_CHAINS))
def test_wrong_chains_rejected(name):
    options = WRONG_CHAINS[name]
    with pytest.raises(AssertionError):
        check_draft_chain(lambda *args: _chain(*args, **options))


def test_the_tree_checks_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    check_verify_tree(own_verify)
    assert torch.equal(torch.random.get_rng_state(), state)
