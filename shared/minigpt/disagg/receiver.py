"""The decode side of a KV transfer: its own paged pool, the receiving loop, and decoding from the received blocks.

    store = DecodeKVStore.for_model(model, num_blocks=64, block_size=16)   # lab 02's PagedKVCache underneath
    blocks = receive_kv(channel, "req-1", model.config.n_layers, len(prompt), store)
    tokens = [first_token] + decode_from_blocks(model, store, blocks, len(prompt), first_token, max_new_tokens=15)
    store.free(blocks)                                                      # the pool is as it was

`receive_kv` allocates ceil(T / block_size) blocks of the DECODE worker's pool before the first message, then
writes every layer as it arrives (in any order), token t to block blocks[t // block_size], slot t % block_size.
The messages' `src_blocks` are the producer's ids and are never used. Either every layer 0..n_layers-1 arrives
exactly once and the table is returned, or the blocks go back to the pool and the error is raised: a timeout or a
lost layer (TransferError), a message of another request or a layer twice (TransferError naming it).

`decode_from_blocks` continues greedy decoding with lab 02's machinery (`paged_forward`: the model's layers over
`PagedKVCache` pools, reference `paged_attention`), one token per step, allocating a block whenever the sequence
crosses a block boundary and freeing those extra blocks at the end. The first token and what follows equal lab
01's `generate_kv_cache(model, prompt, 1 + max_new_tokens, stop_token_ids=()).tokens`: the same K/V, the same
first token.
"""

from __future__ import annotations

import operator
from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

from minigpt.cache.block_table import block_tables_tensor, blocks_needed, slot_mapping
from minigpt.cache.paged import PagedBatch, PagedKVCache
from minigpt.cache.paged_attention import write_kv
from minigpt.disagg.channel import KVMessage, TransferError
from minigpt.engine.paged_generation import paged_forward
from minigpt.model import GPT

__all__ = ["DecodeKVStore", "KVReceiver", "WriteIntoStore", "receive_kv", "decode_from_blocks"]

_TENSORS = (torch.Tensor, torch.nn.Parameter)      # what write takes as k and v (never a subclass or a proxy)


class KVReceiver(Protocol):
    """What the consumer needs from a channel."""

    def recv(self, timeout_s: float) -> KVMessage: ...


