"""Cache-aware admission (lab 13): which waiting request to admit first when a prefix cache is warm.

First come, first served admits in arrival order and lets a request whose prefix is cached wait behind one that
shares nothing, while the cache may evict that prefix in between. Longest prefix first (SGLang's "lpm" policy)
admits the request with the most cached tokens first: more hits while they are still cached, and requests that share
a prefix run together. Alone it can starve a request that shares nothing with anybody, so a starvation bound puts a
request that has waited `max_wait` steps or more ahead of all others (in arrival order among such requests).

    order = admission_order(waiting, cached=lambda r: len(tree.match(r.tokens)), waited=..., max_wait=32)
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

__all__ = ["admission_order", "fcfs_order"]

T = TypeVar("T")


def fcfs_order(waiting: Sequence[T]) -> list[T]:
    """Arrival order (waiting is kept in arrival order)."""
    return list(waiting)


def admission_order(waiting: Sequence[T], cached: Callable[[T], int], waited: Callable[[T], int],
                    max_wait: int) -> list[T]:
    """`waiting` (in arrival order) in the order to admit: first every request that has waited `max_wait` steps or
    more, in arrival order; then the others by cached prefix length, longest first, ties in arrival order."""
    if isinstance(max_wait, bool) or not isinstance(max_wait, int) or max_wait < 0:
        raise ValueError(f"max_wait must be an int >= 0 (steps), got {max_wait!r}")
    starving = [r for r in waiting if waited(r) >= max_wait]
    rest = [(i, r) for i, r in enumerate(waiting) if waited(r) < max_wait]
    rest.sort(key=lambda item: (-cached(item[1]), item[0]))
    return starving + [r for _, r in rest]
