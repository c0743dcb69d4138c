"""Plausible slow implementations: correct outputs, the wrong speed. Every speed check must reject them.

The lab tests (tests/labs/) hand them to the checks and expect a failure; `make calibrate` (autograder/gpu_tier/calibrate.py)
measures their ratios next to the reference's to place each threshold between the two.

    lab 01  generate_naive (package)          the cached generator's slow twin: recomputes the whole prefix
            eager_decode_step                 the fixed-shape decode step run eagerly (no CUDA graph)
    lab 03  RefillOnlyWhenEmpty               admits new requests only when the batch is empty
    lab 04  flash_small_tiles                 the reference kernel with 16 x 16 tiles (untuned)
            naive_as_flash                    naive attention behind the kernel's signature
            FlashBackwardSmallTiles           the reference autograd Function, backward with 16 x 16 tiles
            NaiveAttentionFunction            autograd of naive attention behind the Function's apply
            paged_decode_one_split            one program per (sequence, KV head): no split of the context
            paged_decode_pytorch              lab 02's PyTorch paged attention (gathers every page)
    lab 05  dequantize_every_call             INT4 CPU linear rebuilding a float weight on every call
            dequantize_then_matmul            GEMV that writes a dequantized weight, then multiplies
    lab 06  recompute_everything              "speculative" generator that re-runs the whole sequence every token
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.engine.scheduler import Scheduler
from minigpt.generate import generate_naive
from minigpt.sampling import SamplingParams

__all__ = ["generate_naive", "eager_decode_step", "RefillOnlyWhenEmpty", "flash_small_tiles", "naive_as_flash",
           "FlashBackwardSmallTiles", "NaiveAttentionFunction",
           "paged_decode_one_split", "paged_decode_pytorch", "dequantize_every_call", "dequantize_then_matmul",
           "recompute_everything"]


def eager_decode_step(model: Any, cache: Any) -> Callable[[Tensor, int], Tensor]:
    """Lab 01 GPU tier: the same fixed-shape step as GraphedDecodeStep, run without capturing a graph."""
    from minigpt.engine.cuda_graph import GraphedDecodeStep

    return GraphedDecodeStep(model, cache, use_graph=False)


class RefillOnlyWhenEmpty(Scheduler):
    """Lab 03: admits only when nothing runs: static batching in disguise."""

    def schedule(self):  # type: ignore[override]
        if self.running:
            saved, self.waiting = self.waiting, type(self.waiting)()
            try:
                return super().schedule()
            finally:
                self.waiting = saved
        return super().schedule()


def flash_small_tiles(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """Lab 04: the reference forward kernel with 16 x 16 tiles: tiny tensor-core dots, K/V re-read T/16 times."""
    from minigpt.kernels.flash_attention import flash_attention_forward

    return flash_attention_forward(q, k, v, causal=causal, block_m=16, block_n=16)


def naive_as_flash(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, None]:
    """Lab 04: unfused attention (fp32 scores written to memory) behind the forward kernel's signature."""
    from minigpt.attention import naive_attention

    if not causal:
        raise ValueError("naive_as_flash is causal only")
    return naive_attention(q, k, v), None


class FlashBackwardSmallTiles(torch.autograd.Function):
    """Lab 04 GPU tier: the reference Triton forward, and its Triton backward launched with 16 x 16 tiles (tiny dots,
    Q, dO re-read Tk/16 times and K, V re-read Tq/16 times)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        from minigpt.kernels.flash_attention import flash_attention_forward

        out, lse = flash_attention_forward(q, k, v, causal=bool(is_causal))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = bool(is_causal)
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        from minigpt.kernels.flash_backward import flash_attention_backward

        q, k, v, out, lse = ctx.saved_tensors
        return (*flash_attention_backward(q, k, v, out, lse, d_out, causal=ctx.is_causal, block_m=16, block_n=16),
                None)


class NaiveAttentionFunction:
    """Lab 04 GPU tier: apply(q, k, v, is_causal) as unfused attention under autograd (the (T x T) probabilities are
    written, kept for the backward and read again)."""

    @staticmethod
    def apply(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        s = (q @ k.transpose(-2, -1)).float() / q.shape[-1] ** 0.5
        if is_causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
        return (torch.softmax(s, -1).to(v.dtype) @ v)


def paged_decode_one_split(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor) -> Tensor:
    """Lab 04: the split-KV kernel with one split per sequence: B x H_kv programs walk the whole context alone."""
    from minigpt.kernels.paged_decode import paged_decode

    return paged_decode(q, k_pool, v_pool, block_tables, seq_lens, pages_per_split=block_tables.shape[1])


def paged_decode_pytorch(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor) -> Tensor:
    """Lab 04: lab 02's paged decode attention in PyTorch (gathers every sequence's pages into a copy)."""
    from minigpt.cache.paged_attention import paged_decode_attention

    return paged_decode_attention(q, k_pool, v_pool, block_tables, seq_lens)


def dequantize_every_call(w: Tensor, group_size: int) -> Callable[[Tensor], Tensor]:
    """Lab 05 CPU: right values, but rebuilds a float weight from the INT4 codes on every call (slower than fp32)."""
    wg = w.float().reshape(w.shape[0], -1, group_size)
    lo = wg.amin(-1, keepdim=True)
    scale = (wg.amax(-1, keepdim=True) - lo) / 15
    q = torch.round((wg - lo) / scale).clamp(0, 15).to(torch.uint8)

    def f(x: Tensor) -> Tensor:
        return F.linear(x, (q.float() * scale + lo).reshape(w.shape))
    return f


def dequantize_then_matmul(x: Tensor, qweight: Tensor, scale: Tensor, bits: int, group_size: int) -> Tensor:
    """Lab 05 GPU: unpack and dequantize W into x's dtype in memory (an extra write and read of N x K), then matmul."""
    N = qweight.shape[0]
    if bits == 4:
        lo, hi = (qweight & 0xF).to(torch.int8), (qweight >> 4).to(torch.int8)
        q = torch.stack([(lo ^ 8) - 8, (hi ^ 8) - 8], -1).reshape(N, -1)
    else:
        q = qweight
    w = q.to(x.dtype) * scale.to(x.dtype).repeat_interleave(group_size, 1)
    return w @ x


def recompute_everything(target: Any, draft: Any, prompt: list[int], max_new_tokens: int,
                         sampling: SamplingParams = SamplingParams(), *, k: int = 4, **kw: Any) -> Any:
    """Lab 06: correct greedy output, but every step re-runs the whole sequence (no cache, no draft)."""
    return generate_naive(target, prompt, max_new_tokens, sampling, **kw)
