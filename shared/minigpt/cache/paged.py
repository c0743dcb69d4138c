"""The paged KV cache (lab 02): per-layer K/V block pools shared by a batch of sequences.

    cache = PagedKVCache.for_model(model, num_blocks=256, block_size=16, enable_prefix_caching=True)
    batch = cache.prepare([("a", prompt_a), ("b", prompt_b)])     # new sequences: their prompts
    with using_attention(model, cache.attention(batch)):
        logits = model(batch.tokens, positions=batch.positions, kv_caches=cache.layers(batch))
    last = batch.last_logits(logits)                               # (B, V): each sequence's last real token
    batch = cache.prepare([("a", [tok_a]), ("b", [tok_b])])        # decode step: one token each
    cache.free("a")

A batch of sequences of different lengths is PADDED to the longest query count of the step (Tq):
token (B, Tq), positions (B, Tq); padding tokens get slot -1 (never written) and their outputs are
ignored. Padding keeps the model's (B, T, d_model) shapes; packing all tokens into one row, as vLLM
does, avoids the wasted rows but needs per-token metadata in every layer (lab 03's batched runner).

`minigpt.engine.paged_generation` runs whole generations on it. Pools per layer:
(num_blocks, block_size, n_kv_heads, head_dim); see `paged_attention` for the attention. With `prefix_cache="radix"`
the manager keeps its cached blocks in lab 13's radix tree (`radix_manager.RadixBlockManager`), not lab 02's hashes,
and with `host_tier_blocks` > 0 the blocks it evicts go to a host tier (`host_tier.HostTier`) from which later prompts
load them back. Those copies are queued by the manager and run before the step that needs them: at once here
(`prepare`), by the engine's runner on the model's thread (`take_host_ops`, `run_host_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.block_table import block_tables_tensor
from minigpt.cache.host_tier import HostTier
from minigpt.cache.paged_attention import paged_attention, write_kv
from minigpt.cache.radix_manager import RadixBlockManager
from minigpt.config import ModelConfig
from minigpt.model import GPT

__all__ = ["PagedBatch", "PagedLayerView", "PagedKVCache"]


@dataclass
class PagedBatch:
    """The metadata of one forward step over B sequences (padded to Tq tokens each)."""

    seq_ids: list[Hashable]
    tokens: Tensor          # (B, Tq) int64, 0 in padding
    positions: Tensor       # (B, Tq) int64 absolute positions (padding repeats the last real one)
    slots: Tensor           # (B, Tq) int64 slot of each token, -1 in padding
    block_tables: Tensor    # (B, max_blocks) int32
    seq_lens: Tensor        # (B,) int32 length of each sequence after this step
    q_lens: Tensor          # (B,) int32 real tokens of each sequence in this step
    num_cached: list[int]   # prompt tokens found in the prefix cache (new sequences; 0 otherwise)

    def last_logits(self, logits: Tensor) -> Tensor:
        """logits (B, Tq, V) -> (B, V) at each sequence's last real token."""
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, self.q_lens.to(logits.device).long() - 1]


