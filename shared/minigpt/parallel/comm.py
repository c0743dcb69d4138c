"""Collectives that count themselves: every all-reduce and all-gather, and the bytes it moves.

    comm = CountingComm(TorchDistributed())     # inside a torch.distributed rank (gloo or NCCL)
    y = comm.all_reduce(partial)                # sum over ranks, same result on every rank
    logits = comm.all_gather(local_logits, dim=-1)
    comm.stats.calls["all_reduce"], comm.stats.bytes["all_reduce"]

Bytes. `stats.bytes[op]` is the payload: the tensor being reduced (all-reduce) or the gathered
result (all-gather). What one rank actually sends over the wire in a ring of n ranks is
    all-reduce: 2 (n - 1) / n * payload      (reduce-scatter, then all-gather: each n-1 steps of payload/n)
    all-gather: (n - 1) / n * payload
(`ring_wire_bytes`). A Megatron layer does two all-reduces of (tokens, d_model) activations in the
forward pass, so a decode step sends 2 * n_layers * d_model * bytes_per_element * 2(n-1)/n per token
from each rank.

Backends: `TorchDistributed` (a torch.distributed process group) and `ThreadGroup` (ranks as threads of
one process, for quick experiments; same results, no ports). `Solo` is the world of one rank.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Backend", "CollectiveStats", "CountingComm", "TorchDistributed", "ThreadGroup", "Solo",
           "ring_wire_bytes", "CollectiveTimeout"]


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than its timeout for the other ranks (one crashed or hangs)."""


def ring_wire_bytes(op: str, payload_bytes: float, world_size: int) -> float:
    """Bytes one rank sends for a ring collective: all_reduce 2(n-1)/n * payload, all_gather (n-1)/n * payload."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n * payload_bytes
    if op == "all_gather":
        return (n - 1) / n * payload_bytes
    raise ValueError(f"unknown collective {op!r}; known: all_reduce, all_gather")


class Backend(Protocol):
    rank: int
    world_size: int

    def all_reduce(self, t: Tensor) -> Tensor: ...          # sum over ranks

    def all_gather(self, t: Tensor) -> list[Tensor]: ...    # every rank's tensor, in rank order


@dataclass
class CollectiveStats:
    """Calls and payload bytes per collective (see the module docstring for wire bytes)."""

    world_size: int
    calls: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)

    def record(self, op: str, payload_bytes: int) -> None:
        self.calls[op] += 1
        self.bytes[op] += payload_bytes

    def wire_bytes(self, op: str | None = None) -> float:
        """Bytes sent by this rank in a ring, for one collective or (op=None) all of them."""
        ops = [op] if op else list(self.bytes)
        return sum(ring_wire_bytes(o, self.bytes[o], self.world_size) for o in ops)

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {op: {"calls": self.calls[op], "bytes": self.bytes[op], "wire_bytes": self.wire_bytes(op)}
                for op in sorted(self.calls)}


class CountingComm:
    """The collectives a tensor-parallel model calls, counted in `stats`."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.stats = CollectiveStats(backend.world_size)

    @property
    def rank(self) -> int:
        return self.backend.rank

    @property
    def world_size(self) -> int:
        return self.backend.world_size

    def all_reduce(self, t: Tensor) -> Tensor:
        """Sum of `t` over all ranks (a new tensor, same shape and dtype)."""
        self.stats.record("all_reduce", t.numel() * t.element_size())
        return self.backend.all_reduce(t)

    def all_gather(self, t: Tensor, dim: int = -1) -> Tensor:
        """Every rank's `t` concatenated along `dim`, in rank order."""
        out = torch.cat(self.backend.all_gather(t), dim=dim)
        self.stats.record("all_gather", out.numel() * out.element_size())
        return out


class Solo:
    """The world of one rank: collectives are identities."""

    rank, world_size = 0, 1

    def all_reduce(self, t: Tensor) -> Tensor:
        return t.clone()

    def all_gather(self, t: Tensor) -> list[Tensor]:
        return [t]


class TorchDistributed:
    """Collectives of a torch.distributed process group (the default group unless one is given)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group first "
                               "(or start the ranks with minigpt.parallel.launch)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_reduce(self, t: Tensor) -> Tensor:
        out = t.contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out

    def all_gather(self, t: Tensor) -> list[Tensor]:
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t, group=self.group)
        return parts


class ThreadGroup:
    """`world_size` ranks as threads of one process; `member(rank)` is rank `rank`'s backend.

    Each collective: every rank drops its tensor in a slot, waits for the others (a barrier with a
    timeout, so a missing rank raises CollectiveTimeout instead of hanging), reads all slots in rank
    order, and waits again before the slots are reused.
    """

    def __init__(self, world_size: int, timeout: timedelta | float = 30.0) -> None:
        self.world_size = world_size
        self.timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        self._slots: list[Tensor | None] = [None] * world_size
        self._barrier = threading.Barrier(world_size)

    def member(self, rank: int) -> "_ThreadMember":
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in [0, {self.world_size})")
        return _ThreadMember(self, rank)

    def abort(self) -> None:
        """Wake every waiting rank with an error (used when one rank fails)."""
        self._barrier.abort()

    def _wait(self, rank: int, op: str) -> None:
        try:
            self._barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            raise CollectiveTimeout(f"rank {rank}: {op} did not complete within {self.timeout:g} s: another rank "
                                    "failed or never reached this collective") from None

    def exchange(self, rank: int, t: Tensor, op: str) -> list[Tensor]:
        self._slots[rank] = t
        self._wait(rank, op)
        parts = [s for s in self._slots]            # type: ignore[misc]
        self._wait(rank, op)
        return parts                                 # type: ignore[return-value]


class _ThreadMember:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce(self, t: Tensor) -> Tensor:
        parts = self.group.exchange(self.rank, t, "all_reduce")
        out = parts[0].clone()
        for p in parts[1:]:
            out += p
        return out

    def all_gather(self, t: Tensor) -> list[Tensor]:
        return [p.clone() for p in self.group.exchange(self.rank, t, "all_gather")]
