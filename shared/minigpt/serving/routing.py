"""Routing policies (lab 08): which replica serves a request.

Prefix-aware routing sends requests that share a prompt prefix to the same replica, so the prefix's
KV blocks are computed once and then found in THAT replica's prefix cache (lab 02). The key is the
chained block hash (`minigpt.cache.prefix_cache.block_hashes`) of the first `prefix_blocks` full
blocks of the prompt: equal keys <=> equal first prefix_blocks * block_size tokens. A prompt with fewer
full blocks uses the hash of the full blocks it has; one shorter than a block hashes its tokens.

The key is placed on a hash ring (consistent hashing, Karger et al. 1997): every replica owns
`vnodes` points ring_hash(f"{replica}#{v}") on a 64-bit circle; a key goes to the replica of the first
point clockwise from it (wrapping around). Removing a replica moves ONLY the keys it owned (to the
next point), and adding one takes keys only for itself, unlike hash % num_replicas, which remaps
about (R - 1) / R of all keys when R changes. Many virtual nodes per replica even out the arcs: with
one point each, arc lengths (the load) vary as much as the arcs themselves.

Round-robin is the baseline: even load, no affinity (a prefix lands on every replica in turn).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from functools import lru_cache
from typing import Hashable, Sequence, TypeVar

from minigpt.cache.prefix_cache import block_hashes, hash_block

__all__ = ["ring_hash", "prefix_key", "HashRing", "route", "RoundRobin", "VNODES"]

R = TypeVar("R", bound=Hashable)
VNODES = 64              # ring points per replica


def ring_hash(key: str) -> int:
    """A position on the ring: the first 8 bytes of SHA-256(key), as an int in [0, 2**64)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def prefix_key(prompt_token_ids: Sequence[int], *, block_size: int = 16, prefix_blocks: int = 4) -> int:
    """The routing key: chained hash of the first min(prefix_blocks, full blocks) blocks; a prompt shorter than
    one block hashes its tokens (hash_block(None, tokens))."""
    if block_size < 1 or prefix_blocks < 1:
        raise ValueError(f"block_size and prefix_blocks must be >= 1, got {block_size} and {prefix_blocks}")
    hashes = block_hashes(list(prompt_token_ids[:block_size * prefix_blocks]), block_size)
    return hashes[-1] if hashes else hash_block(None, prompt_token_ids)


class HashRing:
    """Consistent hashing: `vnodes` points per replica on a 64-bit ring; a key belongs to the next point."""

    def __init__(self, replicas: Sequence[R], vnodes: int = VNODES) -> None:
        if not replicas:
            raise ValueError("a hash ring needs at least one replica")
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"replicas must be distinct, got {list(replicas)}")
        points = sorted((ring_hash(f"{replica}#{v}"), replica) for replica in replicas for v in range(vnodes))
        self.positions = [p for p, _ in points]
        self.owners = [r for _, r in points]

    def lookup(self, key: int) -> R:
        """The replica owning the first point at or after `key`, wrapping past 2**64 to the first point."""
        i = bisect.bisect_left(self.positions, key) % len(self.positions)
        return self.owners[i]


@lru_cache(maxsize=64)
def _ring(replicas: tuple, vnodes: int) -> HashRing:
    return HashRing(replicas, vnodes)


def route(prompt_token_ids: Sequence[int], replicas: Sequence[R], *, block_size: int = 16,
          prefix_blocks: int = 4) -> R:
    """Prefix-aware routing: the replica owning prefix_key(prompt) on a hash ring of `replicas` (VNODES each).
    Independent of the order of `replicas`; requests sharing their first prefix_blocks blocks go to the same one."""
    key = prefix_key(prompt_token_ids, block_size=block_size, prefix_blocks=prefix_blocks)
    return _ring(tuple(replicas), VNODES).lookup(key)


class RoundRobin:
    """The baseline policy: replica i, i+1, ... in turn, whatever the prompt. Same call shape as `route`."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def __call__(self, prompt_token_ids: Sequence[int], replicas: Sequence[R], **_: int) -> R:
        if not replicas:
            raise ValueError("round-robin needs at least one replica")
        return replicas[next(self._counter) % len(replicas)]
