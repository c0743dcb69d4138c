"""Static shapes and a compiled decode step (lab 12): one graph per batch-size bucket, over the paged KV pools.

    step = StaticDecodeStep(model, cache, buckets=(1, 2, 4, 8), compile=True)   # reserves one pool block
    inputs = step.inputs(chunks)            # a decode-only step of B <= 8 sequences, padded to its bucket
    logits = step(inputs)                   # (B, V); the first call of each bucket compiles it

A compiler (torch.compile, or a CUDA graph's capture) specializes a step to its shapes: a step whose batch size,
context length or block-table width changes every time recompiles every time. So every input here has a shape
fixed by the bucket alone: the B sequences are padded to the smallest bucket >= B (vLLM captures decode graphs
for a list of batch sizes the same way), each sequence's block table to the model's whole context, and the
attention reads that whole context with a mask (the keys past a sequence's length hidden). A padding row is a
sequence of length 1 that writes and reads only a block reserved for it (vLLM's null block): it never touches a
real sequence's K/V. The first call of a bucket compiles it (`compilations` counts them); after one call of each
bucket nothing compiles again, whatever the mix of batch sizes.

What it costs: the padding rows, and attention over the whole context (a paged-attention kernel would stop at each
sequence's length inside the graph). What it saves: Python's dispatch of every operation (inductor fuses the step
into a few C++ loops on a CPU; `mode="reduce-overhead"` replays a CUDA graph on a GPU).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.cache.block_table import blocks_needed
from minigpt.cache.paged import PagedKVCache
from minigpt.engine.scheduler import ScheduledChunk
from minigpt.engine.static_decode import fuse_weights
from minigpt.model import GPT

__all__ = ["DEFAULT_BUCKETS", "bucket_for", "DecodeRow", "pad_decode_batch", "PADDED_KEYS", "StaticInputs",
           "StaticDecodeStep", "decode_only"]

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= n; ValueError when n exceeds the largest."""
    for b in sorted(buckets):
        if b >= n:
            return b
    raise ValueError(f"a batch of {n} sequences is larger than the largest bucket ({max(buckets)})")


def decode_only(chunks: Sequence[ScheduledChunk]) -> bool:
    """Whether a step is decodes only: one new token for each sequence, after its whole prompt."""
    return all(len(c.tokens) == 1 and not c.is_prefill for c in chunks)


class DecodeRow(NamedTuple):
    """One sequence of a decode step: its new token at `position`, written to pool row `slot`; `blocks` its table
    (a plain (token, position, slot, blocks) tuple works as well)."""

    token: int
    position: int
    slot: int
    blocks: list[int]


PADDED_KEYS = ("tokens", "positions", "slots", "block_tables", "seq_lens")


def pad_decode_batch(rows: Sequence[DecodeRow], bucket: int, max_blocks: int, null_block: int,
                     block_size: int) -> dict[str, Tensor]:
    """A decode step's inputs padded to `bucket` rows, every shape set by (bucket, max_blocks) alone:

    tokens, positions, slots, seq_lens (bucket,) int64 and block_tables (bucket, max_blocks) int64. Row i < len(rows):
    its token, position, slot, length position + 1, and its blocks then `null_block` to the width. A padding row:
    token 0 at position 0, length 1, its slot the null block's first row and its table the null block throughout
    (it writes and reads nothing of any sequence)."""
    if len(rows) > bucket:
        raise ValueError(f"{len(rows)} rows do not fit a bucket of {bucket}")
    tables = torch.full((bucket, max_blocks), null_block, dtype=torch.long)
    tokens = torch.zeros(bucket, dtype=torch.long)
    positions = torch.zeros(bucket, dtype=torch.long)
    slots = torch.full((bucket,), null_block * block_size, dtype=torch.long)
    seq_lens = torch.ones(bucket, dtype=torch.long)
    for i, (token, position, slot, blocks) in enumerate(rows):
        if len(blocks) > max_blocks:
            raise ValueError(f"row {i} has {len(blocks)} blocks, more than the table's {max_blocks}")
        tables[i, :len(blocks)] = torch.tensor(list(blocks), dtype=torch.long)
        tokens[i], positions[i], slots[i], seq_lens[i] = token, position, slot, position + 1
    return {"tokens": tokens, "positions": positions, "slots": slots, "block_tables": tables, "seq_lens": seq_lens}


def _own_code(method: Callable) -> Callable:
    """`method` on a copy of its code object. torch.compile keeps compiled graphs on the code object, at most 8 of
    them (torch._dynamo.config.recompile_limit): steps sharing `_forward`'s code would share that budget, and the
    ninth step made in a process would silently run eager (and warn on stderr). Its own code: its own 8 buckets."""
    f = method.__func__
    copy = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    return types.MethodType(copy, method.__self__)


@dataclass
class StaticInputs:
    """A decode step padded to its bucket: every tensor's shape depends on the bucket alone.

    tokens, positions, slots, seq_lens: (bucket,) int64; block_tables: (bucket, max_blocks) int64; `batch` real rows."""

    tokens: Tensor
    positions: Tensor
    slots: Tensor
    block_tables: Tensor
    seq_lens: Tensor
    batch: int


