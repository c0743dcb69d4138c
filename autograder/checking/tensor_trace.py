"""What a learner's PyTorch code did, seen from outside: every torch function it called, with the shapes of the
tensors that went in and came out (a `TorchFunctionMode`), for checks of the method and not only the output.

    with TensorTrace() as trace:
        out = learner_fn(x)
    any(shape[-2:] == (T, T) for shape in trace.shapes())     # a (T x T) tensor held?
    trace.calls_named("softmax")                               # torch.softmax / Tensor.softmax / F.softmax called?
    trace.grad_used                                            # autograd switched on (requires_grad, backward)?

When the learner's code runs in another process (a judged check, autograder/judging/judge.py), the call is traced
there and its records are added here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

__all__ = ["TensorTrace", "TorchCall"]


@dataclass(frozen=True)
class TorchCall:
    """One torch function call: its name, the shapes of its tensor arguments and of its tensor results."""

    name: str
    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]


_ACTIVE: list["TensorTrace"] = []       # traces open in this process (a judged call asks the kernel to trace too)


class TensorTrace(TorchFunctionMode):
    """Records every torch function called inside the block (names without leading underscores, e.g. "amax")."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[TorchCall] = []
        self.grad_used = False

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", None) or getattr(getattr(func, "__objclass__", None), "__name__", str(func))
        results = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(t.requires_grad for t in results) or name in ("backward", "grad", "requires_grad_"):
            self.grad_used = True
        self.calls.append(TorchCall(name.strip("_"), tuple(tuple(t.shape) for t in tree_leaves((args, kwargs))
                                                          if isinstance(t, torch.Tensor)),
                                    tuple(tuple(t.shape) for t in results)))
        return out

    def __enter__(self) -> "TensorTrace":
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _ACTIVE.remove(self)

    def calls_named(self, *names: str) -> list[TorchCall]:
        return [c for c in self.calls if c.name in names]

    def shapes(self) -> list[tuple[int, ...]]:
        """Every tensor shape that went in or came out of a call."""
        return [s for c in self.calls for s in (*c.inputs, *c.outputs)]


def remote_options() -> dict:
    """What a judged call asks the kernel for: a trace of the learner's code when one is open here."""
    return {"trace": True} if _ACTIVE else {}


def merge_remote(findings: dict) -> None:
    """Add the kernel's trace of a judged call to every trace open here (as if the call had run here)."""
    found = findings.get("trace")
    if not found:
        return
    calls = [TorchCall(name, tuple(tuple(s) for s in ins), tuple(tuple(s) for s in outs))
             for name, ins, outs in found["calls"]]
    for trace in _ACTIVE:
        trace.calls.extend(calls)
        trace.grad_used = trace.grad_used or bool(found["grad_used"])
