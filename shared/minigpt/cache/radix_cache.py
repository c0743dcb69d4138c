"""A radix-tree prefix cache (lab 13) over lab 02's block pool: SGLang's RadixAttention at block granularity.

Lab 02's `PrefixCache` keys every full block by a chained hash and lets freed blocks wait in the pool's free queue.
A radix tree keeps the same blocks as paths: an edge holds a run of full blocks (their tokens and block ids), the
children of a node are keyed by the tokens of their first block, and a request's longest cached prefix is one walk
down from the root. Where a new prompt leaves an edge part way, the edge is split at that block boundary, so two
prompts that share 3 of an edge's 5 blocks share exactly those 3.

    tree = RadixCache(pool)
    blocks = tree.match(prompt)            # the longest cached prefix (full blocks): the request increfs them
    ...                                    # the request computes the rest into blocks of its own
    tree.insert(prompt, table)             # cache its full blocks; the tree takes a reference on each new one
    tree.evict(n)                          # when the pool runs dry: free up to n unreferenced blocks, LRU leaves first

References are shared with the pool: the tree holds one on every block it caches, a request one on every block in
its table. A cached block is *unreferenced* when the tree's is its only one (ref_count 1); only unreferenced blocks
can be evicted, and only from leaves (a block's descendants are worthless without it), least recently matched or
inserted first (every node on the path a match or an insert walks is stamped with one tick of a clock; an edge a
prompt leaves part way counts as used by a match, and is split by an insert, whose shared upper part alone is
stamped: so no two leaves ever carry the same stamp, and eviction's order is fully determined). Inserting a block whose tokens are already cached at that place keeps the first copy: two requests
that computed the same prefix in one step cache it once (the second's copy stays its own and is freed with it).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from minigpt.cache.block_pool import BlockPool

__all__ = ["RadixNode", "RadixCache"]

Key = tuple[int, ...]


@dataclass(eq=False)
class RadixNode:
    """An edge from `parent`: `blocks` (ids) holding `tokens` (len(blocks) * block_size of them), and what hangs below."""

    tokens: Key = ()
    blocks: list[int] = field(default_factory=list)
    parent: RadixNode | None = None
    children: dict[Key, RadixNode] = field(default_factory=dict)
    last_used: int = 0

    def __repr__(self) -> str:
        return f"RadixNode({len(self.blocks)} blocks, {len(self.children)} children, last_used={self.last_used})"


class RadixCache:
    """Full blocks of token prefixes in a radix tree whose edges are runs of blocks (see the module docstring)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.root = RadixNode()
        self._clock = itertools.count(1)

    # -- reading --------------------------------------------------------------------------------------------------

    def _first_key(self, tokens: Sequence[int], start: int) -> Key:
        return tuple(int(t) for t in tokens[start:start + self.block_size])

    def _walk(self, tokens: Sequence[int]) -> tuple[list[int], list[tuple[RadixNode, int]]]:
        """The cached blocks of the longest prefix of `tokens` in full blocks, and the (node, blocks matched in it)
        pairs along the path."""
        bs, node, at = self.block_size, self.root, 0
        blocks: list[int] = []
        path: list[tuple[RadixNode, int]] = []
        while len(tokens) - at >= bs:
            child = node.children.get(self._first_key(tokens, at))
            if child is None:
                break
            n = 0
            while n < len(child.blocks) and len(tokens) - at >= bs and \
                    tuple(int(t) for t in tokens[at:at + bs]) == child.tokens[n * bs:(n + 1) * bs]:
                n += 1
                at += bs
            blocks += child.blocks[:n]
            path.append((child, n))
            if n < len(child.blocks):
                break
            node = child
        return blocks, path

    def match(self, tokens: Sequence[int]) -> list[int]:
        """The blocks of the longest cached prefix of `tokens` (whole blocks only); marks the path used now. Takes no
        reference: the caller increfs the blocks it keeps."""
        blocks, path = self._walk(tokens)
        now = next(self._clock)
        for node, _ in path:
            node.last_used = now
        return blocks

    def cached_tokens(self) -> int:
        """Tokens held in the tree (full blocks)."""
        return sum(len(n.blocks) for n in self.nodes()) * self.block_size

    def nodes(self) -> list[RadixNode]:
        """Every node below the root, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    # -- writing --------------------------------------------------------------------------------------------------

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut `node`'s edge after its first n blocks; returns the new upper node (node keeps the rest, below it)."""
        bs = self.block_size
        upper = RadixNode(node.tokens[:n * bs], node.blocks[:n], node.parent, {}, node.last_used)
        node.parent.children[node.tokens[:bs]] = upper
        node.tokens, node.blocks, node.parent = node.tokens[n * bs:], node.blocks[n:], upper
        upper.children[node.tokens[:bs]] = node
        return upper

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """Cache the full blocks of `tokens`, held in `blocks` (block i holds tokens[i*bs:(i+1)*bs]; a trailing partial
        block is not cached). Blocks whose tokens are already cached there stay as they are; the tree increfs each
        block it adds. Returns how many blocks it added."""
        bs = self.block_size
        full = min(len(tokens) // bs, len(blocks))
        if full == 0:
            return 0
        _, path = self._walk(tokens[:full * bs])
        node, at, now = self.root, 0, next(self._clock)
        for child, n in path:
            if n < len(child.blocks):
                child = self._split(child, n)      # the part this prompt shares is used now, the rest is not
            child.last_used = now
            node, at = child, at + n
        if at == full:
            return 0
        new = [int(b) for b in blocks[at:full]]
        for b in new:
            self.pool.incref(b)
        leaf = RadixNode(tuple(int(t) for t in tokens[at * bs:full * bs]), new, node, {}, now)
        node.children[leaf.tokens[:bs]] = leaf
        return len(new)

    def prefix_of(self, node: RadixNode) -> Key:
        """The tokens from the root to the end of `node`'s edge."""
        parts = []
        while node is not None and node is not self.root:
            parts.append(node.tokens)
            node = node.parent
        return tuple(t for part in reversed(parts) for t in part)

    def evict(self, n_blocks: int, on_evict: Callable[[Key, int], None] | None = None) -> int:
        """Free up to `n_blocks` unreferenced blocks (the tree's reference their only one), from leaves, least recently
        used first; a leaf emptied this way may make its parent a leaf in turn. on_evict(prefix, block), where given,
        is told each block before it is freed, with the tokens up to the block's end (a slower tier may keep it).
        Returns how many were freed."""
        heap = [(leaf.last_used, id(leaf), leaf) for leaf in self.nodes() if not leaf.children]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n_blocks:
            _, _, leaf = heapq.heappop(heap)
            while leaf.blocks and freed < n_blocks and self.pool.ref_counts[leaf.blocks[-1]] == 1:
                if on_evict is not None:
                    on_evict(self.prefix_of(leaf), leaf.blocks[-1])
                self.pool.free(leaf.blocks.pop())
                leaf.tokens = leaf.tokens[:len(leaf.blocks) * self.block_size]
                freed += 1
            if leaf.blocks:
                continue                     # referenced by a request (or enough freed): stays
            parent = leaf.parent
            del parent.children[next(k for k, v in parent.children.items() if v is leaf)]
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return freed
