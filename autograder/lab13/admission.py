"""Exercise 3: cache-aware admission order, on the judge's queues.

The learner's admission_order(waiting, cached, waited, max_wait) gets request ids (plain strings, in arrival order)
and two functions of the judge's (`cached(rid)`: cached prefix tokens, `waited(rid)`: steps waited), and returns the
ids in the order to admit. The verdict compares that order with the package's on hand-made queues (each likely
mistake named) and on drawn ones (ties frequent), and asks for a ValueError naming max_wait when it is not an int
>= 0.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from autograder.checking.judge_services import Callback
from autograder.checking.reference_guard import own_work, watched
from autograder.harness import call_learner, expect_value_error
from minigpt.cache.cache_aware import admission_order as reference_order
from minigpt.cache.cache_aware import fcfs_order

__all__ = ["check_admission_order", "EX3"]

EX3 = "Exercise 3 (admission_order)"
REFERENCES = (reference_order, fcfs_order)

# (ids in arrival order, cached tokens, steps waited, max_wait, what it tests, the mistake it names)
CASES = [
    (["r7", "r2", "r9", "r4"], [0, 32, 0, 64], [1, 1, 1, 1], 10, "longest cached prefix first",
     "admit the request with the MOST cached tokens first (longest prefix match)"),
    (["r7", "r2", "r9", "r4"], [16, 16, 48, 16], [0, 0, 0, 0], 10, "ties kept in arrival order",
     "requests with equal cached prefixes keep their arrival order (a stable sort on -cached; not by id)"),
    (["a", "b", "c", "d"], [0, 64, 0, 32], [9, 0, 12, 0], 9, "starving requests first, in arrival order",
     "a request that has waited max_wait steps or more (>=) goes before every other, and such requests keep their "
     "arrival order whatever they have cached"),
    (["a", "b", "c"], [0, 48, 16], [3, 3, 3], 0, "max_wait 0: everyone starves, first come first served",
     "with max_wait 0 every request has waited long enough: arrival order"),
    (["x", "y", "z"], [8, 0, 24], [2, 5, 1], 5, "waited == max_wait is starving",
     "a request that has waited exactly max_wait steps is starving (>=, not >)"),
    ([], [], [], 4, "an empty queue", "an empty queue admits nobody: return []"),
]


def _run(fn: Callable, ids: list[str], cached: list[int], waited: list[int], max_wait: int, what: str) -> list:
    table_c, table_w = dict(zip(ids, cached)), dict(zip(ids, waited))
    got = call_learner(EX3, fn, list(ids), Callback(table_c.__getitem__), Callback(table_w.__getitem__), max_wait,
                       context=what)
    try:
        return [str(r) for r in got]
    except TypeError:
        raise AssertionError(f"{EX3}: {what}: returned {got!r:.80}; return a list of the waiting requests") from None


def _want(ids: list[str], cached: list[int], waited: list[int], max_wait: int) -> list[str]:
    table_c, table_w = dict(zip(ids, cached)), dict(zip(ids, waited))
    return reference_order(ids, table_c.__getitem__, table_w.__getitem__, max_wait)


def check_admission_order(fn: Callable) -> None:
    """fn(waiting, cached, waited, max_wait): the package's order on hand-made and drawn queues; max_wait refused
    unless an int >= 0."""
    own_work(fn, REFERENCES, what=EX3)
    fn = watched(fn, REFERENCES, EX3)
    for ids, cached, waited, max_wait, what, mistake in CASES:
        label = (f"{what}: waiting {ids}, cached {cached}, waited {waited}, max_wait {max_wait}")
        got, want = _run(fn, ids, cached, waited, max_wait, label), _want(ids, cached, waited, max_wait)
        if sorted(got) != sorted(want):
            raise AssertionError(f"{EX3}: {label}: returned {got}, which is not the waiting requests (each once)")
        if got != want:
            raise AssertionError(f"{EX3}: {label}: returned {got}, expected {want}: {mistake}")
    rng = random.Random(13)
    for case in range(40):
        n = rng.randint(1, 9)
        ids = [f"q{rng.randint(0, 99)}-{i}" for i in range(n)]
        cached = [rng.choice((0, 16, 32, 48)) for _ in ids]
        waited = [rng.randint(0, 8) for _ in ids]
        max_wait = rng.choice((0, 2, 4, 6, 100))
        label = f"drawn queue #{case}: waiting {ids}, cached {cached}, waited {waited}, max_wait {max_wait}"
        got, want = _run(fn, ids, cached, waited, max_wait, label), _want(ids, cached, waited, max_wait)
        if got != want:
            raise AssertionError(f"{EX3}: {label}: returned {got}, expected {want}")
    for bad in (-1, 2.5, True, "3"):
        expect_value_error(f"{EX3}: max_wait={bad!r}", fn, ["a"], Callback(lambda r: 0), Callback(lambda r: 0), bad,
                           naming=("max_wait",), hint="max_wait is a number of steps: an int >= 0")
