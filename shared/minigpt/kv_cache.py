"""The KV cache: keep every layer's keys and values so each new token costs one position, not the whole prefix.

    cache = KVCache.for_model(model, batch_size=1)               # preallocated, length 0
    logits = model(prompt, positions=cache.next_positions(T), kv_caches=cache)      # prefill: T positions
    logits = model(token, positions=cache.next_positions(1), kv_caches=cache)       # decode: one position

Without a cache, step t of generation re-runs all t tokens through every layer: O(t) work per token
and O(T^2) for a whole answer. With one, a decode step runs one token through the weights (O(1) in t)
and only attention reads the t cached keys and values (O(t), but cheap: no weight matmuls).

Memory: 2 (K and V) * layers * kv_heads * head_dim * positions * bytes_per_element per sequence.
Under grouped-query attention the cache holds the n_kv_heads KV heads, never the n_heads query heads.

The second half of the file makes the decode step fixed-shape, so that a GPU can replay it from a CUDA
graph (`GraphedDecodeStep`): the cache buffers are used whole and attention masks the slots beyond each
query's position, instead of slicing to the current length.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.config import ModelConfig
from minigpt.generate import FinishReason, Generation, StopRule, check_request
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID

__all__ = ["LayerKVCache", "KVCache", "generate_kv_cache", "static_attention", "StaticLayerView",
           "using_attention", "GraphedDecodeStep"]


class LayerKVCache:
    """One layer's keys and values for a batch of B sequences, preallocated for max_seq_len positions.

    k, v: (B, max_seq_len, n_kv_heads, head_dim); positions [0, length) hold data, the rest is unused.
    `update` implements the model's per-layer cache protocol (`minigpt.model.LayerCache`).
    """

    def __init__(self, batch_size: int, max_seq_len: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        for name, value in (("batch_size", batch_size), ("max_seq_len", max_seq_len),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if int(value) <= 0:
                raise ValueError(f"LayerKVCache {name} must be a positive integer, got {value!r}")
        shape = (batch_size, max_seq_len, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[1]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes allocated for K and V (the whole capacity, not just `length`)."""
        return self.k.nbytes + self.v.nbytes

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, T, Hkv, D) at positions [length, length + T); return keys and values
        for positions [0, length + T), each (B, length + T, Hkv, D) (views into the buffers, no copy).

        Raises ValueError, leaving the cache untouched, when the shapes are wrong or the write would
        pass max_seq_len.
        """
        expected = (self.batch_size, k.shape[1] if k.ndim == 4 else -1, self.n_kv_heads, self.head_dim)
        if k.shape != v.shape or tuple(k.shape) != expected:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be (batch={self.batch_size}, T, "
                             f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}); under GQA the cache stores "
                             "the KV heads, before any repetition for the query heads")
        start, end = self.length, self.length + k.shape[1]
        if end > self.max_seq_len:
            raise ValueError(f"KV cache overflow: writing {k.shape[1]} positions at position {start} needs {end} "
                             f"positions but the cache holds max_seq_len={self.max_seq_len}")
        self.k[:, start:end] = k
        self.v[:, start:end] = v
        self.length = end
        return self.k[:, :end], self.v[:, :end]

    def reset(self) -> None:
        """Forget the contents (the buffers are kept and overwritten later)."""
        self.length = 0

    def __repr__(self) -> str:
        return (f"LayerKVCache(length={self.length}/{self.max_seq_len}, batch={self.batch_size}, "
                f"kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, {self.k.dtype}, {self.nbytes} bytes)")


class KVCache:
    """The per-layer caches of a model, passed as `model(tokens, positions, kv_caches=cache)`.

    All layers advance together, so `length` is the number of positions already processed and the
    next tokens go at positions `next_positions(T)` = [length, length + T).
    """

    def __init__(self, layers: Sequence[LayerKVCache]) -> None:
        if not layers:
            raise ValueError("a KVCache needs at least one layer")
        self.layers = list(layers)

    @classmethod
    def for_model(cls, model: GPT | ModelConfig, batch_size: int = 1, max_seq_len: int | None = None, *,
                  dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "KVCache":
        """An empty cache shaped for `model` (or a config); by default its context, dtype and device."""
        cfg = model.config if isinstance(model, GPT) else model
        if dtype is None:
            dtype = model.dtype if isinstance(model, GPT) else torch.float32
        if device is None:
            device = model.device if isinstance(model, GPT) else "cpu"
        max_seq_len = cfg.max_seq_len if max_seq_len is None else max_seq_len
        return cls([LayerKVCache(batch_size, max_seq_len, cfg.n_kv_heads, cfg.head_dim, dtype=dtype, device=device)
                    for _ in range(cfg.n_layers)])

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    def __iter__(self) -> Iterator[LayerKVCache]:
        return iter(self.layers)

    @property
    def length(self) -> int:
        """Positions already stored (the same in every layer)."""
        lengths = {layer.length for layer in self.layers}
        if len(lengths) != 1:
            raise RuntimeError(f"the layer caches disagree on their length: {sorted(lengths)}")
        return lengths.pop()

    @property
    def max_seq_len(self) -> int:
        return self.layers[0].max_seq_len

    @property
    def batch_size(self) -> int:
        return self.layers[0].batch_size

    @property
    def nbytes(self) -> int:
        """Bytes allocated for K and V in all layers:
        2 * n_layers * batch * max_seq_len * n_kv_heads * head_dim * bytes_per_element."""
        return sum(layer.nbytes for layer in self.layers)

    def next_positions(self, n: int) -> Tensor:
        """Absolute positions (n,) of the next n tokens: [length, length + n). RoPE must use these."""
        return torch.arange(self.length, self.length + n, device=self.layers[0].k.device)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()

    def __repr__(self) -> str:
        return f"KVCache({len(self)} layers, length={self.length}/{self.max_seq_len}, {self.nbytes} bytes)"


@torch.inference_mode()
def generate_kv_cache(model: GPT, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                      *, stop_token_ids: Sequence[int] = (EOT_ID,), stop_strings: Sequence[str] = (),
                      tokenizer: object | None = None, cache: KVCache | None = None) -> Generation:
    """Generate with a KV cache: one prefill over the prompt, then one-token decode steps.

    Same arguments, sampling and stopping rules as `minigpt.generate.generate_naive`, so the greedy
    output is identical token for token. `cache` (optional) must be empty; by default one sized for
    prompt + max_new_tokens positions is allocated.
    """
    ids = check_request(model, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, model.device)
    if cache is None:
        cache = KVCache.for_model(model, batch_size=1, max_seq_len=len(ids) + max_new_tokens)
    elif cache.length != 0:
        raise ValueError(f"generate_kv_cache needs an empty cache, this one holds {cache.length} positions; call cache.reset()")
    reason: FinishReason | None = "length" if max_new_tokens == 0 else None
    tokens = torch.tensor([ids], device=model.device)                     # prefill: the whole prompt
    while reason is None:
        logits = model(tokens, positions=cache.next_positions(tokens.shape[1]), kv_caches=cache)[:, -1]   # (1, V)
        token = int(sample_next(logits, sampling, generator))
        reason = stop.add(token)
        tokens = torch.tensor([[token]], device=model.device)             # decode: only the new token
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))


# ---------------------------------------------------------------------------------------------------
# Fixed-shape decoding for CUDA graphs
# ---------------------------------------------------------------------------------------------------

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
