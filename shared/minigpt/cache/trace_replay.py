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

Reports block hit rates (GPU, host), blocks computed, and refusals.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from minigpt.cache.block_pool import BlockPool
from minigpt.cache.prefix_cache import PrefixCache, block_hashes
from minigpt.cache.radix_cache import RadixCache
from minigpt.serving.trace import TraceRecord

__all__ = ["ReplayResult", "replay_trace"]


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


class _HostTier:
    def __init__(self, capacity: int) -> None:
        self.capacity, self.keys = capacity, OrderedDict()

    def add(self, key: tuple) -> None:
        if self.capacity:
            self.keys[key] = None
            self.keys.move_to_end(key)
            while len(self.keys) > self.capacity:
                self.keys.popitem(last=False)

    def take(self, key: tuple) -> bool:
        return self.keys.pop(key, False) is None


def replay_trace(records: Sequence[TraceRecord], cache: str, pool_blocks: int, *, ms_per_token: float = 20.0,
                 host_blocks: int = 0) -> ReplayResult:
    """Replay `records` (see the module docstring) with cache "hash" or "radix" and a pool of `pool_blocks` blocks."""
    if cache not in ("hash", "radix"):
        raise ValueError(f"cache must be 'hash' or 'radix', got {cache!r}")
    pool = BlockPool(pool_blocks, 1)                       # one block per hash id: the ids are the 'tokens'
    host = _HostTier(host_blocks)
    prefix = PrefixCache(pool) if cache == "hash" else None
    tree = RadixCache(pool) if cache == "radix" else None
    if prefix is not None:
        forget = prefix.forget

        def evicted(block: int) -> None:                  # the pool reuses a freed cached block: to the host tier
            key = prefix.hash_of.get(block)
            if key is not None:
                host.add((key,))
            forget(block)
        pool.on_reuse = evicted
    running: list[tuple[float, list[int]]] = []           # (finish time, blocks held)
    gpu_hits = host_hits = computed = refused = total = 0
    for r in records:
        now = r.timestamp
        for item in [x for x in running if x[0] <= now]:
            running.remove(item)
            for b in item[1]:
                pool.free(b, keep=prefix is not None and prefix.is_cached(b))
        ids = list(r.hash_ids)
        total += len(ids)
        if prefix is not None:
            hashes = block_hashes(ids, 1)
            hit = prefix.lookup(hashes)
            keys = [(h,) for h in hashes]
        else:
            hit = tree.match(ids)
            keys = [tuple(ids[:i + 1]) for i in range(len(ids))]
        need = len(ids) - len(hit)
        if need > pool.num_free and tree is not None:
            tree.evict(need - pool.num_free, on_evict=lambda p, _b: host.add(p))
        if need > pool.num_free:
            refused += 1
            continue
        for b in hit:
            pool.incref(b)
        new = pool.allocate(need)
        from_host = 0
        while from_host < need and host.take(keys[len(hit) + from_host]):
            from_host += 1
        gpu_hits, host_hits, computed = gpu_hits + len(hit), host_hits + from_host, computed + need - from_host
        table = hit + new
        if prefix is not None:
            for b, h in zip(new, hashes[len(hit):]):
                prefix.register(b, h)
        else:
            tree.insert(ids, table)
        running.append((now + r.output_length * ms_per_token, table))
    return ReplayResult(cache, total, gpu_hits, host_hits, computed, refused)
