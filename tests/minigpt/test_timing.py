"""The timing harness: interleaved medians and ratios (never absolute times)."""

import time

import pytest

from minigpt.timing import Timing, compare, device_class, fixed_threads, speedup


def test_compare_orders_candidates_by_cost():
    results = compare({"slow": lambda: time.sleep(0.02), "fast": lambda: time.sleep(0.005)}, repeats=5)
    assert set(results) == {"slow", "fast"}
    assert all(len(t.samples) == 5 for t in results.values())
    assert speedup(results, "slow", "fast") > 2


def test_interleaving_rotates_the_order():
    calls = []
    compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, warmup=0, repeats=2)
    assert calls == ["a", "b", "b", "a"]


def test_fixed_threads_restores():
    import torch
    before = torch.get_num_threads()
    with fixed_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_timing_statistics():
    t = Timing("x", [1.0, 3.0, 2.0])
    assert t.median == 2.0 and t.spread == 1.0


def test_device_class_on_cpu():
    assert device_class("cpu") == "cpu"


def test_empty_compare():
    with pytest.raises(ValueError):
        compare({})
