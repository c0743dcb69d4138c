"""Cache-aware admission: longest cached prefix first, arrival order among ties, the starvation bound first of all."""

import pytest
from hypothesis import given, strategies as st

from minigpt.cache.cache_aware import admission_order, fcfs_order


def test_longest_prefix_first_with_a_starvation_bound():
    waiting = ["a", "b", "c", "d"]
    cached = {"a": 0, "b": 32, "c": 16, "d": 32}.__getitem__
    waited = {"a": 5, "b": 0, "c": 9, "d": 1}.__getitem__
    assert admission_order(waiting, cached, waited, max_wait=100) == ["b", "d", "c", "a"]
    assert admission_order(waiting, cached, waited, max_wait=5) == ["a", "c", "b", "d"]
    assert fcfs_order(waiting) == waiting
    with pytest.raises(ValueError, match="max_wait"):
        admission_order(waiting, cached, waited, max_wait=-1)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10)), max_size=12), st.integers(0, 10))
def test_every_request_once_and_no_request_waits_past_the_bound_behind_a_fresh_one(items, bound):
    waiting = list(range(len(items)))
    order = admission_order(waiting, lambda r: items[r][0], lambda r: items[r][1], bound)
    assert sorted(order) == waiting
    first_fresh = next((i for i, r in enumerate(order) if items[r][1] < bound), len(order))
    assert all(items[r][1] >= bound for r in order[:first_fresh])
    assert all(items[r][1] < bound for r in order[first_fresh:])
