"""HostLoader copies a tier's blocks into the pool asynchronously; restore_prefix loads the longest held run of a
prompt's blocks, overlapped with other work, and prefills only once every copy has landed."""

import pytest
import torch

from minigpt.cache.host_loader import HostLoader, restore_prefix
from minigpt.cache.tiers import TieredStore

SHAPE = (2, 4, 1, 3)          # layers, block size, KV heads, head dim


def _store(keys):
    store = TieredStore(host_blocks=16)
    data = {}
    for key in keys:
        k, v = torch.randn(SHAPE), torch.randn(SHAPE)
        store.put(key, k, v)
        data[key] = (k, v)
    return store, data


def _pools(n=8):
    return torch.full((n, *SHAPE), -1.0), torch.full((n, *SHAPE), -1.0)


@pytest.mark.parametrize("land_on_wait", [False, True])
def test_a_copy_lands_in_its_block(land_on_wait):
    store, data = _store(["a", "b"])
    k_pool, v_pool = _pools()
    with store, HostLoader(store, k_pool, v_pool, delay_s=0.01, land_on_wait=land_on_wait) as loader:
        e1, e2 = loader.load("a", 5), loader.load("b", 2)
        if land_on_wait:
            assert not loader.landed(5) and not loader.landed(2)
        loader.wait(e2)
        loader.wait(e1)
        assert loader.landed(5) and torch.equal(k_pool[5], data["a"][0]) and torch.equal(v_pool[2], data["b"][1])
        assert loader.has("a") and not loader.has("c")
        with pytest.raises(KeyError):
            loader.load("c", 0)
        with pytest.raises(ValueError):
            loader.load("a", 8)
        with pytest.raises(ValueError):
            loader.wait(99)


def test_held_copies_never_deadlock_whatever_the_wait_order():
    store, data = _store(list(range(6)))
    k_pool, v_pool = _pools()
    with store, HostLoader(store, k_pool, v_pool, land_on_wait=True, copiers=1) as loader:
        events = [loader.load(i, i) for i in range(6)]
        for e in reversed(events):
            loader.wait(e)
        assert all(torch.equal(k_pool[i], data[i][0]) for i in range(6))


def _restore(held, keys, threshold):
    store, data = _store(held)
    k_pool, v_pool = _pools()
    seen = {}
    free = [6, 1, 4, 0, 7, 3, 2, 5]
    with store, HostLoader(store, k_pool, v_pool, land_on_wait=True) as loader:
        def other_work():
            seen["at other work"] = [kind for kind, _, _ in loader.log]

        def prefill(blocks, n):
            seen["prefill"] = (list(blocks), n, all(loader.landed(b) for b in blocks),
                               all(torch.equal(k_pool[b], data[key][0]) for b, key in zip(blocks, keys)))
        n = restore_prefix(keys, loader, lambda m: [free.pop(0) for _ in range(m)], other_work, prefill,
                           lambda tokens: tokens >= threshold, block_size=SHAPE[1])
    return n, seen


def test_the_longest_held_run_is_loaded_overlapped_then_prefilled():
    n, seen = _restore(held=[10, 11, 13], keys=[10, 11, 12, 13], threshold=4)
    assert n == 2                                              # 12 is a hole: 13 is worthless without it
    assert seen["at other work"] == ["load", "load"]           # every copy started, none waited, before other work
    assert seen["prefill"] == ([6, 1], 2, True, True)


def test_a_run_too_short_to_pay_is_recomputed():
    n, seen = _restore(held=[10], keys=[10, 11], threshold=8)
    assert n == 0 and seen["prefill"] == ([], 0, True, True) and seen["at other work"] == []
