"""Three small Triton kernels to learn the language on before the FlashAttention kernel (lab 04's warm-ups).

    add(x, y, out)          out = x + y, 1-D; one program per BLOCK elements, the tail masked
    row_softmax(x, out)     out = softmax(x, dim=-1), 2-D; one program per row, the whole row in one block,
                            the max subtracted before exp (masked columns read as -inf)
    matmul(a, b, out)       out = a @ b, (M, K) @ (K, N); one program per (BLOCK_M x BLOCK_N) output tile,
                            a loop over K in steps of BLOCK_K with the K tail masked (other=0)

Each launcher writes into `out` (same device, float32) and returns it. On a machine without a GPU the kernels
run in Triton's interpreter (minigpt.kernels sets TRITON_INTERPRET=1 before they are built).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from minigpt.kernels.triton_support import check_triton_device

__all__ = ["add", "row_softmax", "matmul", "add_kernel", "row_softmax_kernel", "matmul_kernel"]


@triton.jit
def add_kernel(X, Y, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n                                        # the last program's block runs past n
    tl.store(OUT + offs, tl.load(X + offs, mask=ok) + tl.load(Y + offs, mask=ok), mask=ok)


def add(x: Tensor, y: Tensor, out: Tensor, block: int = 256) -> Tensor:
    """out = x + y for 1-D contiguous tensors of one length."""
    check_triton_device(x, y, out)
    if not (x.shape == y.shape == out.shape and x.ndim == 1):
        raise ValueError(f"add expects three 1-D tensors of one length, got {x.shape}, {y.shape}, {out.shape}")
    add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out


@triton.jit
def row_softmax_kernel(X, OUT, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))                         # exp(-inf) = 0 for the padding columns
    tl.store(OUT + row * stride_out + cols, e / tl.sum(e, 0), mask=ok)


def row_softmax(x: Tensor, out: Tensor) -> Tensor:
    """out = softmax(x, dim=-1) for 2-D x (rows contiguous), one program per row."""
    check_triton_device(x, out)
    if x.ndim != 2 or out.shape != x.shape or x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError(f"row_softmax expects 2-D x and out of one shape with contiguous rows, got {x.shape}")
    row_softmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), out.stride(0),
                                      BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


@triton.jit
def matmul_kernel(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)        # (BLOCK_M, BLOCK_K)
        b = tl.load(B + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)        # (BLOCK_K, BLOCK_N)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(C + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a: Tensor, b: Tensor, out: Tensor, block_m: int = 16, block_n: int = 16, block_k: int = 16) -> Tensor:
    """out (M, N) = a (M, K) @ b (K, N), float32, any strides; tiles of at least 16 (tl.dot's minimum)."""
    check_triton_device(a, b, out)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or out.shape != (a.shape[0], b.shape[1]):
        raise ValueError(f"matmul expects a (M, K), b (K, N), out (M, N), got {a.shape}, {b.shape}, {out.shape}")
    M, K = a.shape
    N = b.shape[1]
    matmul_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out
