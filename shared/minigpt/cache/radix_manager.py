"""The block manager on a radix tree (lab 13): lab 02's `BlockManager` with its cached blocks kept in a `RadixCache`.

    m = RadixBlockManager(num_blocks=64, block_size=16)
    r = m.add_sequence("a", prompt)      # the longest cached prefix reused (r.num_cached tokens), the rest allocated
    r = m.append_tokens("a", [tok])      # full blocks join the tree as they are reserved, like the hash path's
    m.free("a")                          # its blocks stay in the tree (one reference each) until evicted
    m.pool.tree                          # the RadixCache; m.pool.num_free counts what the tree could evict

Where the hash path (`BlockManager` with `enable_prefix_caching`) lets a freed cached block wait in the pool's free
queue with its hash, here the tree holds one reference on every cached block, so a cached block is never in the free
queue: the pool (`RadixPool`) counts the blocks the tree could evict as free, and `allocate` evicts them (least
recently used unreferenced leaves, `RadixCache.evict`) when its free queue runs short. Everything else is lab 02's:
the same tables, copy-on-write, forks, placeholders, the same cap (the last prompt token is always computed), and
the same moment a full block becomes reusable (when it is reserved full, as the hash path registers it).

Salts (LoRA adapters) share one tree: the k-th salt seen moves its tokens by k * 2**32 in the tree's keys, so equal
tokens under different salts never match, and one LRU order covers them all.

Every method either succeeds or raises (OutOfBlocks, ValueError) with nothing changed but the tree's recency stamps
(a lookup marks the prefix it walked as used). Blocks the tree evicts are told to `on_evict(key, block)` first (the
key: the salted tokens up to the block's end), where a slower tier may copy them.

With a host tier (`host=HostTier(...)`, the engine's `host_tier_blocks`), that is where evicted blocks go, and a
prompt's cached prefix is the tree's match followed by the run of blocks the host tier holds after it: those blocks
are allocated, queued to be loaded back (`HostTier.restore`: the next step copies them in before it reads them) and
put into the tree, so a request reuses them as it reuses the tree's own (`restored_tokens` counts them).
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

from minigpt.cache.block_manager import BlockManager, Reservation
from minigpt.cache.block_pool import BlockPool, OutOfBlocks
from minigpt.cache.block_table import BlockTable, blocks_needed
from minigpt.cache.host_tier import HostTier
from minigpt.cache.radix_cache import RadixCache, RadixNode

__all__ = ["SALT_STRIDE", "RadixPool", "RadixBlockManager"]

SALT_STRIDE = 2 ** 32          # a salt's tokens sit k * SALT_STRIDE up in the tree's keys (token ids are below it)
OnEvict = Callable[[tuple[int, ...], int], None]


class RadixPool(BlockPool):
    """A BlockPool whose cached blocks a RadixCache holds (`tree`, one reference each): `num_free` is the free queue
    plus what the tree could evict, and `allocate` evicts LRU leaves when the queue runs short.

    Invariant: `num_free` == the blocks `allocate` can hand out now (exactly: `evictable` is what `tree.evict` of
    everything would free)."""

    def __init__(self, num_blocks: int, block_size: int, *, on_evict: OnEvict | None = None) -> None:
        super().__init__(num_blocks, block_size)
        self.tree = RadixCache(self)
        self.on_evict = on_evict
        self.evicted = 0                                   # blocks evicted so far
        self._changes = 0                                  # bumped by every reference change: evictable's cache key
        self._evictable: tuple[int, int] = (-1, 0)

    # --- queries ---------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return super().num_free + self.evictable()

    def evictable(self) -> int:
        """Blocks `tree.evict` would free if asked for all: from the end of each edge, those only the tree holds, on
        edges none of whose descendants anybody else holds."""
        if self._evictable[0] != self._changes:
            total, gone = 0, {}
            for node in reversed(self.tree.nodes()):                   # children before their parents
                if all(gone[child] for child in node.children.values()):
                    k = 0
                    while k < len(node.blocks) and self.ref_counts[node.blocks[-1 - k]] == 1:
                        k += 1
                    total, gone[node] = total + k, k == len(node.blocks)
                else:
                    gone[node] = False
            self._evictable = (self._changes, total)
        return self._evictable[1]

    # --- changes ---------------------------------------------------------------------------------

    def allocate(self, n: int = 1) -> list[int]:
        """BlockPool.allocate, evicting from the tree first what the free queue lacks (OutOfBlocks, nothing changed,
        if even that is not enough)."""
        short = n - super().num_free
        if short > 0:
            if short > self.evictable():
                raise OutOfBlocks(n, self.num_free)
            self.evicted += self.tree.evict(short, self.on_evict)
        self._changes += 1
        return super().allocate(n)

    def incref(self, block: int) -> None:
        self._changes += 1
        super().incref(block)

    def fork(self, blocks: list[int]) -> list[int]:
        self._changes += 1
        return super().fork(blocks)

    def free(self, block: int, *, keep: bool = False) -> None:
        self._changes += 1
        super().free(block, keep=keep)

    def drop(self, node: RadixNode, n: int) -> None:
        """Take `node`'s edge from its n-th block on out of the tree, with everything below it: the tree's references
        dropped (a block somebody else holds stays theirs), recency untouched (`forget_uncomputed`)."""
        below = [node.children.pop(key) for key in list(node.children)]
        while below:
            child = below.pop()
            below.extend(child.children.values())
            for block in child.blocks:
                self.free(block)
        for block in node.blocks[n:]:
            self.free(block)
        bs = self.block_size
        node.blocks, node.tokens = node.blocks[:n], node.tokens[:n * bs]
        if not node.blocks:
            parent = node.parent
            del parent.children[next(k for k, v in parent.children.items() if v is node)]


class RadixBlockManager(BlockManager):
    """`BlockManager` with prefix caching in a radix tree over its pool (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, *, on_evict: OnEvict | None = None,
                 host: HostTier | None = None) -> None:
        if host is not None and on_evict is not None:
            raise ValueError("give on_evict or a host tier, not both (the host tier is told of every eviction)")
        if host is not None and host.block_size != block_size:
            raise ValueError(f"the host tier's blocks hold {host.block_size} tokens, the pool's {block_size}")
        super().__init__(num_blocks, block_size)
        self.host = host
        self.pool = RadixPool(num_blocks, block_size, on_evict=host.save if host is not None else on_evict)
        self.prefix_cache = self.pool.tree          # not None: schedulers see prefix caching on
        self.salts: dict[Hashable, int] = {}        # salt -> k (its keys k * SALT_STRIDE up); None is 0
        self.restored_tokens = 0                    # prompt tokens loaded back from the host tier
        # self.hashes[seq_id]: the sequence's blocks known to the tree (its first full blocks), as in lab 02
        # self.roots[seq_id]: the sequence's salt

    # --- queries ---------------------------------------------------------------------------------

    @property
    def tree(self) -> RadixCache:
        return self.pool.tree

    def key(self, tokens: Sequence[int], salt: Hashable | None = None) -> list[int]:
        """`tokens` as the tree sees them under `salt` (a salt seen for the first time is given the next k)."""
        if salt is None:
            return [int(t) for t in tokens]
        k = self.salts.setdefault(salt, len(self.salts) + 1)
        return [int(t) + k * SALT_STRIDE for t in tokens]

    def cached_prefix_len(self, tokens: Sequence[int], salt: Hashable | None = None) -> int:
        """Tokens of the longest cached prefix (full blocks), at most (len - 1) // block_size blocks; the walk marks
        that prefix used now."""
        key, cap = self.key(tokens, salt), (len(tokens) - 1) // self.block_size
        hits = min(len(self.tree.match(key)), cap)
        return (hits + len(self._host_run(key, hits, cap))) * self.block_size

    def _host_run(self, key: list[int], start: int, cap: int) -> list[tuple[int, ...]]:
        """The keys of blocks start, start + 1, ... (below cap) that the host tier holds, in an unbroken run."""
        if self.host is None or start >= cap:
            return []
        bs = self.block_size
        return self.host.run_from(tuple(key[:(i + 1) * bs]) for i in range(start, cap))

    # --- changes ---------------------------------------------------------------------------------

    def add_sequence(self, seq_id: Hashable, prompt: Sequence[int], *, salt: Hashable | None = None) -> Reservation:
        """Start a sequence on the longest cached prefix of its prompt (never the whole prompt: the last token is
        computed), taking a reference on those blocks FIRST, so that making room for the rest never evicts them."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already exists; free it first or use another id")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError(f"sequence {seq_id!r}: the prompt is empty")
        key, cap = self.key(prompt, salt), (len(prompt) - 1) // self.block_size
        hits = self.tree.match(key)[:cap]
        for b in hits:
            self.pool.incref(b)
        needed = blocks_needed(len(prompt), self.block_size) - len(hits)
        if needed > self.pool.num_free:
            free = self.pool.num_free
            for b in hits:
                self.pool.free(b)                   # the tree's reference stays: nothing changed
            raise OutOfBlocks(needed, free)
        run = self._host_run(key, len(hits), cap)
        if run:                                     # from the host tier: fresh blocks, loaded by the next step
            with self.host.pinned(run):             # making room may save evicted blocks, never over these
                restored = self.pool.allocate(len(run))
            self.host.restore(run, restored)
            self.tree.insert(run[-1], hits + restored)
            hits = hits + restored
            self.restored_tokens += len(run) * self.block_size
        num_cached = len(hits) * self.block_size
        self.tables[seq_id] = BlockTable(self.block_size, list(hits), prompt[:num_cached])
        self.hashes[seq_id] = list(hits)
        self.roots[seq_id] = salt
        reservation = self.append_tokens(seq_id, prompt[num_cached:])
        reservation.num_cached = num_cached
        self.prompt_tokens += len(prompt)
        self.cached_tokens += num_cached
        return reservation

    def truncate(self, seq_id: Hashable, num_tokens: int) -> None:
        """Lab 02's truncate. A kept, partly cut last block that the tree holds is shared (ref_count 2 or more), so the
        next write copies it first: the tree's copy keeps its tokens, nothing to forget."""
        t = self.table(seq_id)
        if not 0 <= num_tokens <= t.num_tokens:
            raise ValueError(f"cannot truncate sequence {seq_id!r} of {t.num_tokens} tokens to {num_tokens}")
        keep = blocks_needed(num_tokens, self.block_size)
        for block in reversed(t.blocks[keep:]):
            self.pool.free(block)
        del t.blocks[keep:], t.token_ids[num_tokens:]
        del self.hashes[seq_id][num_tokens // self.block_size:]

    def forget_uncomputed(self, seq_id: Hashable, num_computed: int) -> None:
        """Blocks reserved past the first num_computed tokens will never be computed (preempted before its step): from
        the first of them that the tree holds as this sequence's own (nobody else holding it, as in lab 02), the tree
        drops the rest of that edge and everything below it."""
        self.table(seq_id)                           # ValueError for an unknown sequence
        known = self.hashes[seq_id]
        first = num_computed // self.block_size
        found = self._own_block_in_tree(seq_id, first) if len(known) > first else None
        if found is not None:
            self.pool.drop(*found)
        del known[first:]

    def _own_block_in_tree(self, seq_id: Hashable, first: int) -> tuple[RadixNode, int] | None:
        """(node, n): where the tree holds the sequence's own block i >= first (its n-th), the first such i on the
        sequence's path; None if there is none."""
        t, bs, known = self.tables[seq_id], self.block_size, len(self.hashes[seq_id])
        key = self.key(t.token_ids[:known * bs], self.roots[seq_id])
        node, i = self.tree.root, 0
        while i < known and (child := node.children.get(tuple(key[i * bs:(i + 1) * bs]))) is not None:
            for n in range(len(child.blocks)):
                if i == known or tuple(key[i * bs:(i + 1) * bs]) != child.tokens[n * bs:(n + 1) * bs]:
                    return None                      # the path leaves the tree inside this edge
                if i >= first and child.blocks[n] == t.blocks[i] and self.pool.ref_counts[t.blocks[i]] == 2:
                    return child, n
                i += 1
            node = child
        return None

    def _register_full_blocks(self, seq_id: Hashable) -> None:
        """Insert the sequence's full blocks into the tree up to the first block holding a placeholder (its turn comes
        with `resolve_token`); the tree keeps an equal prefix it already holds and takes a reference on the rest."""
        t, known, bs = self.tables[seq_id], self.hashes[seq_id], self.block_size
        full = len(known)
        while full < t.num_tokens // bs and min(t.token_ids[full * bs:(full + 1) * bs]) >= 0:
            full += 1
        if full > len(known):
            self.tree.insert(self.key(t.token_ids[:full * bs], self.roots[seq_id]), t.blocks[:full])
            known.extend(t.blocks[len(known):full])

    def _cached(self, block: int) -> bool:
        return False                                # a cached block is never free: the tree holds it