class DecodeKVStore:
    """The decode worker's KV pool: lab 02's `PagedKVCache` pools, blocks handed out by its `BlockPool`.

    Pools per layer: (num_blocks, block_size, n_kv_heads, head_dim). `allocate` and `free` change only the pool's
    bookkeeping; `write` only the tensors. Each either succeeds or raises with nothing changed. They take plain data
    (ints, a list of block ids, tensors) and refuse anything else before touching the pool, so no code of the
    caller's runs in the middle of a change (lab 11's grader hands this store to a learner's consumer).
    """

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.pool = cache.manager.pool

    @classmethod
    def for_model(cls, model: GPT, num_blocks: int, block_size: int = 16) -> "DecodeKVStore":
        return cls(PagedKVCache.for_model(model, num_blocks, block_size))

    # --- queries -----------------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    @property
    def n_layers(self) -> int:
        return len(self.cache.k_pools)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def read(self, layer: int, blocks: Sequence[int], n_tokens: int) -> tuple[Tensor, Tensor]:
        """k, v (n_tokens, n_kv_heads, head_dim) of positions 0..n_tokens-1 through the table `blocks`."""
        self._check_layer(layer)
        slots = torch.tensor(slot_mapping(list(blocks), 0, n_tokens, self.block_size), dtype=torch.long)
        k_pool, v_pool = self.cache.k_pools[layer], self.cache.v_pools[layer]
        return (k_pool.flatten(0, 1)[slots.to(k_pool.device)], v_pool.flatten(0, 1)[slots.to(v_pool.device)])

    # --- changes -----------------------------------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """n free blocks of this pool (OutOfBlocks, nothing taken, when fewer are free)."""
        return self.pool.allocate(operator.index(n))        # an int (or int-like); TypeError for anything else

    def free(self, blocks: Sequence[int]) -> None:
        """Give the blocks back (ValueError, nothing freed, for an id outside the pool or a block not held)."""
        blocks = _block_ids(blocks)
        self._check_held(blocks, "free")
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"free got block ids more than once: {blocks}")
        for b in blocks:
            self.pool.free(b)

    def write(self, layer: int, blocks: Sequence[int], k: Tensor, v: Tensor) -> None:
        """k, v (T, n_kv_heads, head_dim) into layer `layer`: token t -> block blocks[t // bs], slot t % bs."""
        self._check_layer(layer)
        blocks = _block_ids(blocks)
        if type(k) not in _TENSORS or type(v) not in _TENSORS:
            raise TypeError(f"k and v must be torch tensors, got {type(k).__name__} and {type(v).__name__}")
        pool = self.cache.k_pools[layer]
        if k.ndim != 3 or k.shape != v.shape or tuple(k.shape[1:]) != tuple(pool.shape[2:]):
            raise ValueError(f"k and v must both be (T, n_kv_heads={pool.shape[2]}, head_dim={pool.shape[3]}), "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        if len(blocks) < blocks_needed(k.shape[0], self.block_size):
            raise ValueError(f"{k.shape[0]} tokens need {blocks_needed(k.shape[0], self.block_size)} blocks of "
                             f"{self.block_size}, the table has {len(blocks)}")
        self._check_held(blocks, "write to")
        slots = torch.tensor(slot_mapping(blocks, 0, k.shape[0], self.block_size), dtype=torch.long)
        write_kv(pool, self.cache.v_pools[layer], slots.to(pool.device), k.to(pool.device), v.to(pool.device))

    def _check_layer(self, layer: int) -> None:
        if type(layer) is not int or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, {self.n_layers}), got {layer!r}")

    def _check_held(self, blocks: list[int], verb: str) -> None:
        for b in blocks:
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"cannot {verb} block {b!r}: this pool's ids are 0..{self.num_blocks - 1} (a "
                                 "message's src_blocks are the PRODUCER's ids; use the blocks store.allocate returned)")
            if self.pool.ref_counts[b] == 0:
                raise ValueError(f"cannot {verb} block {b}: it is not allocated (use the blocks store.allocate "
                                 "returned, not a message's src_blocks)")

    def __repr__(self) -> str:
        return f"DecodeKVStore({self.n_layers} layers, {self.num_free}/{self.num_blocks} blocks free, " \
               f"block_size={self.block_size})"


def _block_ids(blocks: Sequence[int]) -> list[int]:
    """The ids of a block table given as a list, tuple or range of ints (TypeError for anything else)."""
    if type(blocks) not in (list, tuple, range):
        raise TypeError(f"a block table is a list of block ids (ints), got {type(blocks).__name__}")
    odd = [type(b).__name__ for b in blocks if type(b) is not int]
    if odd:
        raise TypeError(f"a block table is a list of block ids (ints), got one holding {', '.join(odd)}")
    return list(blocks)


class WriteIntoStore:
    """A colocated prefill's 'channel': each layer's K/V goes straight into the local paged pool (no transfer)."""

    def __init__(self, store: DecodeKVStore, blocks: list[int]) -> None:
        self.store, self.blocks = store, blocks

    def send(self, request_id: str, layer: int, k: Tensor, v: Tensor) -> None:
        self.store.write(layer, self.blocks, k, v)


