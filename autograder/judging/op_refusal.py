"""In a witness, the aten operators a check refused (autograder/checking/library_refusal.py) made to raise.

Each operator gets a kernel that raises, for the dispatch keys a CPU call goes through (the composite one that
decomposes `scaled_dot_product_attention`, and CPU), registered through a dispatcher library object whose only
reference is leaked on purpose: Python's garbage collector does not track it, so no learner code can find it to
unregister it. Registering another kernel over it is possible, but cannot call the refused one.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Iterable

__all__ = ["REFUSED_MARK", "refuse_ops"]

REFUSED_MARK = "[refused for grading: a library call that does the exercise]"
KEYS = ("CompositeImplicitAutograd", "CPU")


def refuse_ops(ops: Iterable[str], what: str) -> list[str]:
    """Make each aten operator in ops raise RuntimeError(REFUSED_MARK ...); returns those refused."""
    import torch

    ops = [op for op in ops if hasattr(torch.ops.aten, op)]
    if not ops:
        return []
    library = torch._C._dispatch_library("IMPL", "aten", "")

    def refuse(*args, **kwargs):
        raise RuntimeError(f"{REFUSED_MARK} {what}: torch's fused attention (or another library kernel that does the "
                           "exercise) is not the work here")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in ops:
            for key in KEYS:
                library.impl(op, key, refuse, False)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))     # kept alive with no Python reference to it
    del library
    return ops
