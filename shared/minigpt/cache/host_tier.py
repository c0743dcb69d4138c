"""The engine's host tier (lab 13): KV blocks the radix tree evicts are kept in host memory and loaded back when a
later prompt needs them, instead of being recomputed.

    host = HostTier(128, n_layers=4, block_size=16, n_kv_heads=4, head_dim=32)
    manager = RadixBlockManager(num_blocks, block_size, host=host)   # evictions saved, saved prefixes restored
    ops = host.take_ops()                 # the copies decided since the last step ...
    host.run(ops, k_pools, v_pools)       # ... run by the next step, in the order they were decided

A block's key is its salted tokens from the first to the block's last (what the tree matches on), so one key always
names the same K/V. The tier is an LRU of `host_blocks` slots in tensors allocated once, (host_blocks, n_layers,
block_size, n_kv_heads, head_dim) for K and for V (on a GPU they would be pinned, copied on a side stream).

Decisions are made at once, on the thread that schedules: which slot a saved key takes (the least recently used one
when the tier is full, never one `pinned` for a restore under way), which pool block a load fills. The copies are
only queued: the next step takes them (`take_ops`) and runs them on the model's thread before it reads or writes any
block. That is what makes them safe: with overlap scheduling (lab 12) the step in flight may still be writing a block
the scheduler has just evicted, so its save must wait for that step, and a restored block must land before the step
that reads it (lab 13's Exercise 5). Run in the order decided, a save into a slot comes after every earlier load out
of it, and a load into a block before any later save of it.

Whether loading beats recomputing is lab 00's arithmetic (`minigpt.costmodel.offload`); `worth_loading(tokens)`
decides per request (default: always; on a CPU a host-to-host copy always wins, measured in `make bench`).
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

__all__ = ["HostTier"]

Key = tuple[int, ...]
Op = tuple[str, int, int]          # ("save", pool block, slot) or ("load", slot, pool block)


class HostTier:
    """An LRU of `host_blocks` evicted KV blocks in host memory, with its copies queued for the model's thread."""

    def __init__(self, host_blocks: int, *, n_layers: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, worth_loading: Callable[[int], bool] | None = None) -> None:
        if isinstance(host_blocks, bool) or not isinstance(host_blocks, int) or host_blocks < 1:
            raise ValueError(f"host_blocks must be an int >= 1, got {host_blocks!r}")
        shape = (host_blocks, n_layers, block_size, n_kv_heads, head_dim)
        self.k, self.v = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
        self.host_blocks, self.block_size = host_blocks, block_size
        self.worth_loading = worth_loading
        self._slots: OrderedDict[Key, int] = OrderedDict()     # key -> slot, least recently used first
        self._free = list(range(host_blocks - 1, -1, -1))
        self._pinned: set[Key] = set()
        self._ops: list[Op] = []
        self.stats = {"saved": 0, "kept": 0, "dropped": 0, "replaced": 0, "loaded": 0}

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def holds(self, key: Key) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def save(self, key: Key, block: int) -> None:
        """Keep `key`, held in pool block `block`, in the tier (the radix tree's `on_evict`). A key held already is
        only made most recently used (same tokens, same K/V); a full tier gives up its least recently used unpinned
        key, or, if every key is pinned, the save is dropped."""
        if key in self._slots:
            self._slots.move_to_end(key)
            self.stats["kept"] += 1
            return
        if self._free:
            slot = self._free.pop()
        else:
            victim = next((k for k in self._slots if k not in self._pinned), None)
            if victim is None:
                self.stats["dropped"] += 1
                return
            slot = self._slots.pop(victim)
            self.stats["replaced"] += 1
        self._slots[key] = slot
        self._ops.append(("save", int(block), slot))
        self.stats["saved"] += 1

    def run_from(self, keys: Iterable[Key]) -> list[Key]:
        """The longest run of `keys`, from the first, that the tier holds (a hole ends it: a block is worthless
        without the ones before it), or [] when loading it is not worth it."""
        run: list[Key] = []
        for key in keys:
            if key not in self._slots:
                break
            run.append(key)
        if run and self.worth_loading is not None and not self.worth_loading(len(run) * self.block_size):
            return []
        return run

    @contextmanager
    def pinned(self, keys: Sequence[Key]) -> Iterator[None]:
        """While inside, `save` never gives up these keys' slots (a restore is taking them)."""
        self._pinned = set(keys)
        try:
            yield
        finally:
            self._pinned = set()

    def restore(self, keys: Sequence[Key], blocks: Sequence[int]) -> None:
        """Queue loading each key into its pool block (each key most recently used now; KeyError if not held)."""
        for key, block in zip(keys, blocks, strict=True):
            slot = self._slots[key]
            self._slots.move_to_end(key)
            self._ops.append(("load", slot, int(block)))
            self.stats["loaded"] += 1

    def take_ops(self) -> list[Op]:
        """The copies queued since the last call, for the next step to run."""
        ops, self._ops = self._ops, []
        return ops

    def give_back(self, ops: Sequence[Op]) -> None:
        """Copies taken for a step that was dropped before it ran: queued again, ahead of the rest."""
        self._ops[:0] = list(ops)

    def run(self, ops: Sequence[Op], k_pools: Sequence[Tensor], v_pools: Sequence[Tensor]) -> None:
        """Do the copies, in order: a save copies pool block -> slot in every layer, a load slot -> pool block.
        k_pools[l], v_pools[l]: layer l's pool (num_blocks, block_size, n_kv_heads, head_dim)."""
        for kind, a, b in ops:
            for layer, (kp, vp) in enumerate(zip(k_pools, v_pools)):
                if kind == "save":
                    self.k[b, layer].copy_(kp[a])
                    self.v[b, layer].copy_(vp[a])
                else:
                    kp[b].copy_(self.k[a, layer])
                    vp[b].copy_(self.v[a, layer])
