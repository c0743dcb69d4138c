"""The block manager (lab 02): block tables of many sequences over one pool, with copy-on-write forks
and optional prefix caching. It decides WHERE tokens go (slots) and which blocks to copy; the K/V
tensors themselves live in `minigpt.cache.paged.PagedKVCache`.

    m = BlockManager(num_blocks=64, block_size=16, enable_prefix_caching=True)
    r = m.add_sequence("a", prompt)      # r.num_cached prompt tokens reused, r.slots for the others
    r = m.append_tokens("a", [tok])      # one decode step: its slot (a new block at a boundary)
    m.fork("a", "b")                     # b shares all of a's blocks (ref_count 2)
    r = m.append_tokens("b", [tok2])     # b's shared, partly filled last block is copied first: r.copies
    m.free("a"); m.free("b")
    m.add_sequence("c", prompt, salt=2)  # its blocks match only sequences added with the same salt (LoRA id)

Every method either succeeds or raises (OutOfBlocks, ValueError) with nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

from minigpt.cache.block_pool import BlockPool, OutOfBlocks
from minigpt.cache.block_table import BlockTable, blocks_needed
from minigpt.cache.prefix_cache import PrefixCache, block_hashes, hash_block, salt_root

__all__ = ["Reservation", "BlockManager"]


@dataclass
class Reservation:
    """What a write needs: the slots of the new tokens (in order), the (src, dst) block copies to do
    BEFORE writing (copy-on-write), and how many prompt tokens were found in the prefix cache."""

    slots: list[int]
    copies: list[tuple[int, int]] = field(default_factory=list)
    num_cached: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False) -> None:
        self.pool = BlockPool(num_blocks, block_size)
        self.block_size = self.pool.block_size
        self.prefix_cache = PrefixCache(self.pool) if enable_prefix_caching else None
        self.tables: dict[Hashable, BlockTable] = {}
        self.hashes: dict[Hashable, list[int]] = {}       # chained hashes of each sequence's full blocks
        self.roots: dict[Hashable, int | None] = {}       # start of each sequence's chain (its salt's hash)
        self.prompt_tokens = 0                            # statistics over add_sequence calls
        self.cached_tokens = 0

    # --- queries ---------------------------------------------------------------------------------

    def table(self, seq_id: Hashable) -> BlockTable:
        try:
            return self.tables[seq_id]
        except KeyError:
            raise ValueError(f"unknown sequence {seq_id!r}: it was never added or was already freed") from None

    def num_tokens(self, seq_id: Hashable) -> int:
        return self.table(seq_id).num_tokens

    @property
    def hit_rate(self) -> float:
        """Fraction of prompt tokens served from the prefix cache so far."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def blocks_for_append(self, seq_id: Hashable, n: int) -> int:
        """Free blocks that appending n tokens to seq_id needs (new blocks plus a copy-on-write copy)."""
        t = self.table(seq_id)
        if n <= 0:
            return 0
        cow = t.num_tokens % self.block_size != 0 and self.pool.ref_counts[t.blocks[-1]] > 1
        return blocks_needed(t.num_tokens + n, self.block_size) - len(t.blocks) + int(cow)

    def cached_prefix_len(self, tokens: Sequence[int], salt: Hashable | None = None) -> int:
        """Tokens of `tokens` whose K/V the prefix cache holds (what add_sequence would reuse): full cached blocks,
        at most (len - 1) // block_size of them; 0 without prefix caching."""
        if self.prefix_cache is None:
            return 0
        hits = self.prefix_cache.lookup(block_hashes(tokens, self.block_size, salt))
        return min(len(hits), (len(tokens) - 1) // self.block_size) * self.block_size

    # --- changes ---------------------------------------------------------------------------------

    def add_sequence(self, seq_id: Hashable, prompt: Sequence[int], *, salt: Hashable | None = None) -> Reservation:
        """Start a sequence: reuse the longest cached run of its full prompt blocks, allocate the rest and
        return the slots of the prompt tokens still to compute. The last prompt token is always computed
        (its logits are needed), so a prompt cached to its very end recomputes its last block.
        `salt` (e.g. a LoRA adapter id) keeps its blocks apart from other salts' (`prefix_cache.salt_root`)."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already exists; free it first or use another id")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError(f"sequence {seq_id!r}: the prompt is empty")
        hashes = block_hashes(prompt, self.block_size, salt) if self.prefix_cache is not None else []
        hits = self.prefix_cache.lookup(hashes) if self.prefix_cache is not None else []
        hits = hits[:(len(prompt) - 1) // self.block_size]
        revived = sum(1 for b in hits if self.pool.ref_counts[b] == 0)      # cached blocks waiting in the free queue
        needed = blocks_needed(len(prompt), self.block_size) - len(hits)
        if needed > self.pool.num_free - revived:
            raise OutOfBlocks(needed, self.pool.num_free - revived)
        for b in hits:
            self.pool.incref(b)
        num_cached = len(hits) * self.block_size
        self.tables[seq_id] = BlockTable(self.block_size, list(hits), prompt[:num_cached])
        self.hashes[seq_id] = hashes[:len(hits)]
        self.roots[seq_id] = salt_root(salt)
        reservation = self.append_tokens(seq_id, prompt[num_cached:])
        reservation.num_cached = num_cached
        self.prompt_tokens += len(prompt)
        self.cached_tokens += num_cached
        return reservation

    def append_tokens(self, seq_id: Hashable, tokens: Sequence[int]) -> Reservation:
        """Reserve slots for `tokens` after the sequence's current end. Allocates a block only at a block
        boundary; a shared (forked) partly filled last block is first replaced by a private copy."""
        t = self.table(seq_id)
        tokens = [int(x) for x in tokens]
        if not tokens:
            return Reservation([])
        needed = self.blocks_for_append(seq_id, len(tokens))
        if needed > self.pool.num_free:
            raise OutOfBlocks(needed, self.pool.num_free)
        copies: list[tuple[int, int]] = []
        n = t.num_tokens
        if n % self.block_size and self.pool.ref_counts[t.blocks[-1]] > 1:      # copy-on-write
            old = t.blocks[-1]
            (new,) = self.pool.allocate(1)
            copies.append((old, new))
            self.pool.free(old, keep=self._cached(old))
            t.blocks[-1] = new
        t.blocks.extend(self.pool.allocate(blocks_needed(n + len(tokens), self.block_size) - len(t.blocks)))
        t.token_ids.extend(tokens)
        self._register_full_blocks(seq_id)
        return Reservation(t.slots(n, t.num_tokens), copies)

    def resolve_token(self, seq_id: Hashable, index: int, token: int) -> None:
        """Token `index` of the sequence was reserved as a placeholder (a negative id: overlap scheduling, lab 12);
        now its value is known: it takes its place, and a block it completes is hashed for the prefix cache."""
        t = self.table(seq_id)
        if not 0 <= index < t.num_tokens or t.token_ids[index] >= 0:
            raise ValueError(f"sequence {seq_id!r} has no placeholder at token {index}")
        t.token_ids[index] = int(token)
        self._register_full_blocks(seq_id)

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """The child shares every block of the parent (no copy now: copy-on-write at the first write)."""
        t = self.table(parent)
        if child in self.tables:
            raise ValueError(f"cannot fork into {child!r}: that sequence already exists")
        self.tables[child] = BlockTable(self.block_size, self.pool.fork(t.blocks), list(t.token_ids))
        self.hashes[child] = list(self.hashes[parent])
        self.roots[child] = self.roots.get(parent)

    def free(self, seq_id: Hashable) -> None:
        """Release a finished sequence. Cached blocks stay reusable until evicted; the tail goes first."""
        t = self.table(seq_id)
        for block in reversed(t.blocks):
            self.pool.free(block, keep=self._cached(block))
        del self.tables[seq_id]
        del self.hashes[seq_id]
        self.roots.pop(seq_id, None)

    def truncate(self, seq_id: Hashable, num_tokens: int) -> None:
        """Roll a sequence back to its first num_tokens tokens, freeing the blocks no longer needed
        (rejected speculative tokens, lab 06)."""
        t = self.table(seq_id)
        if not 0 <= num_tokens <= t.num_tokens:
            raise ValueError(f"cannot truncate sequence {seq_id!r} of {t.num_tokens} tokens to {num_tokens}")
        keep = blocks_needed(num_tokens, self.block_size)
        for block in reversed(t.blocks[keep:]):
            self.pool.free(block, keep=self._cached(block))
        del t.blocks[keep:], t.token_ids[num_tokens:]
        del self.hashes[seq_id][num_tokens // self.block_size:]
        if num_tokens % self.block_size and self.prefix_cache is not None and self.pool.ref_counts[t.blocks[-1]] == 1:
            self.prefix_cache.forget(t.blocks[-1])     # it will be overwritten in place: its hash would go stale

    def forget_uncomputed(self, seq_id: Hashable, num_computed: int) -> None:
        """The sequence's blocks past its first num_computed tokens were reserved (and hashed if full) but will never
        be computed (it is preempted before its step runs): forget their hashes, so nobody reuses garbage. A block
        shared with another sequence keeps its hash (that sequence found it cached: it was computed)."""
        if self.prefix_cache is None:
            return
        for block in self.table(seq_id).blocks[num_computed // self.block_size:]:
            if self.pool.ref_counts[block] == 1:
                self.prefix_cache.forget(block)

    def _register_full_blocks(self, seq_id: Hashable) -> None:
        """Hash the sequence's full blocks not hashed yet, in order, stopping at a block that holds a placeholder
        (its hash waits for the token: `resolve_token`)."""
        if self.prefix_cache is None:
            return
        t, hashes = self.tables[seq_id], self.hashes[seq_id]
        for i in range(len(hashes), t.num_tokens // self.block_size):        # blocks that just became full
            tokens = t.token_ids[i * self.block_size:(i + 1) * self.block_size]
            if min(tokens) < 0:
                return
            hashes.append(hash_block(hashes[-1] if hashes else self.roots.get(seq_id), tokens))
            self.prefix_cache.register(t.blocks[i], hashes[-1])

    def _cached(self, block: int) -> bool:
        return self.prefix_cache is not None and self.prefix_cache.is_cached(block)
