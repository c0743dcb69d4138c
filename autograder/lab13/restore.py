"""Exercise 5: a cached prefix brought back from the host tier, overlapped with other work, on the judge's tier.

The learner's restore_prefix(keys, loader, allocate, other_work, prefill, worth_loading, block_size) gets the judge's
HostLoader (judged: a handle serving has, load, wait) over the judge's TieredStore and pools, whose copies land only
when waited for (the slowest link the contract allows), and four functions of the judge's (Callbacks) that note when
they are called and what the loader had done by then. The verdict, from the judge's own records:

* the number of blocks loaded is the reference's: the longest run of the prompt's keys, from the first, that the tier
  holds (a hole ends it), or 0 when `worth_loading(run * block_size)` says no (asked with exactly those tokens);
* exactly those keys are loaded, key i into the i-th block `allocate` gave, each block once;
* every copy was started before `other_work` ran, and none waited for before it (the overlap);
* `prefill(blocks, n)` ran once, after `other_work`, and found every block landed and holding its key's keys and
  values (a block read before its copy landed holds the garbage of a previous request: the judge's pool is filled
  with it).
Hand-made cases name each mistake; drawn cases (seeded) follow.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch

from autograder.checking.judge_services import Callback
from autograder.checking.reference_guard import own_work, watched
from autograder.harness import call_learner
from minigpt.cache import host_loader
from minigpt.cache.host_loader import HostLoader
from minigpt.cache.tiers import TieredStore

__all__ = ["check_restore_prefix", "EX5"]

EX5 = "Exercise 5 (restore_prefix)"
REFERENCES = (host_loader.restore_prefix,)
SHAPE = (2, 4, 1, 3)            # layers, block size, KV heads, head dim
BS = SHAPE[1]
POOL = 12

# (keys of the prompt, keys the tier holds, worth loading from this many tokens, what the case tests)
CASES = [
    ([10, 11, 12], [10, 11, 12], 1, "a prefix the tier holds whole"),
    ([10, 11, 12, 13], [10, 11, 13], 1, "a hole at the third block (the fourth is worthless without it)"),
    ([10, 11], [11], 1, "the first block missing: nothing to load"),
    ([10, 11, 12], [10, 11, 12], 13, "a run of 12 tokens where loading pays only from 13: recompute"),
    ([10, 11, 12], [10, 11, 12], 12, "a run of 12 tokens where loading pays from 12"),
    ([], [10], 1, "an empty prompt"),
]


class _Judge:
    """One case: the tier, the pools (filled with a previous request's garbage), the loader, and the four
    Callbacks, each noting what the loader had done when it was called."""

    def __init__(self, keys: list[int], held: list[int], threshold: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.keys, self.threshold = keys, threshold
        self.store = TieredStore(host_blocks=32)
        self.data = {}
        for key in held:
            k, v = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
            self.store.put(key, k, v)
            self.data[key] = (k, v)
        self.k_pool, self.v_pool = torch.randn(POOL, *SHAPE, generator=g), torch.randn(POOL, *SHAPE, generator=g)
        self.loader = HostLoader(self.store, self.k_pool, self.v_pool, land_on_wait=True)
        self.free = torch.randperm(POOL, generator=g).tolist()
        self.allocated: list[int] = []
        self.calls: list[tuple[str, Any, int]] = []     # (what, argument, len(loader.log) at the call)
        self.problems: list[str] = []
        self.prefilled: list[tuple[list[int], int, list[bool], list[bool]]] = []

    def callbacks(self) -> tuple[Callback, Callback, Callback, Callback]:
        return Callback(self.allocate), Callback(self.other_work), Callback(self.prefill), Callback(self.worth)

    def allocate(self, n: Any) -> list[int]:
        self.calls.append(("allocate", n, len(self.loader.log)))
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(self.free):
            raise ValueError(f"allocate({n!r}): ask for 0 to {len(self.free)} blocks")
        out, self.free = self.free[:n], self.free[n:]
        self.allocated += out
        return out

    def other_work(self) -> None:
        self.calls.append(("other_work", None, len(self.loader.log)))

    def worth(self, tokens: Any) -> bool:
        self.calls.append(("worth_loading", tokens, len(self.loader.log)))
        return bool(tokens >= self.threshold)

    def prefill(self, blocks: Any, n: Any) -> None:
        blocks = [int(b) for b in blocks]
        landed = [self.loader.landed(b) for b in blocks[:n]]
        right = [key in self.data and torch.equal(self.k_pool[b], self.data[key][0])
                 and torch.equal(self.v_pool[b], self.data[key][1]) for b, key in zip(blocks[:n], self.keys)]
        self.calls.append(("prefill", (blocks, n), len(self.loader.log)))
        self.prefilled.append((blocks, n, landed, right))

    def close(self) -> None:
        self.loader.close()
        self.store.close()


def _want(keys: list[int], held: list[int], threshold: int) -> tuple[int, int]:
    """(blocks to load, the run's length the cost model is asked about)."""
    run = 0
    while run < len(keys) and keys[run] in held:
        run += 1
    return (run if run and run * BS >= threshold else 0), run


def _verdict(j: _Judge, got: Any, keys: list[int], held: list[int], threshold: int, what: str) -> None:
    n, run = _want(keys, held, threshold)
    if isinstance(got, bool) or not isinstance(got, int) or got != n:
        hint = (" (the run of held keys ends at the first key the tier does not hold)" if got != run or n == run else
                " (loading these tokens does not pay here: ask worth_loading(run * block_size), load nothing)")
        raise AssertionError(f"{EX5}: {what}: returned {got!r}, expected {n} blocks loaded{hint}")
    asked = [arg for kind, arg, _ in j.calls if kind == "worth_loading"]
    if run and asked != [run * BS]:
        raise AssertionError(f"{EX5}: {what}: worth_loading was asked {asked}: ask it once, with the run's tokens "
                             f"({run} blocks of {BS} = {run * BS})")
    started = [entry[2] for entry in j.loader.log if entry[0] == "load"]
    wanted = list(zip(keys[:n], j.allocated[:n]))
    if started != wanted:
        raise AssertionError(f"{EX5}: {what}: copies started {[list(p) for p in started]} (key, block), expected "
                             f"{[list(p) for p in wanted]}: copy key i into the i-th block allocate gave, each once")
    others = [at for kind, _, at in j.calls if kind == "other_work"]
    if len(others) != 1:
        raise AssertionError(f"{EX5}: {what}: other_work was called {len(others)} times: call it once, after starting "
                             "the copies and before waiting for them")
    before = [kind for kind, _, _ in j.loader.log[:others[0]]]
    if n and (before.count("load") != n or "wait" in before):
        raise AssertionError(f"{EX5}: {what}: when other_work ran, {before.count('load')} of {n} copies had started "
                             f"and {before.count('wait')} had been waited for: start every copy first, then do the "
                             "other work while they run, and only then wait (that is the overlap)")
    if len(j.prefilled) != 1:
        raise AssertionError(f"{EX5}: {what}: prefill was called {len(j.prefilled)} times: once, at the end")
    blocks, got_n, landed, right = j.prefilled[0]
    order = [kind for kind, _, _ in j.calls]
    if order.index("prefill") < order.index("other_work"):
        raise AssertionError(f"{EX5}: {what}: prefill ran before other_work: the other work overlaps the copies, the "
                             "prefill needs them")
    if blocks[:n] != j.allocated[:n] or got_n != n:
        raise AssertionError(f"{EX5}: {what}: prefill({blocks}, {got_n}) was given other blocks than the ones loaded "
                             f"({j.allocated[:n]}, {n})")
    if not all(landed):
        raise AssertionError(f"{EX5}: {what}: prefill read block {blocks[landed.index(False)]} before its copy "
                             "landed (it still holds a previous request's keys and values): wait for every copy's "
                             "event before the prefill")
    if not all(right):
        raise AssertionError(f"{EX5}: {what}: block {blocks[right.index(False)]} does not hold its key's keys and "
                             "values when the prefill reads it")


def _case(fn: Callable, keys: list[int], held: list[int], threshold: int, what: str, seed: int) -> None:
    j = _Judge(keys, held, threshold, seed)
    try:
        allocate, other_work, prefill, worth_loading = j.callbacks()
        got = call_learner(EX5, fn, list(keys), j.loader, allocate, other_work, prefill, worth_loading, BS,
                           context=what)
        _verdict(j, got, keys, held, threshold, what)
    finally:
        j.close()


def check_restore_prefix(fn: Callable) -> None:
    """fn(keys, loader, allocate, other_work, prefill, worth_loading, block_size) on the judge's tier and loader:
    hand-made cases (each mistake named), then drawn ones."""
    own_work(fn, REFERENCES, what=EX5)
    fn = watched(fn, REFERENCES, EX5)
    for i, (keys, held, threshold, what) in enumerate(CASES):
        _case(fn, keys, held, threshold, what, seed=i)
    rng = random.Random(5)
    for i in range(12):
        keys = rng.sample(range(100, 120), rng.randint(1, 8))
        held = [k for k in keys if rng.random() < 0.8] + rng.sample(range(200, 210), 2)
        threshold = rng.choice((1, 4, 9, 16, 24))
        _case(fn, keys, held, threshold, f"drawn case #{i}: keys {keys}, the tier holding {sorted(held)}, loading "
                                         f"paying from {threshold} tokens", seed=100 + i)
