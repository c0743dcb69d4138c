"""Prefix caching (lab 02): reuse the K/V blocks of a prompt prefix another request already computed.

Every FULL block gets a chained hash, h_i = H(h_{i-1}, tokens of block i) with h_{-1} = None, so a
block's hash identifies its tokens AND everything before them: equal tokens after different prefixes
never match (their K/V differ, since attention mixed in the earlier tokens). A new request looks up its
chained hashes from the start and reuses the longest run found.

A freed block keeps its hash and stays reusable while it waits in the pool's free queue; the pool
takes blocks from the front, so cached blocks are evicted least recently freed first, and taking one
for new content drops its old hash (`BlockPool.on_reuse`). The cache holds no reference of its own:
a cached block's ref_count is the number of sequences using it (0 while it only waits for reuse).

A `salt` starts the chain at h_{-1} = H(salt) instead of None: equal tokens under different salts never
match. Serving LoRA adapters needs it (lab 08): the same prompt has different K/V under each adapter.
"""

from __future__ import annotations

import hashlib
from typing import Hashable, Sequence

from minigpt.cache.block_pool import BlockPool

__all__ = ["hash_block", "block_hashes", "salt_root", "PrefixCache"]


def hash_block(parent_hash: int | None, tokens: Sequence[int]) -> int:
    """Chained hash of one full block: SHA-256 of (parent hash, token ids), as a 64-bit int."""
    data = ("root" if parent_hash is None else str(parent_hash)) + ":" + ",".join(str(int(t)) for t in tokens)
    return int.from_bytes(hashlib.sha256(data.encode()).digest()[:8], "little")


def salt_root(salt: Hashable | None) -> int | None:
    """The chain's start for a salt (None: no salt, the plain chain)."""
    if salt is None:
        return None
    return int.from_bytes(hashlib.sha256(f"salt:{salt!r}".encode()).digest()[:8], "little")


def block_hashes(tokens: Sequence[int], block_size: int, salt: Hashable | None = None) -> list[int]:
    """Chained hashes of the full blocks of `tokens` (a trailing partial block gets none), the chain
    started from `salt_root(salt)`."""
    hashes: list[int] = []
    parent = salt_root(salt)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block(parent, tokens[start:start + block_size])
        hashes.append(parent)
    return hashes


class PrefixCache:
    """hash -> block for full blocks whose K/V are stored, and block -> hash to forget them on reuse."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_of: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        pool.on_reuse = self.forget

    def __len__(self) -> int:
        return len(self.block_of)

    def is_cached(self, block: int) -> bool:
        return block in self.hash_of

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Blocks of the longest cached run hashes[0..k): stops at the first miss."""
        blocks = []
        for h in hashes:
            block = self.block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def register(self, block: int, block_hash: int) -> None:
        """Record that `block` now holds the full block with this hash. If the hash is already cached at
        another block (two requests computed the same prefix at once), the first copy stays the cached one."""
        if block_hash in self.block_of or block in self.hash_of:
            return
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash

    def forget(self, block: int) -> None:
        """Drop the hash of `block` (its content is about to change); nothing if it has none."""
        block_hash = self.hash_of.pop(block, None)
        if block_hash is not None:
            del self.block_of[block_hash]
