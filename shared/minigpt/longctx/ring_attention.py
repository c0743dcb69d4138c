"""Ring attention: the sequence split over ranks, K/V blocks passed around a ring, partials merged by LSE.

    out_block = ring_attention(comm, q_block, k_block, v_block)          # inside run_ranks(worker, n)

Rank r holds block r of the queries, keys and values (T/n tokens each, in order). In step s = 0..n-1 it
holds the K/V block of rank src = (r - s) mod n, computes attention of its queries against it, and passes
the block on to rank r + 1 (receiving the next from r - 1). With a causal mask, block src is
    src == r: the diagonal block, causal inside;     src < r: all visible;     src > r: all in the future, skipped.
Each step gives a partial output o_s and its log-sum-exp lse_s (per query and head); lab 04's merge
    out = sum_s exp(lse_s - logsumexp_s(lse)) o_s
is exactly softmax attention over all the keys. Bytes each rank sends: (n - 1) passes of its K and V block,
    (n - 1) * 2 * B * Hkv * (T / n) * D * bytes_per_element
the same for every rank (the skipped future blocks are passed on all the same; that load imbalance is what
striped / zig-zag orders fix).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from minigpt.kernels.paged_decode import merge_partials
from minigpt.parallel.comm import CountingComm

__all__ = ["block_attention", "ring_pass", "ring_attention", "ring_bytes_per_rank", "split_blocks", "ring_worker"]


def block_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """Attention of q (B, Hq, Tq, D) over one block k, v (B, Hkv, Tk, D) -> (out (B, Hq, Tq, D), lse (B, Hq, Tq)),
    float32. causal=True: the diagonal block (Tq == Tk, query i sees keys j <= i)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).tril().logical_not(), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def ring_pass(comm: CountingComm, t: Tensor) -> Tensor:
    """Send `t` to rank r + 1 and return the tensor rank r - 1 sent (ranks mod n): `comm.ring_pass(t)`, counted in
    comm.stats as "ring_send" (bytes = what this rank sends)."""
    return comm.ring_pass(t)


def ring_attention(comm: CountingComm, q: Tensor, k: Tensor, v: Tensor, causal: bool = True) -> Tensor:
    """This rank's block of causal attention over the whole sequence (see the module docstring); float32."""
    n, r = comm.world_size, comm.rank
    outs, lses = [], []
    for step in range(n):
        src = (r - step) % n
        if not causal or src <= r:
            o, lse = block_attention(q, k, v, causal=causal and src == r)
            outs.append(o)
            lses.append(lse)
        if step < n - 1:
            k, v = ring_pass(comm, k), ring_pass(comm, v)
    return merge_partials(torch.stack(outs, dim=-2), torch.stack(lses, dim=-1))


def ring_bytes_per_rank(seq_len: int, world_size: int, batch: int, n_kv_heads: int, head_dim: int,
                        bytes_per_element: int) -> int:
    """Bytes each rank sends in one ring-attention pass: (n - 1) * 2 * B * Hkv * (T/n) * D * bytes."""
    if seq_len % world_size:
        raise ValueError(f"seq_len={seq_len} must be a multiple of world_size={world_size}")
    return (world_size - 1) * 2 * batch * n_kv_heads * (seq_len // world_size) * head_dim * bytes_per_element


def split_blocks(x: Tensor, world_size: int, rank: int, dim: int = 2) -> Tensor:
    """Block `rank` of `world_size` equal blocks of x along `dim` (the sequence)."""
    if x.shape[dim] % world_size:
        raise ValueError(f"sequence length {x.shape[dim]} is not a multiple of world_size={world_size}")
    return x.chunk(world_size, dim=dim)[rank].contiguous()


def ring_worker(comm: CountingComm, fn, q: Tensor, k: Tensor, v: Tensor, causal: bool = True):
    """A run_ranks worker: split q, k, v (B, H, T, D) by rank, run fn(comm, q_r, k_r, v_r[, causal]);
    return (this rank's output block, calls and bytes it sent)."""
    n, r = comm.world_size, comm.rank
    args = [split_blocks(x, n, r) for x in (q, k, v)]
    out = fn(comm, *args) if causal else fn(comm, *args, causal=False)
    return out, dict(comm.stats.calls), dict(comm.stats.bytes)
