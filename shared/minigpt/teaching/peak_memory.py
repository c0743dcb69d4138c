"""Peak bytes of tensor memory a piece of PyTorch code holds at once, on any device (lab 04's CPU measurement).

    with PeakMemory() as mem:
        out = naive_attention(q, k, v)
    mem.peak          # most bytes alive at once, among the storages the block's operators allocated
    mem.allocated     # all bytes allocated inside the block (what was written to fresh memory)

A `TorchDispatchMode` sees every aten operator the block runs. Each result whose storage is new (not one of the
operator's inputs, as views and in-place results are) adds its storage's bytes to the running total, and a
`weakref.finalize` on that storage takes them off when PyTorch frees it. So `peak` counts tensors exactly as the
caching allocator of a GPU would be asked for them (without its rounding), and the same on a CPU, where
`torch.cuda.max_memory_allocated` has no counterpart. Storages created before the block (the inputs) are not
counted; those created inside and still alive at the end (the output) are.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakMemory", "peak_bytes"]


class PeakMemory(TorchDispatchMode):
    """Running and peak bytes of the storages allocated by the operators run inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self._live: dict[int, int] = {}          # id of a tracked storage -> its bytes

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in inputs or key in self._live:
                continue
            self._live[key] = storage.nbytes()
            self.current += storage.nbytes()
            self.allocated += storage.nbytes()
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._free, key)
        return out


def peak_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Peak bytes held at once by the tensors that fn(*args, **kwargs) allocates (its result included)."""
    with PeakMemory() as mem:
        fn(*args, **kwargs)
    return mem.peak
