"""Block tables (lab 02): where each sequence's logical positions live in the block pool.

A sequence of n tokens holds ceil(n / block_size) blocks, listed in order in its table. Position p
lives in logical block p // block_size, at offset p % block_size, so its physical slot (a row of the
pool viewed as (num_blocks * block_size, n_kv_heads, head_dim)) is

    slot(p) = table[p // block_size] * block_size + p % block_size

Only the last block can be partly filled; appending allocates a new block exactly when the last one is
full (n % block_size == 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["BlockTable", "slot_of", "slot_mapping", "blocks_needed", "block_tables_tensor"]


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """ceil(num_tokens / block_size): blocks that hold num_tokens positions."""
    return -(-num_tokens // block_size)


def slot_of(table: list[int], position: int, block_size: int) -> int:
    """The physical slot of logical `position`; ValueError past the table's end."""
    index = position // block_size
    if position < 0 or index >= len(table):
        raise ValueError(f"position {position} is outside the block table ({len(table)} blocks of {block_size} "
                         f"= {len(table) * block_size} positions); append tokens (allocating blocks) before writing there")
    return table[index] * block_size + position % block_size


def slot_mapping(table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Slots of positions [start, end)."""
    return [slot_of(table, p, block_size) for p in range(start, end)]


@dataclass
class BlockTable:
    """One sequence: its blocks in logical order and the token ids written so far (the prefix cache
    hashes full blocks of them)."""

    block_size: int
    blocks: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def capacity(self) -> int:
        """Positions the allocated blocks can hold."""
        return len(self.blocks) * self.block_size

    def slot(self, position: int) -> int:
        return slot_of(self.blocks, position, self.block_size)

    def slots(self, start: int, end: int) -> list[int]:
        return slot_mapping(self.blocks, start, end, self.block_size)


def block_tables_tensor(tables: list[list[int]], device: torch.device | str = "cpu") -> Tensor:
    """(B, max_blocks) int32, each row a table padded with 0 (padding is never read: seq_lens masks it)."""
    width = max((len(t) for t in tables), default=0)
    out = torch.zeros(len(tables), max(width, 1), dtype=torch.int32)
    for i, t in enumerate(tables):
        out[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    return out.to(device)
