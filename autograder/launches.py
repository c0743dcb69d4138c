"""Calling a learner's launcher of Triton kernels: its launches counted where it runs, the package's kernels refused,
and a view of a larger buffer handed over as that view (labs 04 and 05)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from autograder.checking.models import Launches, count_triton_launches
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.remote import run_where
from autograder.harness import call_learner

__all__ = ["own_kernels", "call_counting_launches", "call_launcher"]


def own_kernels(launches: Launches, what: str) -> None:
    """Refuse a launch of one of the package's Triton kernels (the reference's kernel behind your launcher)."""
    for kernel in launches.kernels:
        own_work(kernel, (), what=what)


def call_counting_launches(fn: Callable, args: list, kwargs: dict, what: str, watch: tuple = (),
                           views: dict | None = None) -> tuple[Any, int]:
    """fn(*args, **kwargs), run in the process where fn lives (the learner's kernel when the check is judged: a
    Triton launch happens there, so it is counted there); returns (its value, the number of Triton launches).

    Raises ReferenceHandedIn for a launch of one of the package's kernels, and, when `watch` names references,
    for a call into them (no_calls_into). `views`: {index in args: (shape, stride, offset)}: that argument is a
    whole buffer and fn gets this view of it (the buffer travels whole, so a store past the view shows in it)."""
    args = list(args)
    for index, (shape, stride, offset) in (views or {}).items():
        args[index] = args[index].as_strided(shape, stride, offset)
    guard = no_calls_into(*watch, what=what) if watch else contextlib.nullcontext()
    with count_triton_launches() as launches, guard:
        value = fn(*args, **kwargs)
    own_kernels(launches, what)
    return value, launches[0]


def call_launcher(what: str, fn: Callable, *args: Any, exercise: str, context: str = "", watch: tuple = (),
                  **kwargs: Any) -> tuple[Any, int]:
    """call_learner for a launcher of Triton kernels: (fn(*args, **kwargs), number of Triton launches), counted
    where fn runs; a launch of the package's kernel, or a call into `watch`, is refused naming `exercise`. A tensor
    argument that is a view of a larger buffer reaches fn as the same view of that buffer."""
    if fn is None or not callable(fn):
        raise AssertionError(f"{what}: expected your function, got {fn!r}")
    sent, views = list(args), {}
    for i, a in enumerate(args):
        base = a._base if isinstance(a, torch.Tensor) else None
        if base is not None and base.is_contiguous() and base.storage_offset() == 0:
            sent[i], views[i] = base, (tuple(a.shape), tuple(a.stride()), a.storage_offset())
    return call_learner(what, lambda: run_where(fn, call_counting_launches, fn, sent, kwargs, exercise, tuple(watch),
                                                views), context=context)