def receive_kv(channel: KVReceiver, request_id: str, n_layers: int, n_tokens: int, store: DecodeKVStore, *,
               timeout_s: float = 30.0) -> list[int]:
    """Receive every layer of `request_id`'s KV cache into blocks of `store`; return the block table.

    `timeout_s` bounds each wait for a message. On any error the blocks are freed and the error raised.
    """
    blocks = store.allocate(blocks_needed(n_tokens, store.block_size))
    arrived: set[int] = set()
    try:
        while len(arrived) < n_layers:
            msg = channel.recv(timeout_s)
            _check_message(msg, request_id, n_layers, n_tokens, arrived)
            store.write(msg.layer, blocks, msg.k, msg.v)
            arrived.add(msg.layer)
    except Exception:
        store.free(blocks)
        raise
    return blocks


def _check_message(msg: KVMessage, request_id: str, n_layers: int, n_tokens: int, arrived: set[int]) -> None:
    if msg.request_id != request_id:
        raise TransferError(f"waiting for request {request_id!r}, received layer {msg.layer} of request "
                            f"{msg.request_id!r}: the stream is out of step")
    if msg.layer in arrived or not 0 <= msg.layer < n_layers:
        raise TransferError(f"request {request_id!r}: layer {msg.layer} arrived twice or is outside 0..{n_layers - 1}")
    if msg.k.shape[0] != n_tokens:
        raise TransferError(f"request {request_id!r}, layer {msg.layer}: {msg.k.shape[0]} tokens of K/V, "
                            f"expected {n_tokens}")


@torch.inference_mode()
def decode_from_blocks(model: GPT, store: DecodeKVStore, blocks: Sequence[int], n_tokens: int, first_token: int,
                       max_new_tokens: int, *, stop_token_ids: Sequence[int] = (),
                       on_token: Callable[[int], None] | None = None) -> list[int]:
    """Greedy decoding after a received prefill: `blocks` hold positions 0..n_tokens-1 of every layer and
    `first_token` came out of the prefill. Feeds first_token and returns the next `max_new_tokens` tokens, so

        [first_token] + decode_from_blocks(..., n - 1) == generate_kv_cache(model, prompt, n, stop_token_ids=()).tokens

    A token of `stop_token_ids` (none by default) ends it early and is not returned. `on_token(token)` is called
    after each step (e.g. to time it). Blocks this function allocates are freed before it returns, also on an
    error; `blocks` stay the caller's.
    """
    if n_tokens < 1 or len(blocks) < blocks_needed(n_tokens, store.block_size):
        raise ValueError(f"{n_tokens} cached tokens need {blocks_needed(n_tokens, store.block_size)} blocks "
                         f"of {store.block_size}, got {len(blocks)}")
    if max_new_tokens < 0 or n_tokens + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"max_new_tokens must be in [0, {model.config.max_seq_len - n_tokens}] after {n_tokens} "
                         f"cached tokens (context {model.config.max_seq_len}), got {max_new_tokens}")
    table, extra, tokens = list(blocks), [], []
    token, position = int(first_token), n_tokens
    try:
        while len(tokens) < max_new_tokens:
            if position == len(table) * store.block_size:         # a block boundary: one more block
                extra += store.allocate(1)
                table.append(extra[-1])
            batch = _one_token_step(table, position, token, store.block_size, model.device)
            token = int(paged_forward(model, store.cache, batch)[0].float().argmax())
            position += 1
            if on_token is not None:
                on_token(token)
            if token in stop_token_ids:
                break
            tokens.append(token)
    finally:
        store.free(extra)
    return tokens


def _one_token_step(table: list[int], position: int, token: int, block_size: int, device: torch.device) -> PagedBatch:
    """lab 02's step metadata for one sequence feeding one token at `position` (its K/V goes to its slot)."""
    slot = slot_mapping(table, position, position + 1, block_size)
    return PagedBatch(seq_ids=[0], tokens=torch.tensor([[token]], device=device),
                      positions=torch.tensor([[position]], device=device),
                      slots=torch.tensor([slot], device=device), block_tables=block_tables_tensor([table], device),
                      seq_lens=torch.tensor([position + 1], dtype=torch.int32, device=device),
                      q_lens=torch.tensor([1], dtype=torch.int32, device=device), num_cached=[0])
