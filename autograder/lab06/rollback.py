"""Lab 06, exercise 1: rolling a KV cache back (truncate_cache)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from autograder.harness import call_learner, expect_value_error
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.config import ModelConfig


# ---------------------------------------------------------------------------------------------------
# Exercise 1: cache rollback
# ---------------------------------------------------------------------------------------------------

def check_truncate_cache(truncate_fn: Callable) -> None:
    """truncate_fn(cache: KVCache, length) keeps positions [0, length) in every layer; the next write lands at
    `length`; a length outside [0, cache.length] raises ValueError and changes nothing."""
    what = "Exercise 1 (truncate_cache)"
    own_work(truncate_fn, truncate_cache, what=what)
    with no_calls_into(truncate_cache, what=what):
        _check_truncate_cache(truncate_fn)


def _check_truncate_cache(truncate_fn: Callable) -> None:
    cfg = ModelConfig(vocab_size=32, max_seq_len=16, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, d_ff=32)
    cache = KVCache.for_model(cfg)
    g = torch.Generator().manual_seed(0)

    def write(T: int) -> list[Tensor]:
        ks = [torch.randn(1, T, 1, cfg.head_dim, generator=g) for _ in range(cfg.n_layers)]
        for layer, k in zip(cache, ks):
            layer.update(k, -k)
        return ks

    first = write(7)
    call_learner("truncate_cache(cache, 4)", truncate_fn, cache, 4)
    lengths = [layer.length for layer in cache]
    if lengths != [4] * cfg.n_layers:
        raise AssertionError(f"after truncate_cache(cache, 4) on a cache of 7 positions every layer's length should be 4, "
                             f"got {lengths}; set the length of EVERY layer (the model attends to [0, length) per layer)")
    second = write(2)
    for i, layer in enumerate(cache):
        want = torch.cat([first[i][:, :4], second[i]], 1)
        if not torch.equal(layer.k[:, :6], want) or not torch.equal(layer.v[:, :6], -want):
            raise AssertionError(f"layer {i}: after truncating to 4 and writing 2 positions, positions [0, 6) should hold the "
                                 "first 4 old positions then the 2 new ones; truncation must keep the data before `length`")
    kept = [layer.k[:, :6].clone() for layer in cache]
    call_learner("truncate_cache(cache, 6) on a cache of 6 positions (its own length: nothing to drop)", truncate_fn,
                 cache, 6)
    if [layer.length for layer in cache] != [6] * cfg.n_layers or not all(
            torch.equal(layer.k[:, :6], k) for layer, k in zip(cache, kept)):
        raise AssertionError("truncate_cache(cache, 6) on a cache of 6 positions must keep all 6 and change nothing "
                             f"(lengths {[layer.length for layer in cache]}): a length equal to the cache's is allowed, "
                             "only a longer one is an error")
    for bad in (7, -1, True, 2.0):
        before = [layer.length for layer in cache]
        expect_value_error(f"truncate_cache(cache, {bad}) on a cache of 6 positions", truncate_fn, cache, bad,
                           naming=(cache.length,), hint=" (a cache cannot grow by truncation, lengths are >= 0, and a "
                                                         "length is an int: True and 2.0 are not positions)")
        if [layer.length for layer in cache] != before:
            raise AssertionError(f"the rejected truncate_cache(cache, {bad}) changed the lengths; check before changing state")
    call_learner("truncate_cache(cache, 0)", truncate_fn, cache, 0)
    if [layer.length for layer in cache] != [0] * cfg.n_layers:
        raise AssertionError("truncate_cache(cache, 0) should empty every layer")