class StaticDecodeStep:
    """The fused model's decode step over `cache`'s pools with shapes fixed per bucket, eager or compiled."""

    def __init__(self, model: GPT, cache: PagedKVCache, buckets: Sequence[int] = DEFAULT_BUCKETS, *,
                 compile: bool = False, backend: str = "inductor", mode: str | None = None) -> None:
        """`mode="reduce-overhead"` (a GPU): inductor replays each bucket's step from a CUDA graph; the pools and
        weights are marked static (their addresses never change), so the graph writes the pools in place and copies
        no weight in before a replay, and the logits handed out are copied out of the graph's buffer."""
        if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
            raise ValueError(f"buckets must be positive ints, got {tuple(buckets)!r}")
        limit = getattr(torch._dynamo.config, "recompile_limit", 8)     # older torch: cache_size_limit, 8
        if compile and len(set(buckets)) > limit:
            raise ValueError(f"{len(set(buckets))} buckets: torch.compile keeps at most {limit} graphs of one step")
        self.config, self.cache = model.config, cache
        self.buckets = tuple(sorted(set(buckets)))
        self.weights = fuse_weights(model.state_dict(), model.config)
        self.max_blocks = blocks_needed(model.config.max_seq_len, cache.block_size)
        (self.null_block,) = cache.manager.pool.allocate(1)          # padding rows write here, and only here
        self.compilations = 0
        self.cuda_graphs = compile and mode == "reduce-overhead"
        if self.cuda_graphs:
            for t in [*cache.k_pools, *cache.v_pools, *(w for v in self.weights.values()
                                                          for w in (v if isinstance(v, list) else [v]))]:
                torch._dynamo.mark_static_address(t)
        self._step = torch.compile(_own_code(self._forward), dynamic=False, backend=self._counting(backend),
                                   mode=mode) if compile else self._forward

    def _counting(self, backend: str) -> Callable:
        """`backend`, counting each graph it is asked to compile."""
        from torch._dynamo import lookup_backend

        def compile_graph(graph, example_inputs):
            self.compilations += 1
            return lookup_backend(backend)(graph, example_inputs)
        return compile_graph

    def inputs(self, chunks: Sequence[ScheduledChunk]) -> StaticInputs:
        """The step's padded inputs, read from the block manager (a decode-only step of at most max(buckets))."""
        if not chunks or not decode_only(chunks):
            raise ValueError("a static decode step takes decodes only (one token per sequence, prompts done)")
        rows = [DecodeRow(c.tokens[0], c.start, c.slots[0], list(self.cache.manager.table(c.seq_id).blocks))
                for c in chunks]
        padded = pad_decode_batch(rows, bucket_for(len(rows), self.buckets), self.max_blocks, self.null_block,
                                  self.cache.block_size)
        dev = self.cache.device
        return StaticInputs(*(padded[k].to(dev) for k in PADDED_KEYS), len(rows))

    @torch.inference_mode()
    def __call__(self, inputs: StaticInputs) -> Tensor:
        """Logits (B, V) of the real rows."""
        logits = self._step(inputs.tokens, inputs.positions, inputs.slots, inputs.block_tables, inputs.seq_lens)[
            :inputs.batch]
        return logits.clone() if self.cuda_graphs else logits      # a graph's next replay overwrites its output

    def _forward(self, tokens: Tensor, positions: Tensor, slots: Tensor, tables: Tensor, seq_lens: Tensor) -> Tensor:
        """One decode step, (bucket,) rows: K/V written at `slots`, attention over each row's whole table, masked
        past its length."""
        c, w = self.config, self.weights
        H, Hkv, D, d, eps = c.n_heads, c.n_kv_heads, c.head_dim, c.d_model, c.norm_eps
        B, bs = tokens.shape[0], self.cache.block_size
        L = self.max_blocks * bs
        rows = (tables[:, :, None] * bs + torch.arange(bs, device=tables.device)).reshape(B, L)     # pool row per key
        visible = (torch.arange(L, device=tables.device)[None, :] < seq_lens[:, None])[:, None, None, :]
        cos, sin = w["cos"][positions][:, None, :], w["sin"][positions][:, None, :]
        x = w["embed"][tokens]
        for i in range(c.n_layers):
            k_pool = self.cache.k_pools[i].view(-1, Hkv, D)
            v_pool = self.cache.v_pools[i].view(-1, Hkv, D)
            q, k, v = (F.rms_norm(x, (d,), w["attn_norm"][i], eps) @ w["qkv"][i]).split([H * D, Hkv * D, Hkv * D], -1)
            x1, x2 = torch.cat([q, k], -1).view(B, H + Hkv, D).float().chunk(2, -1)      # rotated in float32,
            qk = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).to(x.dtype)   # as the model does
            k_pool.index_copy_(0, slots, qk[:, H:].to(k_pool.dtype))
            v_pool.index_copy_(0, slots, v.view(B, Hkv, D).to(v_pool.dtype))
            keys, values = k_pool[rows].transpose(1, 2), v_pool[rows].transpose(1, 2)                # (B, Hkv, L, D)
            out = F.scaled_dot_product_attention(qk[:, :H, None], keys.to(qk.dtype), values.to(qk.dtype),
                                                 attn_mask=visible, enable_gqa=True)                # (B, H, 1, D)
            x = x + out.reshape(B, H * D) @ w["wo"][i]
            gate, up = (F.rms_norm(x, (d,), w["mlp_norm"][i], eps) @ w["gate_up"][i]).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ w["down"][i]
        return F.rms_norm(x, (d,), w["norm"], eps) @ w["head"]
