"""Tensors whose storage ends exactly at a page boundary (autograder/checking/guard_page.py), and code run in a
forked child whose result comes back as data, for the differential tests.

Why a page boundary (a load past a tensor's end faults there instead of going unseen): autograder/checking/guard_page.py.

    guarded(shape, dtype, values=None) -> checking/guard_page.py's, re-exported for the contracts
    in_fork(work) -> work()'s result, computed in a forked child; Raised("OutOfBoundsAccess") when the child faulted
                     (the result crosses back as plain data: JSON for its structure, safetensors for its tensors)

A fault is a SIGSEGV, which kills the process: run the code that may touch a guard page through `in_fork`, which
turns the fault into a result a differential test can compare (the solution never faults, a mutant that reads past
the end does). Linux only (mmap, mprotect, fork).
"""

from __future__ import annotations

import json
import os
import signal
import struct
from typing import Any, Callable

import torch
from safetensors.torch import load as load_tensors, save as save_tensors

from autograder.checking.guard_page import guarded
from autograder.mutation.equivalence import Raised

__all__ = ["guarded", "in_fork", "OUT_OF_BOUNDS"]

OUT_OF_BOUNDS = "OutOfBoundsAccess"


def in_fork(work: Callable[[], Any]) -> Any:
    """work() run in a forked child, its result sent back as plain data (`_encode`); Raised(OUT_OF_BOUNDS) when the
    child died of a fault (SIGSEGV, SIGBUS), Raised(type) when it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            try:
                result = work()
            except Exception as err:               # noqa: BLE001  (the same kind of error is the same result)
                result = Raised(type(err).__name__)
            tensors: dict[str, torch.Tensor] = {}
            try:
                shape = json.dumps(_encode(result, tensors)).encode()
            except TypeError as err:               # a mutant's odd result: a result of its own, never equal
                tensors, shape = {}, json.dumps(_encode(Raised(f"Unsendable({err})"), {})).encode()
            with os.fdopen(write, "wb") as out:
                out.write(struct.pack("<Q", len(shape)) + shape + save_tensors(tensors))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGSEGV, signal.SIGBUS):
        return Raised(OUT_OF_BOUNDS)
    if not data:
        return Raised(f"ChildDied(status={status})")
    (size,) = struct.unpack("<Q", data[:8])
    return _decode(json.loads(data[8:8 + size]), load_tensors(data[8 + size:]))


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A JSON form of a result made of tensors (kept in `tensors`, by key), numbers, strings, None, Raised, and
    lists, tuples and str-keyed dicts of them."""
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous()
        return {"tensor": key}
    if isinstance(value, Raised):
        return {"raised": value.kind}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode(v, tensors) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode(v, tensors) for k, v in value.items()}}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"in_fork: a result of type {type(value).__name__} cannot be sent back as plain data")


def _decode(form: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `_encode`."""
    (kind, inside), = form.items()
    if kind == "tensor":
        return tensors[inside]
    if kind == "raised":
        return Raised(inside)
    if kind in ("list", "tuple"):
        items = [_decode(v, tensors) for v in inside]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _decode(v, tensors) for k, v in inside.items()}
    return inside
