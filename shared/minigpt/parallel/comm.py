"""Collectives that count themselves: every all-reduce, all-gather, all-to-all and ring pass, and the bytes it moves.

    comm = CountingComm(TorchDistributed())     # inside a torch.distributed rank (gloo or NCCL)
    y = comm.all_reduce(partial)                # sum over ranks, same result on every rank
    logits = comm.all_gather(local_logits, dim=-1)
    received = comm.all_to_all([rows_for_rank0, rows_for_rank1])   # what each rank sent to this one
    left = comm.ring_pass(block)                # send to rank r + 1, receive from rank r - 1 (ring attention)
    comm.stats.calls["all_reduce"], comm.stats.bytes["all_reduce"]

Bytes. `stats.bytes[op]` is the payload: the tensor being reduced (all-reduce) or the gathered
result (all-gather). What one rank actually sends over the wire in a ring of n ranks is
    all-reduce: 2 (n - 1) / n * payload      (reduce-scatter, then all-gather: each n-1 steps of payload/n)
    all-gather: (n - 1) / n * payload
(`ring_wire_bytes`). A Megatron layer does two all-reduces of (tokens, d_model) activations in the
forward pass, so a decode step sends 2 * n_layers * d_model * bytes_per_element * 2(n-1)/n per token
from each rank.

An all-to-all is personal: chunk r goes to rank r only, and chunks may differ in size (expert parallelism's
dispatch and combine, where each rank sends each other rank the token rows routed to its experts). Its
`stats.bytes["all_to_all"]` is already what leaves this rank: the bytes of the chunks for the OTHER ranks (the
chunk a rank keeps for itself never touches the wire), so its wire bytes equal its payload. So does a ring pass's
(`stats.bytes["ring_send"]`: the tensor this rank sends to the next).

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
    """Bytes one rank sends for a ring collective: all_reduce 2(n-1)/n * payload, all_gather (n-1)/n * payload;
    all_to_all: the payload itself (CountingComm counts only the chunks bound for other ranks); ring_send: the payload
    itself (the tensor sent to the next rank)."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n * payload_bytes
    if op == "all_gather":
        return (n - 1) / n * payload_bytes
    if op in ("all_to_all", "ring_send"):
        return float(payload_bytes)
    raise ValueError(f"unknown collective {op!r}; known: all_reduce, all_gather, all_to_all, ring_send")


class Backend(Protocol):
    rank: int
    world_size: int

    def all_reduce(self, t: Tensor) -> Tensor: ...          # sum over ranks

    def all_gather(self, t: Tensor) -> list[Tensor]: ...    # every rank's tensor, in rank order

    def all_to_all(self, chunks: list[Tensor]) -> list[Tensor]: ...   # chunks[r] to rank r; what each sent here

    def ring_pass(self, t: Tensor) -> Tensor: ...            # t to rank r + 1; what rank r - 1 sent here


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
    """The collectives a tensor- or expert-parallel model calls, counted in `stats`."""

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

    def all_to_all(self, chunks: list[Tensor]) -> list[Tensor]:
        """Send chunks[r] to rank r; return the chunk each rank sent to this one, in rank order.

        chunks: one tensor per rank, all with the same trailing shape and dtype (the same on every rank); their
        first dimensions may differ, 0 included. Counted bytes: those of the chunks for the other ranks,
        sum over r != rank of chunks[r].numel() * element_size.
        """
        _check_chunks(chunks, self.world_size)
        self.stats.record("all_to_all", sum(c.numel() * c.element_size() for r, c in enumerate(chunks)
                                            if r != self.rank))
        return self.backend.all_to_all(chunks)

    def ring_pass(self, t: Tensor) -> Tensor:
        """Send `t` to rank r + 1 and return the tensor rank r - 1 sent (ranks mod n), a new tensor; every rank calls
        it at once. Counted as "ring_send", its bytes what this rank sends."""
        if not isinstance(t, Tensor):
            raise TypeError(f"ring_pass sends a tensor, got {type(t).__name__}")
        self.stats.record("ring_send", t.numel() * t.element_size())
        return self.backend.ring_pass(t)


def _check_chunks(chunks: list[Tensor], world_size: int) -> None:
    if not isinstance(chunks, (list, tuple)) or len(chunks) != world_size:
        raise ValueError(f"all_to_all needs a list of {world_size} tensors, one per rank, got "
                         f"{len(chunks) if isinstance(chunks, (list, tuple)) else type(chunks).__name__}")
    if any(not isinstance(c, Tensor) or c.ndim == 0 for c in chunks):
        raise ValueError("all_to_all chunks must be tensors with at least one dimension (rows first)")
    first = chunks[0]
    for r, c in enumerate(chunks):
        if c.shape[1:] != first.shape[1:] or c.dtype != first.dtype:
            raise ValueError(f"all_to_all chunk {r} is {c.dtype} {tuple(c.shape)} but chunk 0 is {first.dtype} "
                             f"{tuple(first.shape)}: every chunk must share the trailing shape and dtype")


class Solo:
    """The world of one rank: collectives are identities."""

    rank, world_size = 0, 1

    def all_reduce(self, t: Tensor) -> Tensor:
        return t.clone()

    def all_gather(self, t: Tensor) -> list[Tensor]:
        return [t]

    def all_to_all(self, chunks: list[Tensor]) -> list[Tensor]:
        return [chunks[0].clone()]

    def ring_pass(self, t: Tensor) -> Tensor:
        return t.clone()


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

    def all_to_all(self, chunks: list[Tensor]) -> list[Tensor]:
        """Two all_to_all_single calls: the row counts first ((world,) long), then every row, flattened.

        The receiver learns from the counts how many rows each rank sends it, so chunks may differ in size;
        the trailing shape and dtype are taken from this rank's own chunks (the same on every rank).
        """
        send_counts = torch.tensor([c.shape[0] for c in chunks], dtype=torch.long)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        rows = torch.cat([c.contiguous() for c in chunks])
        out = torch.empty((int(recv_counts.sum()), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        dist.all_to_all_single(out, rows, output_split_sizes=recv_counts.tolist(),
                               input_split_sizes=send_counts.tolist(), group=self.group)
        return list(torch.split(out, recv_counts.tolist()))

    def ring_pass(self, t: Tensor) -> Tensor:
        """One send to rank r + 1 and one receive from rank r - 1, posted together (batch_isend_irecv), so no rank
        waits for its neighbour's receive before it can send."""
        n, r = self.world_size, self.rank
        if n == 1:
            return t.clone()
        t = t.contiguous()
        received = torch.empty_like(t)
        ops = [dist.P2POp(dist.isend, t, self._peer((r + 1) % n), group=self.group),
               dist.P2POp(dist.irecv, received, self._peer((r - 1) % n), group=self.group)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        return received

    def _peer(self, rank: int) -> int:
        """The global rank of rank `rank` of this group (point-to-point ops name global ranks)."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)


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

    def exchange(self, rank: int, t: Tensor | list[Tensor], op: str) -> list:
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

    def all_to_all(self, chunks: list[Tensor]) -> list[Tensor]:
        # every rank posts its whole list; rank r reads entry r of each
        return [sent[self.rank].clone() for sent in self.group.exchange(self.rank, list(chunks), "all_to_all")]

    def ring_pass(self, t: Tensor) -> Tensor:
        # every rank posts its tensor; each reads the one on its left
        return self.group.exchange(self.rank, t, "ring_pass")[(self.rank - 1) % self.world_size].clone()
