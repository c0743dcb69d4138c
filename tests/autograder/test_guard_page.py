"""autograder/checking/guard_page.py: a tensor that ends at an unreadable page, and a child whose fault is the
answer (what call_launcher(guard_pages=True) stands on)."""

from __future__ import annotations

import ctypes

import torch

from autograder.checking.guard_page import faults_in_child, guarded


def _read_at(t: torch.Tensor, index: int) -> float:
    """One float32 read at element `index` of t's storage, bounds unchecked (as a kernel's raw pointer reads)."""
    return ctypes.c_float.from_address(t.data_ptr() + 4 * index).value


def test_a_guarded_tensor_holds_its_values_and_ends_at_the_page():
    values = torch.arange(10, dtype=torch.float32)
    t = guarded((10,), torch.float32, values)
    assert torch.equal(t, values) and t.is_contiguous()
    assert (t.data_ptr() + t.numel() * 4) % 4096 == 0


def test_a_read_past_the_end_faults_in_the_child_and_a_read_inside_does_not():
    t = guarded((10,), torch.float32, torch.ones(10))
    assert faults_in_child(lambda: _read_at(t, 10))
    assert not faults_in_child(lambda: _read_at(t, 9))
    assert not faults_in_child(lambda: 1 / 0)             # an exception is not a fault: the checked call reports it
    assert t.sum().item() == 10.0                         # the parent goes on untouched
