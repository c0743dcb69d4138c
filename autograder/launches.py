"""Calling a learner's launcher of Triton kernels: its launches counted where it runs, the package's kernels refused,
a view of a larger buffer handed over as that view, and accesses past a tensor's end caught at a guard page (labs 04
and 05)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from autograder.checking.guard_page import faults_in_child, guarded
from autograder.checking.models import Launches, count_triton_launches
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.remote import run_where
from autograder.harness import call_learner

__all__ = ["own_kernels", "call_counting_launches", "call_launcher", "touches_past_the_end", "PAST_THE_END"]

PAST_THE_END = "read or wrote past the end of a tensor"


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


def touches_past_the_end(fn: Callable, args: list, kwargs: dict) -> bool:
    """Whether fn(*args, **kwargs) reads or writes past the end of one of its tensors: each contiguous tensor argument
    is copied to end where an unreadable page begins (checking/guard_page.py) and fn runs on the copies in a forked
    child, which a load or store past the end kills (SIGSEGV). Run with run_where beside fn: the learner's kernel,
    when judged, is where its Triton code runs. The child's outputs are thrown away (the checked call is the other)."""
    placed = [guarded(tuple(a.shape), a.dtype, a) if isinstance(a, torch.Tensor) and a.is_contiguous()
              and a.device.type == "cpu" else a for a in args]
    return faults_in_child(lambda: fn(*placed, **kwargs))


def call_launcher(what: str, fn: Callable, *args: Any, exercise: str, context: str = "", watch: tuple = (),
                  guard_pages: bool = False, **kwargs: Any) -> tuple[Any, int]:
    """call_learner for a launcher of Triton kernels: (fn(*args, **kwargs), number of Triton launches), counted
    where fn runs; a launch of the package's kernel, or a call into `watch`, is refused naming `exercise`. A tensor
    argument that is a view of a larger buffer reaches fn as the same view of that buffer. `guard_pages` (CPU tensors:
    the interpreter): then fn runs once more on copies of its contiguous tensors that each end at an unreadable
    page, and a load or store past one of them fails the check (`touches_past_the_end`: on a GPU such an access is
    undefined, in the interpreter it is unseen)."""
    if fn is None or not callable(fn):
        raise AssertionError(f"{what}: expected your function, got {fn!r}")
    on_cpu = all(a.device.type == "cpu" for a in args if isinstance(a, torch.Tensor))    # a fork does not keep CUDA
    if guard_pages and on_cpu and call_learner(what, lambda: run_where(fn, touches_past_the_end, fn, list(args),
                                                                       kwargs), context=context):
        raise AssertionError(f"{what}: your kernel {PAST_THE_END} (each tensor was placed to end where an unreadable "
                             "memory page begins, and the run stopped there): a tl.load or tl.store whose offsets can "
                             "pass the end needs its mask, in every load, not only the store")
    sent, views = list(args), {}
    for i, a in enumerate(args):
        base = a._base if isinstance(a, torch.Tensor) else None
        if base is not None and base.is_contiguous() and base.storage_offset() == 0:
            sent[i], views[i] = base, (tuple(a.shape), tuple(a.stride()), a.storage_offset())
    return call_learner(what, lambda: run_where(fn, call_counting_launches, fn, sent, kwargs, exercise, tuple(watch),
                                                views), context=context)
