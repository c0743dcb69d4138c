"""The block pool (lab 02): fixed-size KV blocks handed out from a free queue, with reference counts.

    pool = BlockPool(num_blocks=64, block_size=16)
    a, b = pool.allocate(2)          # two blocks, each with ref_count 1
    pool.incref(a)                   # a fork or a prefix-cache hit shares block a: ref_count 2
    pool.free(a); pool.free(a)       # back in the free queue once nobody holds it

The pool only counts: it never touches K/V tensors. The free queue is ordered for eviction: the
front is taken first. A freed block that still carries a prefix-cache hash goes to the BACK (it may
be reused by a later request, least recently used first); a block with nothing worth keeping goes
to the FRONT. Taking a block from the queue calls `on_reuse(block)`, so the prefix cache can drop
the hash of content about to be overwritten.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

__all__ = ["OutOfBlocks", "BlockPool", "check_block_size"]


class OutOfBlocks(RuntimeError):
    """Not enough free blocks for a request. Raised before anything changes, so the caller (a
    scheduler) can catch it, preempt or wait, and retry."""

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(f"out of KV blocks: need {needed} free block(s) but only {free} are free; "
                         "free finished sequences, preempt one, or give the pool more blocks")
        self.needed, self.free = needed, free


def check_block_size(block_size: object) -> int:
    """Return block_size as an int, or raise ValueError naming the problem."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer (tokens per block), got {block_size!r}")
    return block_size


class BlockPool:
    """`num_blocks` physical blocks of `block_size` token slots; ids 0..num_blocks-1.

    Invariants: a block is in the free queue iff its ref_count is 0; ref_count = number of holders.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.block_size = check_block_size(block_size)
        self.ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.on_reuse: Callable[[int], None] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_blocks(self) -> list[int]:
        """The free queue, front (next to be taken) first."""
        return list(self._free)

    def is_free(self, block: int) -> bool:
        return block in self._free

    def allocate(self, n: int = 1) -> list[int]:
        """Take n blocks from the front of the free queue (ref_count 1 each).

        Raises OutOfBlocks, changing nothing, when fewer than n are free.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise OutOfBlocks(n, len(self._free))
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            if self.on_reuse is not None:
                self.on_reuse(block)            # its old content (and hash) is about to be overwritten
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def incref(self, block: int) -> None:
        """One more holder of `block` (a fork, or a prefix-cache hit). A free cached block leaves the queue."""
        self._check_id(block)
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def fork(self, blocks: list[int]) -> list[int]:
        """Share every block of a table with a new holder; returns the same ids (no copy: copy-on-write later)."""
        for block in blocks:
            self._check_id(block)
            if self.ref_counts[block] == 0:
                raise ValueError(f"cannot fork free block {block}: only blocks somebody holds can be shared")
        for block in blocks:
            self.ref_counts[block] += 1
        return list(blocks)

    def free(self, block: int, *, keep: bool = False) -> None:
        """Drop one holder of `block`. At ref_count 0 it returns to the free queue: at the back when `keep`
        (its content is cached and worth keeping, evicted least recently used first), else at the front."""
        self._check_id(block)
        if self.ref_counts[block] <= 0:
            raise ValueError(f"block {block} is already free (double free)")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free[block] = None
            if not keep:
                self._free.move_to_end(block, last=False)

    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} is outside the pool [0, {self.num_blocks})")

    def __repr__(self) -> str:
        return f"BlockPool({self.num_used}/{self.num_blocks} blocks used, block_size={self.block_size})"
