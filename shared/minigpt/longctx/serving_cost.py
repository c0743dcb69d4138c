"""What a long request costs: KV bytes, prefill FLOPs, and chunked-prefill time on lab 00's roofline.

    plan = chunked_prefill(PRESETS["Llama-3-8B"], 131_072, chunk=8192, gpu=ACCELERATORS["H100-SXM"])
    plan.time_s, plan.flops, plan.kv_bytes

A prefill of T tokens in chunks of C: chunk c (prefix P = c*C tokens already cached, n new ones) is priced on lab
00's rule, kernel by kernel (`calculators.forward_kernels` with rows n, pairs n*P + n(n+1)/2, K/V of P + n tokens;
`calculators.kernels_time`):
    weight matmuls: 2 * matmul_parameters * n FLOPs; the weights a pass over n positions reads
                    (matmul and norm weights once, n rows of the embedding table, not the whole table)
    attention:      4 * n_layers * n_heads * head_dim * (n * P + n (n + 1) / 2) FLOPs; KV of the prefix read
                    + KV of the chunk written
each at least max(FLOPs / peak, bytes / bandwidth), the two added. The attention term grows with P, so the last
chunks of a 128k prompt are the slowest; summed over the chunks the FLOPs equal one unchunked prefill's
(`calculators.prefill_flops`), while the weights are re-read once per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.costmodel import calculators as calc
from minigpt.costmodel.calculators import ModelShape
from minigpt.costmodel.hardware import Accelerator

__all__ = ["ChunkCost", "PrefillPlan", "chunked_prefill"]


@dataclass(frozen=True)
class ChunkCost:
    start: int          # tokens already cached
    tokens: int         # tokens in this chunk
    flops: int
    bytes: int
    time_s: float


@dataclass(frozen=True)
class PrefillPlan:
    """One request's chunked prefill: per-chunk costs, totals, and the KV cache it leaves behind."""

    seq_len: int
    chunk: int
    chunks: tuple[ChunkCost, ...]
    kv_bytes: int                   # the cache the request leaves behind
    linear_flops_per_token: int     # 2 * matmul_parameters

    @property
    def flops(self) -> int:
        return sum(c.flops for c in self.chunks)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.chunks)

    @property
    def time_s(self) -> float:
        return sum(c.time_s for c in self.chunks)

    @property
    def attention_share(self) -> float:
        """Fraction of the FLOPs spent in QK^T and PV."""
        return 1.0 - self.seq_len * self.linear_flops_per_token / self.flops


def chunked_prefill(shape: ModelShape, seq_len: int, chunk: int, gpu: Accelerator, *, precision: str = "bf16",
                    kv_precision: str = "bf16") -> PrefillPlan:
    """The roofline plan of prefilling `seq_len` tokens `chunk` at a time on `gpu` (batch 1)."""
    if seq_len < 1 or chunk < 1:
        raise ValueError(f"seq_len and chunk must be >= 1, got {seq_len} and {chunk}")
    wbytes, kvbytes = calc.bytes_per_element(precision), calc.bytes_per_element(kv_precision)
    peak, bw = gpu.peak(precision), gpu.memory_bandwidth
    chunks = []
    for start in range(0, seq_len, chunk):
        n = min(chunk, seq_len - start)
        kernels = calc.forward_kernels(shape, n, n * start + n * (n + 1) // 2, start + n,
                                       weight_bytes_per_element=wbytes, kv_bytes_per_element=kvbytes)
        flops, nbytes = sum(f for f, _ in kernels.values()), sum(b for _, b in kernels.values())
        chunks.append(ChunkCost(start, n, flops, nbytes, calc.kernels_time(kernels, peak, bw)))
    kv_tok = calc.kv_bytes_per_token(shape, kvbytes)
    linear = 2 * calc.matmul_parameters(shape)
    return PrefillPlan(seq_len, chunk, tuple(chunks), kv_tok * seq_len, linear)