class PagedLayerView:
    """One layer's cache for one step (the model's `LayerCache` protocol): `update` writes the new K/V
    through the slot mapping and returns the whole pools; `PagedKVCache.attention(batch)` reads them."""

    def __init__(self, k_pool: Tensor, v_pool: Tensor, batch: PagedBatch) -> None:
        self.k_pool, self.v_pool, self.batch = k_pool, v_pool, batch
        real = batch.slots >= 0
        self._real = real
        self._slots = batch.slots[real]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (B, Tq, Hkv, D) -> the pools (num_blocks, block_size, Hkv, D) (the model transposes dims 1, 2)."""
        write_kv(self.k_pool, self.v_pool, self._slots, k[self._real], v[self._real])
        return self.k_pool, self.v_pool


class PagedKVCache:
    """K/V pools for every layer plus the `BlockManager` that maps sequences onto them."""

    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 enable_prefix_caching: bool = False, prefix_cache: str = "hash", host_tier_blocks: int = 0) -> None:
        if prefix_cache not in ("hash", "radix"):
            raise ValueError(f"prefix_cache must be 'hash' (lab 02) or 'radix' (lab 13), got {prefix_cache!r}")
        radix = enable_prefix_caching and prefix_cache == "radix"
        if host_tier_blocks and not radix:
            raise ValueError("a host tier (host_tier_blocks > 0) keeps what the radix tree evicts: it needs "
                             "enable_prefix_caching=True and prefix_cache='radix'")
        self.host = (HostTier(host_tier_blocks, n_layers=n_layers, block_size=block_size, n_kv_heads=n_kv_heads,
                              head_dim=head_dim, dtype=dtype) if host_tier_blocks else None)
        self.manager = (RadixBlockManager(num_blocks, block_size, host=self.host) if radix
                        else BlockManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching))
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.k_pools = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v_pools = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.device = torch.device(device)

    @classmethod
    def for_model(cls, model: GPT | ModelConfig, num_blocks: int, block_size: int = 16, *,
                  enable_prefix_caching: bool = False, prefix_cache: str = "hash", host_tier_blocks: int = 0,
                  dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "PagedKVCache":
        is_config = isinstance(model, ModelConfig)     # a model: anything with .config, .dtype, .device (a handle too)
        cfg = model if is_config else model.config
        dtype = dtype or (torch.float32 if is_config else model.dtype)
        device = device or ("cpu" if is_config else model.device)
        return cls(cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim, dtype=dtype, device=device,
                   enable_prefix_caching=enable_prefix_caching, prefix_cache=prefix_cache,
                   host_tier_blocks=host_tier_blocks)

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    @property
    def num_blocks(self) -> int:
        return self.manager.pool.num_blocks

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in all layers: 2 * n_layers * block_size * n_kv_heads * head_dim * element size."""
        return sum(p[0].nbytes for p in self.k_pools) * 2

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.k_pools + self.v_pools)

    def prepare(self, entries: Sequence[tuple[Hashable, Sequence[int]]]) -> PagedBatch:
        """Reserve slots for one step. entries: (seq_id, tokens); an unknown seq_id starts a new sequence
        with `tokens` as its prompt (its cached prefix is skipped), a known one appends `tokens`.

        Each sequence's reservation is all-or-nothing (OutOfBlocks leaves it unchanged), but sequences
        reserved earlier in the same call keep their slots: a scheduler checks capacity first (lab 03).
        Copy-on-write copies are done here, before the step writes anything.
        """
        if not entries:
            raise ValueError("prepare needs at least one (seq_id, tokens) entry")
        m = self.manager
        rows, starts, cached = [], [], []
        for seq_id, tokens in entries:
            tokens = [int(t) for t in tokens]
            if seq_id in m.tables:
                if not tokens:
                    raise ValueError(f"sequence {seq_id!r}: a step needs at least one new token")
                start = m.num_tokens(seq_id)
                r = m.append_tokens(seq_id, tokens)
            else:
                start = 0
                r = m.add_sequence(seq_id, tokens)
            self.run_host_ops(self.take_host_ops())
            self.copy_blocks(r.copies)
            rows.append((tokens[r.num_cached:], r.slots))
            starts.append(start + r.num_cached)
            cached.append(r.num_cached)
        B, Tq = len(rows), max(len(t) for t, _ in rows)
        tokens = torch.zeros(B, Tq, dtype=torch.long)
        positions = torch.zeros(B, Tq, dtype=torch.long)
        slots = torch.full((B, Tq), -1, dtype=torch.long)
        for b, ((toks, sl), start) in enumerate(zip(rows, starts)):
            n = len(toks)
            tokens[b, :n] = torch.tensor(toks)
            positions[b] = torch.arange(start, start + Tq).clamp(max=start + n - 1)
            slots[b, :n] = torch.tensor(sl)
        seq_ids = [s for s, _ in entries]
        dev = self.device
        return PagedBatch(seq_ids, tokens.to(dev), positions.to(dev), slots.to(dev),
                          block_tables_tensor([m.table(s).blocks for s in seq_ids], dev),
                          torch.tensor([m.num_tokens(s) for s in seq_ids], dtype=torch.int32, device=dev),
                          torch.tensor([len(t) for t, _ in rows], dtype=torch.int32, device=dev), cached)

    def take_host_ops(self) -> list[tuple[str, int, int]]:
        """The host tier's copies decided since the last call ([] without a host tier)."""
        return self.host.take_ops() if self.host is not None else []

    def give_back_host_ops(self, ops: Sequence[tuple[str, int, int]]) -> None:
        """Copies taken for a step that will not run: the next `take_host_ops` returns them first."""
        if ops:
            self.host.give_back(ops)

    def run_host_ops(self, ops: Sequence[tuple[str, int, int]]) -> None:
        """Run copies taken by `take_host_ops`, in order, before anything reads or writes the blocks they touch."""
        if ops:
            self.host.run(ops, self.k_pools, self.v_pools)

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: block src -> block dst in every layer's pools."""
        for src, dst in copies:
            for pool in self.k_pools + self.v_pools:
                pool[dst] = pool[src]

    def layers(self, batch: PagedBatch) -> list[PagedLayerView]:
        """The per-layer caches to pass as `kv_caches=` for this step."""
        return [PagedLayerView(k, v, batch) for k, v in zip(self.k_pools, self.v_pools)]

    def attention(self, batch: PagedBatch) -> AttentionFn:
        """The attention function for this step (set it with `using_attention`): it receives the pools from
        `PagedLayerView.update` (transposed by the model) and reads them through the batch's block tables."""
        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return paged_attention(q, k.transpose(1, 2), v.transpose(1, 2), batch.block_tables, batch.seq_lens,
                                   batch.q_lens)
        return attend

    def fork(self, parent: Hashable, child: Hashable) -> None:
        self.manager.fork(parent, child)

    def free(self, seq_id: Hashable) -> None:
        self.manager.free(seq_id)

    def truncate(self, seq_id: Hashable, num_tokens: int) -> None:
        self.manager.truncate(seq_id, num_tokens)

    def __repr__(self) -> str:
        pool = self.manager.pool
        return (f"PagedKVCache({len(self.k_pools)} layers, {pool.num_used}/{pool.num_blocks} blocks used, "
                f"block_size={self.block_size}, {len(self.manager.tables)} sequences, {self.nbytes} bytes)")
