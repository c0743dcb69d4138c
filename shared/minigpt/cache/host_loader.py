"""Bringing a cached prefix back from a slower tier into the paged KV pool, overlapped with other work (lab 13).

An engine that kept evicted blocks in host memory (`TieredStore`) copies them back into free blocks of its GPU pool
on a copy stream: the copy is started, the GPU goes on with other work, and the prefill that reads those blocks
must wait for the copy's event first (reading a block before its copy lands reads whatever the block held before).
`HostLoader` is that copy engine on the CPU: `load(key, block)` starts copying the tier's block `key` into the pool's
block `block` on a worker thread and returns an event at once; `wait(event)` returns when that copy has landed;
`landed(block)` tells whether the block holds the content last loaded into it. `delay_s` stands for a slow link;
`land_on_wait=True` holds every copy until somebody waits for it (the slowest link the contract allows: what a check
uses so that a block read before its wait is always caught, whatever the machine's speed).

`restore_prefix` is the recipe (lab 13's Exercise 5):

    n = restore_prefix(keys, loader, allocate, other_work, prefill, worth_loading, block_size)

1. the longest run of the prompt's block keys, from its first, that the tier holds (a hole ends it: a block is
   worthless without the blocks before it);
2. if loading those `n * block_size` tokens is not worth it (`worth_loading(tokens)`, the cost model of
   `minigpt.costmodel.offload`), load nothing;
3. take n free blocks (`allocate(n)`), start every copy, then do `other_work()` while they run;
4. wait for every copy, then `prefill(blocks, n)`: the prefill reads the n loaded blocks and computes the rest.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable, Sequence

from torch import Tensor

from minigpt.cache.tiers import TieredStore

__all__ = ["HostLoader", "restore_prefix"]


class HostLoader:
    """Copies blocks of `store` into `k_pool[block]`, `v_pool[block]` (pools of shape (num_blocks, layers,
    block_size, kv_heads, head_dim)) on `copiers` worker threads, each copy taking at least `delay_s` (with
    `land_on_wait`, a copy runs only when waited for, in the waiting thread)."""

    def __init__(self, store: TieredStore, k_pool: Tensor, v_pool: Tensor, *, delay_s: float = 0.0,
                 copiers: int = 2, land_on_wait: bool = False) -> None:
        if k_pool.shape != v_pool.shape:
            raise ValueError(f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} differ in shape")
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s!r}")
        self.store, self.k_pool, self.v_pool, self.delay_s = store, k_pool, v_pool, delay_s
        self.land_on_wait = land_on_wait
        self._held: dict[int, Callable[[], None]] = {}
        self._copies = ThreadPoolExecutor(max_workers=copiers, thread_name_prefix="kv-copy")
        self._lock = threading.Lock()
        self._events: dict[int, Future] = {}
        self._latest: dict[int, int] = {}           # block -> the event that last targeted it
        self.log: list[tuple[str, int, object]] = []   # ("load", event, (key, block)) and ("wait", event, None)

    def has(self, key: Hashable) -> bool:
        """Whether a tier holds `key`."""
        return key in self.store

    def load(self, key: Hashable, block: int) -> int:
        """Start copying `key`'s block into pool block `block`; returns the copy's event id at once. KeyError when no
        tier holds `key`, ValueError for a block outside the pool."""
        if not 0 <= int(block) < self.k_pool.shape[0]:
            raise ValueError(f"block {block} is outside the pool [0, {self.k_pool.shape[0]})")
        block = int(block)
        source = self.store.load(key)               # KeyError at once when no tier holds it

        def copy() -> None:
            k, v = source.result()
            if self.delay_s:
                time.sleep(self.delay_s)
            self.k_pool[block].copy_(k)
            self.v_pool[block].copy_(v)

        with self._lock:
            event = len(self._events)
            if self.land_on_wait:                   # held: the copy runs when somebody waits for it
                self._held[event] = copy
                self._events[event] = Future()
            else:
                self._events[event] = self._copies.submit(copy)
            self._latest[block] = event
            self.log.append(("load", event, (key, block)))
        return event

    def wait(self, event: int) -> None:
        """Return once copy `event` has landed (its error raised here, if it failed)."""
        with self._lock:
            future = self._events.get(event) if isinstance(event, int) and not isinstance(event, bool) else None
            if future is None:
                raise ValueError(f"no copy has event {event!r}")
            self.log.append(("wait", event, None))
            held = self._held.pop(event, None)
        if held is not None:
            try:
                held()
                future.set_result(None)
            except BaseException as err:            # noqa: BLE001  (raised below, like a failed copy)
                future.set_exception(err)
        future.result()

    def landed(self, block: int) -> bool:
        """Whether the last copy into `block` has finished (True for a block nothing was copied into)."""
        with self._lock:
            event = self._latest.get(block)
            return event is None or self._events[event].done()

    def close(self) -> None:
        self._copies.shutdown(wait=True)

    def __enter__(self) -> HostLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def restore_prefix(keys: Sequence[Hashable], loader: HostLoader, allocate: Callable[[int], list[int]],
                   other_work: Callable[[], object], prefill: Callable[[list[int], int], object],
                   worth_loading: Callable[[int], bool], block_size: int) -> int:
    """Load the longest run of `keys` (from the first) the tier holds into fresh blocks, overlapped with
    `other_work`, then prefill; returns the number of blocks loaded (see the module docstring)."""
    n = 0
    while n < len(keys) and loader.has(keys[n]):
        n += 1
    if n and not worth_loading(n * block_size):
        n = 0
    blocks = list(allocate(n))
    events = [loader.load(key, block) for key, block in zip(keys[:n], blocks)]
    other_work()
    for event in events:
        loader.wait(event)
    prefill(blocks, n)
    return n
