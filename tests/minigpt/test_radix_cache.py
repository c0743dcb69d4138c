"""The radix-tree prefix cache: matching, splitting at block boundaries, the first copy kept, LRU eviction of
unreferenced leaves, and its invariants under random operations (hypothesis)."""

import pytest
from hypothesis import given, settings, strategies as st

from minigpt.cache.block_pool import BlockPool
from minigpt.cache.radix_cache import RadixCache

BS = 2


def _request(pool, tree, tokens):
    """What a request does: reuse the cached prefix (incref), compute the rest into new blocks, cache its blocks."""
    hit = tree.match(tokens)
    for b in hit:
        pool.incref(b)
    need = -(-len(tokens) // BS) - len(hit)
    table = hit + pool.allocate(need)
    tree.insert(tokens, table)
    return hit, table


def _release(pool, table):
    for b in table:
        pool.free(b)


def test_match_split_and_full_hit():
    pool = BlockPool(16, BS)
    tree = RadixCache(pool)
    hit, a = _request(pool, tree, [1, 2, 3, 4, 5, 6])
    assert hit == [] and len(tree.nodes()) == 1
    hit, b = _request(pool, tree, [1, 2, 3, 4, 9, 9, 7])       # shares 2 of the 3 blocks: the edge splits
    assert hit == a[:2] and len(tree.nodes()) == 3
    assert tree.match([1, 2, 3, 4, 5, 6]) == a                   # a full-prefix hit walks across the split
    assert tree.match([1, 2, 3]) == a[:1]                        # whole blocks only
    assert tree.cached_tokens() == 8
    assert [pool.ref_counts[x] for x in a] == [3, 3, 2]          # tree + both requests on the shared blocks


def test_same_prefix_computed_twice_is_cached_once():
    pool = BlockPool(16, BS)
    tree = RadixCache(pool)
    first, second = pool.allocate(2), pool.allocate(2)          # two requests in one step, no hit for either
    assert tree.insert([5, 6, 7, 8], first) == 2
    assert tree.insert([5, 6, 7, 8], second) == 0                # the first copy stays
    assert tree.match([5, 6, 7, 8]) == first
    _release(pool, second)
    assert all(pool.is_free(b) for b in second)


def test_eviction_takes_unreferenced_lru_leaves_first():
    pool = BlockPool(8, BS)
    tree = RadixCache(pool)
    _, a = _request(pool, tree, [1, 1, 2, 2])
    _, b = _request(pool, tree, [3, 3, 4, 4])
    _release(pool, a)
    assert tree.evict(10) == 2                                   # b is still held: only a's blocks go
    assert tree.match([1, 1, 2, 2]) == [] and tree.match([3, 3, 4, 4]) == b
    _release(pool, b)
    _, c = _request(pool, tree, [5, 5])
    _release(pool, c)
    tree.match([3, 3, 4, 4])                                     # b used after c: c is the LRU leaf
    assert tree.evict(1) == 1 and tree.match([5, 5]) == [] and tree.match([3, 3, 4, 4]) == b


def test_an_emptied_leaf_makes_its_parent_evictable():
    pool = BlockPool(8, BS)
    tree = RadixCache(pool)
    _, a = _request(pool, tree, [1, 1, 2, 2])
    _, b = _request(pool, tree, [1, 1, 3, 3])                    # root edge [1, 1] with two children
    _release(pool, a)
    _release(pool, b)
    assert tree.evict(3) == 3 and tree.nodes() == [] and pool.num_free == 8


ops = st.lists(st.tuples(st.sampled_from(["request", "release", "evict"]),
                         st.lists(st.integers(0, 2), min_size=1, max_size=9), st.integers(0, 4)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_invariants_under_random_requests(steps):
    pool = BlockPool(24, BS)
    tree = RadixCache(pool)
    content: dict[int, tuple] = {}           # block -> the tokens written into it when it was computed
    running: list[list[int]] = []
    for op, tokens, n in steps:
        if op == "request":
            hit = tree.match(tokens)
            assert all(content[b] == tuple(tokens[i * BS:(i + 1) * BS]) for i, b in enumerate(hit))
            need = -(-len(tokens) // BS) - len(hit)
            if need > pool.num_free:
                tree.evict(need - pool.num_free)
            if need > pool.num_free:
                continue
            for b in hit:
                pool.incref(b)
            new = pool.allocate(need)
            for i, b in enumerate(new, len(hit)):
                content[b] = tuple(tokens[i * BS:(i + 1) * BS])
            tree.insert(tokens, hit + new)
            running.append(hit + new)
        elif op == "release" and running:
            _release(pool, running.pop(n % len(running)))
        elif op == "evict":
            tree.evict(n)
        cached = [b for node in tree.nodes() for b in node.blocks]
        assert len(cached) == len(set(cached))                   # no block cached twice
        held = {b: sum(t.count(b) for t in running) for b in range(pool.num_blocks)}
        for b in range(pool.num_blocks):
            assert pool.ref_counts[b] == held[b] + (b in cached)  # references: the tree's and the requests'
        for node in tree.nodes():
            assert len(node.tokens) == len(node.blocks) * BS and node.blocks
            assert all(content[b] == node.tokens[i * BS:(i + 1) * BS] for i, b in enumerate(node.blocks))
        leaves = [node.last_used for node in tree.nodes() if not node.children]
        assert len(leaves) == len(set(leaves))                    # eviction's LRU order needs no tie-break


def test_a_split_stamps_the_shared_part_only():
    pool = BlockPool(12, BS)
    tree = RadixCache(pool)
    _, a = _request(pool, tree, [1, 1, 2, 2, 3, 3])
    _, b = _request(pool, tree, [4, 4])
    _, c = _request(pool, tree, [1, 1, 5, 5])                    # splits a's edge after [1, 1]
    for table in (a, b, c):
        _release(pool, table)
    # c's match counted a's whole edge as used (after b), c's insert stamped only the shared [1, 1] and its new leaf:
    # LRU leaves are b's [4, 4], then a's own part [2, 2, 3, 3] (from its end), then c's [5, 5]
    assert tree.evict(2) == 2 and tree.match([4, 4]) == [] and tree.match([1, 1, 2, 2, 3, 3]) == a[:2]
    assert tree.match([1, 1, 5, 5]) == c
