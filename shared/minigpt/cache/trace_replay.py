"""Replay a trace against a bounded KV pool, block by block (lab 13): what each cache design would hit.

No model runs: a request is its trace record (`minigpt.serving.trace.TraceRecord`), its prompt blocks are its hash
ids, and it holds its blocks from its arrival until it has decoded its output at `ms_per_token` a token. On arrival
it looks up its cached prefix, takes the rest from the pool (evicting cached blocks nobody holds when the pool runs
dry), and caches its blocks; a request that cannot get its blocks even then is refused (counted, not queued).

    hash    lab 02's design: chained block hashes (`PrefixCache`), freed blocks wait in the pool's free queue and the
            oldest freed is reused first (its hash forgotten)
    radix   `RadixCache`: LRU eviction of unreferenced leaves, only when the pool runs dry

With `host_blocks`, evicted blocks go to a host tier of that many blocks (LRU): a prefix block missing from the GPU
pool but held there counts as a host hit (loaded back, not recomputed) and returns to the pool.

Reports block hit rates (GPU, host), blocks computed, and refusals. `replay_trace` runs a whole trace; `TraceReplay`
is the same replay a request at a time, its pool, tree and host tier open to look at between requests (lab 13's
view):

    replay = TraceReplay("radix", pool_blocks=64, host_blocks=32)
    outcome = replay.step(records[0])      # a StepOutcome: what this request hit, loaded, computed, evicted
    replay.result                          # the ReplayResult of the requests so far

A request's matched prefix is its own from the moment it is found: it is never evicted to make room for the rest of
the same request.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from minigpt.cache.block_pool import BlockPool
from minigpt.cache.prefix_cache import PrefixCache, block_hashes
from minigpt.cache.radix_cache import RadixCache
from minigpt.serving.trace import TraceRecord

__all__ = ["ReplayResult", "StepOutcome", "HostTier", "TraceReplay", "replay_trace"]


@dataclass(frozen=True)
class ReplayResult:
    cache: str
    blocks: int              # prompt blocks over the trace
    gpu_hits: int            # found in the GPU pool's cache
    host_hits: int           # found in the host tier
    computed: int            # computed again (prefill)
    refused: int             # requests that could not get their blocks

    @property
    def hit_rate(self) -> float:
        return (self.gpu_hits + self.host_hits) / self.blocks if self.blocks else 0.0


@dataclass(frozen=True)
class StepOutcome:
    """What one request met on arrival. A refused request hit, loaded and computed nothing (its blocks count in
    `ReplayResult.blocks` all the same); the evictions made while trying stay made."""

    record: TraceRecord
    released: int            # requests that finished before it arrived: their blocks went back
    gpu_hits: int
    host_hits: int
    computed: int
    evicted: int             # cached blocks evicted from the pool while serving it (to the host tier, if any)
    refused: bool


class HostTier:
    """The keys of up to `capacity` evicted blocks, least recently added first (0: no host tier)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.keys = capacity, OrderedDict()

    def add(self, key: tuple) -> None:
        if self.capacity:
            self.keys[key] = None
            self.keys.move_to_end(key)
            while len(self.keys) > self.capacity:
                self.keys.popitem(last=False)

    def take(self, key: tuple) -> bool:
        """Remove `key` (its block goes back to the pool); whether it was held."""
        return self.keys.pop(key, False) is None


class TraceReplay:
    """A replay (see the module docstring) fed one record at a time, in arrival order."""

    def __init__(self, cache: str, pool_blocks: int, *, ms_per_token: float = 20.0, host_blocks: int = 0) -> None:
        if cache not in ("hash", "radix"):
            raise ValueError(f"cache must be 'hash' or 'radix', got {cache!r}")
        self.cache, self.ms_per_token = cache, ms_per_token
        self.pool = BlockPool(pool_blocks, 1)                 # one block per hash id: the ids are the 'tokens'
        self.host = HostTier(host_blocks)
        self.prefix = PrefixCache(self.pool) if cache == "hash" else None
        self.tree = RadixCache(self.pool) if cache == "radix" else None
        self.running: list[tuple[float, list[int]]] = []     # (finish time, blocks held) of the admitted requests
        self.evicted = 0
        self._totals = {"blocks": 0, "gpu_hits": 0, "host_hits": 0, "computed": 0, "refused": 0}
        if self.prefix is not None:
            self.pool.on_reuse = self._reused

    def _reused(self, block: int) -> None:                  # the pool reuses a freed cached block: to the host tier
        key = self.prefix.hash_of.get(block)
        if key is not None:
            self.evicted += 1
            self.host.add((key,))
        self.prefix.forget(block)

    def _evicted(self, prefix: tuple, _block: int) -> None:
        self.evicted += 1
        self.host.add(prefix)

    @property
    def result(self) -> ReplayResult:
        return ReplayResult(self.cache, **self._totals)

    def _release(self, now: float) -> int:
        done = [x for x in self.running if x[0] <= now]
        for item in done:
            self.running.remove(item)
            for b in item[1]:
                self.pool.free(b, keep=self.prefix is not None and self.prefix.is_cached(b))
        return len(done)

    def step(self, r: TraceRecord) -> StepOutcome:
        """Release the requests finished by `r`'s arrival, then serve `r` (or refuse it)."""
        pool, tree, prefix = self.pool, self.tree, self.prefix
        released, evicted_before = self._release(r.timestamp), self.evicted
        ids = list(r.hash_ids)
        self._totals["blocks"] += len(ids)
        if prefix is not None:
            hashes = block_hashes(ids, 1)
            hit = prefix.lookup(hashes)
            keys = [(h,) for h in hashes]
            waiting = sum(pool.ref_counts[b] == 0 for b in hit)  # cached blocks in the free queue: not free for us
        else:
            hit = tree.match(ids)
            keys = [tuple(ids[:i + 1]) for i in range(len(ids))]
            waiting = 0
            for b in hit:                                       # held now, so eviction cannot take them
                pool.incref(b)
        need = len(ids) - len(hit)
        if need > pool.num_free - waiting and tree is not None:
            tree.evict(need - pool.num_free, on_evict=self._evicted)
        if need > pool.num_free - waiting:
            if tree is not None:
                for b in hit:
                    pool.free(b)                                # the tree's reference remains
            self._totals["refused"] += 1
            return StepOutcome(r, released, 0, 0, 0, self.evicted - evicted_before, True)
        if prefix is not None:
            for b in hit:
                pool.incref(b)
        new = pool.allocate(need)
        from_host = 0
        while from_host < need and self.host.take(keys[len(hit) + from_host]):
            from_host += 1
        self._totals["gpu_hits"] += len(hit)
        self._totals["host_hits"] += from_host
        self._totals["computed"] += need - from_host
        table = hit + new
        if prefix is not None:
            for b, h in zip(new, hashes[len(hit):]):
                prefix.register(b, h)
        else:
            tree.insert(ids, table)
        self.running.append((r.timestamp + r.output_length * self.ms_per_token, table))
        return StepOutcome(r, released, len(hit), from_host, need - from_host, self.evicted - evicted_before, False)


def replay_trace(records: Sequence[TraceRecord], cache: str, pool_blocks: int, *, ms_per_token: float = 20.0,
                 host_blocks: int = 0) -> ReplayResult:
    """Replay `records` (see the module docstring) with cache "hash" or "radix" and a pool of `pool_blocks` blocks."""
    replay = TraceReplay(cache, pool_blocks, ms_per_token=ms_per_token, host_blocks=host_blocks)
    for r in records:
        replay.step(r)
    return replay.result
