"""What a learner's PyTorch code did, seen from outside: every torch function it called, with the shapes of the
tensors that went in and came out (a `TorchFunctionMode`), for checks of the method and not only the output.

    with TensorTrace() as trace:
        out = learner_fn(x)
    any(shape[-2:] == (T, T) for shape in trace.shapes())     # a (T x T) tensor held?
    trace.calls_named("softmax")                               # torch.softmax / Tensor.softmax / F.softmax called?
    trace.grad_used                                            # autograd switched on (requires_grad, backward)?
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

    def calls_named(self, *names: str) -> list[TorchCall]:
        return [c for c in self.calls if c.name in names]

    def shapes(self) -> list[tuple[int, ...]]:
        """Every tensor shape that went in or came out of a call."""
        return [s for c in self.calls for s in (*c.inputs, *c.outputs)]
