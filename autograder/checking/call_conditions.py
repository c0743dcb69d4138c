"""Conditions a check runs the learner's code under, wherever that code runs: torch's default device moved off
the CPU, and a deadline.

    with default_device_elsewhere():            # factories without device= now make meta tensors
        out = generate_fn(model, prompt, 8, params)     # a CPU model: the learner's tensors must follow model.device
    got = call_with_deadline(fn, *args, seconds=20, what="critical_batch_size(...)")

A contract that says "on the model's device" cannot be checked on a machine with one device: every tensor made
without `device=` lands on the CPU beside a CPU model, right by accident. Moving torch's default device to the meta
device (`torch.device("meta")` as a context, which stands for "a device that is not the model's") makes such a
tensor differ: the model, on the CPU, refuses it. The model itself runs on the judge's side, where the block
applies too; a judged call asks the kernel to apply it around the learner's code (`remote_options`, `applied`).

A deadline turns "never answers" into a verdict: a learner's loop that would climb 10**15 times gets TimeoutError
after `seconds` instead of hanging the notebook (nbgrader would score every later cell 0). Deadlines are tens of
seconds for calls that take microseconds when right, so no machine is too slow for them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator

import torch

from autograder.checking.remote import is_remote

__all__ = ["default_device_elsewhere", "call_with_deadline", "remote_options", "applied", "ELSEWHERE",
           "DEVICE_HINT"]

ELSEWHERE = "meta"          # the default device the checks move to: it stands for a GPU, and holds no data
DEVICE_HINT = ("the check ran your code with torch's default device moved off the CPU (torch.device('meta'), "
               "standing for a GPU) while the model and inputs stayed on the CPU: a tensor made without device= "
               "(torch.tensor, arange, zeros, empty, a torch.Generator...) then lands on the wrong device. Make "
               "each one on the device of the data it meets (device=model.device, device=x.device)")

_OPTIONS: list[dict] = []       # conditions open in this process (a judged call asks the kernel for them too)


@contextlib.contextmanager
def default_device_elsewhere() -> Iterator[None]:
    """Inside the block, torch's factories without device= make tensors on the meta device, here and in the kernel."""
    _OPTIONS.append({"default_device": ELSEWHERE})
    try:
        with torch.device(ELSEWHERE):
            yield
    finally:
        _OPTIONS.pop()


def call_with_deadline(fn: Callable[..., Any], *args: Any, seconds: float, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), stopped by TimeoutError after `seconds` (where fn runs: here, or in the kernel when
    fn is a Remote). Without a main thread to take the alarm, it runs without a deadline."""
    if is_remote(fn):
        _OPTIONS.append({"deadline": float(seconds)})
        try:
            return fn(*args, **kwargs)
        finally:
            _OPTIONS.pop()
    with _alarm(seconds):
        return fn(*args, **kwargs)


def remote_options() -> dict:
    """What a judged call asks the kernel for: the conditions open here."""
    merged: dict = {}
    for option in _OPTIONS:
        merged.update(option)
    return merged


@contextlib.contextmanager
def applied(options: dict) -> Iterator[None]:
    """The kernel's side: the conditions a judged call asked for, around the learner's code."""
    with contextlib.ExitStack() as stack:
        device = options.get("default_device")
        if device is not None:
            if device != ELSEWHERE:
                raise ValueError(f"not a default device a check asks for: {device!r}")
            stack.enter_context(torch.device(ELSEWHERE))
        if options.get("deadline") is not None:
            stack.enter_context(_alarm(float(options["deadline"])))
        yield


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """TimeoutError raised in the main thread after `seconds` (nothing armed off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
