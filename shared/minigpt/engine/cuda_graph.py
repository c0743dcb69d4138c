"""Fixed-shape decoding for CUDA graphs (lab 01, GPU tier).

A graph replays recorded kernels with fixed shapes and addresses, so the decode step must not slice
the cache to its current length: `StaticLayerView` writes K/V at device-side positions and hands the
whole buffers to `static_attention`, which masks the slots beyond each query's position.
`GraphedDecodeStep` captures one such step and replays it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.model import GPT

__all__ = ["static_attention", "StaticLayerView", "using_attention", "GraphedDecodeStep"]


def static_attention(positions: Tensor) -> AttentionFn:
    """Attention over whole cache buffers, for fixed shapes: the query at absolute position p sees slots j <= p.

    positions: (Tq,) device tensor, read when the function runs (so a CUDA graph sees new values).
    q (B, Hq, Tq, D), k, v (B, Hkv, S, D) with S = the cache's max_seq_len -> (B, Hq, Tq, D).
    Under GQA the `group` query heads of a KV head are folded into the query axis, (B, Hkv, group*Tq, D),
    so the KV heads are never repeated.
    """
    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        B, Hq, Tq, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        group = Hq // Hkv
        visible = torch.arange(S, device=k.device)[None, :] <= positions[:, None]     # (Tq, S)
        q = q.reshape(B, Hkv, group * Tq, D)                                          # rows ordered (g, t)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible.repeat(group, 1))
        return out.reshape(B, Hq, Tq, D)
    return attend


class StaticLayerView:
    """A layer cache seen with fixed shapes: writes K/V at `positions` (index_copy_, no Python ints)
    and returns the whole buffers (B, max_seq_len, Hkv, D). Pair it with `static_attention(positions)`.
    It does not move the layer's `length`; the caller does."""

    def __init__(self, layer: LayerKVCache, positions: Tensor) -> None:
        self.layer, self.positions = layer, positions

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.layer.k.index_copy_(1, self.positions, k)
        self.layer.v.index_copy_(1, self.positions, v)
        return self.layer.k, self.layer.v


@contextmanager
def using_attention(model: GPT, fn: AttentionFn) -> Iterator[None]:
    """Swap every layer's attention function for the duration of the block."""
    before = [block.attn.attention for block in model.layers]
    model.set_attention(fn)
    try:
        yield
    finally:
        for block, previous in zip(model.layers, before):
            block.attn.attention = previous


class GraphedDecodeStep:
    """One decode step (one new token per sequence) with fixed shapes, replayed from a CUDA graph on a GPU.

        step = GraphedDecodeStep(model, cache)          # after (or before) prefill
        logits = step(tokens, position)                 # tokens (B, 1) -> logits (B, V); K/V written at `position`

    A small model's eager decode step is launch-bound: dozens of tiny kernels, each costing microseconds
    of CPU-side launch overhead. The graph records them once and replays them with one launch. Inputs
    are copied into static buffers; the returned logits are a static buffer too, overwritten by the next
    call (clone them to keep them). `use_graph=False` runs the same fixed-shape step eagerly (any device).
    """

    def __init__(self, model: GPT, cache: KVCache, *, use_graph: bool | None = None, warmup: int = 3) -> None:
        self.model, self.cache = model, cache
        device = cache[0].k.device
        self.tokens = torch.zeros(cache.batch_size, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(1, dtype=torch.long, device=device)
        self.views = [StaticLayerView(layer, self.positions) for layer in cache]
        self.attention = static_attention(self.positions)
        self.use_graph = device.type == "cuda" if use_graph is None else use_graph
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None
        if self.use_graph:
            self._capture(warmup)

    def _forward(self) -> Tensor:
        with using_attention(self.model, self.attention):
            return self.model(self.tokens, positions=self.positions, kv_caches=self.views)[:, -1]

    @torch.inference_mode()
    def _capture(self, warmup: int) -> None:
        # Warm-up runs really execute and write K/V at one slot: use a free one and restore it afterwards.
        slot = min(self.cache.length, self.cache.max_seq_len - 1)
        saved = [(layer.k[:, slot].clone(), layer.v[:, slot].clone()) for layer in self.cache]
        self.positions.fill_(slot)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):             # warm up (cuBLAS handles, allocator) off the capture stream
            for _ in range(warmup):
                self._forward()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()
        for layer, (k, v) in zip(self.cache, saved):
            layer.k[:, slot] = k
            layer.v[:, slot] = v

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, position: int) -> Tensor:
        if not 0 <= position < self.cache.max_seq_len:
            raise ValueError(f"decode position {position} is outside the cache [0, {self.cache.max_seq_len})")
        self.tokens.copy_(tokens)
        self.positions.fill_(position)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._forward()
        for layer in self.cache:
            layer.length = position + 1
        return logits
