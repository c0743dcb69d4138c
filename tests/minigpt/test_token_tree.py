"""Token trees: the attention inputs, verification (greedy and sampled) and keeping the accepted path."""

import pytest
import torch

from minigpt.attention import causal_mask
from minigpt.cache.contiguous import KVCache
from minigpt.config import ModelConfig
from minigpt.engine.token_tree import check_parents, keep_path, tree_attention_inputs, tree_depths, verify_tree


def test_the_docstring_tree_and_a_chain():
    mask, positions = tree_attention_inputs([-1, 0, 0, 1, 2, 2], 2)
    assert positions.tolist() == [2, 3, 3, 4, 4, 4]
    assert mask[:, :2].all()
    assert mask[:, 2:].int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
                                         [1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 0, 1]]
    chain, pos = tree_attention_inputs([-1, 0, 1, 2], 3)
    assert torch.equal(chain, causal_mask(4, 7)) and pos.tolist() == [3, 4, 5, 6]


@pytest.mark.parametrize("parents", [[], [0], [-1, 1], [-1, 0, 5], [-1, True]])
def test_bad_trees_are_refused(parents):
    with pytest.raises(ValueError, match="parent|root"):
        check_parents(parents)


def test_depths():
    assert tree_depths([-1, 0, 1, 1, 0, 4]) == [0, 1, 2, 2, 1, 2]


def test_greedy_walk_takes_the_sibling_holding_the_argmax():
    tokens, parents = [9, 3, 4, 5, 6], [-1, 0, 0, 2, 2]
    p = torch.zeros(5, 10)
    p[0, 4] = p[2, 6] = p[4, 1] = 1.0          # root -> 4 (node 2) -> 6 (node 4) -> leaf: bonus 1
    assert verify_tree(tokens, parents, p, greedy=True) == ([2, 4], [4, 6, 1])
    p[2] = 0.0
    p[2, 7] = 1.0                              # no child of node 2 holds 7
    assert verify_tree(tokens, parents, p, greedy=True) == ([2], [4, 7])


def test_sampled_verification_keeps_the_target_distribution():
    """Two children of the root drawn from q; the first emitted token must follow p (total variation < 0.02)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    counts = torch.zeros(4)
    n = 20_000
    for _ in range(n):
        kids = torch.multinomial(q, 2, replacement=True, generator=g).tolist()
        tokens, parents = [0] + kids, [-1, 0, 0]
        P = torch.stack([p, p, p])
        Q = torch.stack([q, torch.zeros(4), torch.zeros(4)])
        _, emitted = verify_tree(tokens, parents, P, Q, greedy=False, generator=g)
        counts[emitted[0]] += 1
    assert (counts / n - p).abs().sum() / 2 < 0.02


def test_keep_path_moves_the_accepted_nodes():
    cfg = ModelConfig(vocab_size=16, max_seq_len=16, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16)
    cache = KVCache.for_model(cfg)
    k = torch.arange(10.0).view(1, 10, 1, 1).expand(1, 10, 1, cfg.head_dim).contiguous()
    for layer in cache:
        layer.update(k, -k)
    keep_path(cache, 4, [0, 2, 5])
    assert cache.length == 7
    assert cache[1].k[0, :7, 0, 0].tolist() == [0, 1, 2, 3, 4, 6, 9]
    assert cache[0].v[0, :7, 0, 0].tolist() == [0, -1, -2, -3, -4, -6, -9]
    with pytest.raises(ValueError, match="7 positions"):
        keep_path(cache, 4, [0, 5])
    assert cache.length == 7
