"""autograder/checking/call_conditions.py: the default device moved off the CPU, and deadlines, here and as a
judged call's options applied in the kernel."""

from __future__ import annotations

import time

import pytest
import torch

from autograder.checking import call_conditions


def test_default_device_elsewhere_moves_factories_and_is_asked_of_the_kernel():
    assert call_conditions.remote_options() == {}
    with call_conditions.default_device_elsewhere():
        assert torch.zeros(2).device.type == "meta"
        assert torch.zeros(2, device="cpu").device.type == "cpu"
        assert call_conditions.remote_options() == {"default_device": "meta"}
    assert torch.zeros(2).device.type == "cpu"
    assert call_conditions.remote_options() == {}


def test_the_kernel_applies_what_a_judged_call_asks():
    with call_conditions.applied({"default_device": "meta"}):
        assert torch.arange(3).device.type == "meta"
    assert torch.arange(3).device.type == "cpu"
    with pytest.raises(ValueError, match="not a default device"):
        with call_conditions.applied({"default_device": "cuda"}):
            pass
    with call_conditions.applied({}):
        assert torch.arange(3).device.type == "cpu"


def _spin() -> None:
    while True:
        pass


def test_a_deadline_stops_a_loop_that_never_ends_and_disarms_after():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer within 0.2 s"):
        call_conditions.call_with_deadline(_spin, seconds=0.2)
    assert time.monotonic() - start < 10
    with pytest.raises(TimeoutError):
        with call_conditions.applied({"deadline": 0.2}):
            _spin()
    assert call_conditions.call_with_deadline(lambda x: x + 1, 1, seconds=0.2) == 2
    time.sleep(0.3)        # no alarm left armed after an answer in time
