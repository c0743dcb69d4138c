"""The contiguous KV cache (lab 01): keep every layer's keys and values so each new token costs one position.

    cache = KVCache.for_model(model, batch_size=1)               # preallocated, length 0
    logits = model(prompt, positions=cache.next_positions(T), kv_caches=cache)      # prefill: T positions
    logits = model(token, positions=cache.next_positions(1), kv_caches=cache)       # decode: one position

Without a cache, step t of generation re-runs all t tokens through every layer: O(t) work per token
and O(T^2) for a whole answer. With one, a decode step runs one token through the weights (O(1) in t)
and only attention reads the t cached keys and values (O(t), but cheap: no weight matmuls).

Memory: 2 (K and V) * layers * kv_heads * head_dim * positions * bytes_per_element per sequence.
Under grouped-query attention the cache holds the n_kv_heads KV heads, never the n_heads query heads.
Every sequence reserves max_seq_len positions up front; lab 02's paged cache removes that waste.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import Tensor

from minigpt.config import ModelConfig
from minigpt.model import GPT

__all__ = ["LayerKVCache", "KVCache"]


class LayerKVCache:
    """One layer's keys and values for a batch of B sequences, preallocated for max_seq_len positions.

    k, v: (B, max_seq_len, n_kv_heads, head_dim); positions [0, length) hold data, the rest is unused.
    `update` implements the model's per-layer cache protocol (`minigpt.model.LayerCache`).
    """

    def __init__(self, batch_size: int, max_seq_len: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
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
        """An empty cache shaped for `model` (or a config); by default its context, dtype and device. A model is
        anything with .config, .dtype and .device (a GPT, or a grader's handle to one in another process)."""
        is_config = isinstance(model, ModelConfig)
        cfg = model if is_config else model.config
        if dtype is None:
            dtype = torch.float32 if is_config else model.dtype
        if device is None:
            device = "cpu" if is_config else model.device
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
