"""A fused dequantizing GEMV in Triton: y = W_hat x for one token, W_hat = s * q read as INT8 or packed INT4.

At batch 1 a decode step is a matrix-vector product per projection: every weight is read once and used for
one multiply-add, so time = bytes of W / memory bandwidth. Reading 1 byte (INT8) or half a byte (INT4)
per weight instead of 2 (bf16) cuts the time by up to 2x or 4x, *if* the dequantization happens in
registers on the way to the multiply (fused) instead of writing a bf16 copy of W back to memory first.

Layout (same as `minigpt.quant.linear.WeightOnlyLinear`):
    qweight int8 (N, K) or uint8 (N, K/2) with column 2j in the low nibble and 2j+1 in the high nibble,
    scale float32 (N, K / group_size), symmetric codes; x (K,) -> y (N,) in x's dtype, float32 accumulation.

Each program computes BLOCK_N outputs, walking K in chunks of BLOCK_K: load codes, unpack nibbles,
sign-extend, multiply by the group scale and x, accumulate. Without a GPU the kernel runs in Triton's
interpreter (TRITON_INTERPRET=1, set by `minigpt.kernels` when no CUDA device is present): correct, and slow.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["dequant_gemv", "dequant_gemv_reference"]


@triton.jit
def _dequant_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, N, K, n_groups,
                         GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if BITS == 8:
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            ok = row_ok[:, None] & (cols < K)[None, :]
            w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=0).to(tl.float32)
            s = tl.load(s_ptr + rows[:, None] * n_groups + cols[None, :] // GROUP, mask=ok, other=0.0)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            acc += tl.sum(w * s * x[None, :], axis=1)
    else:
        HALF: tl.constexpr = BLOCK_K // 2
        for k0 in range(0, K, BLOCK_K):
            j = k0 // 2 + tl.arange(0, HALF)                     # byte index within the row
            ok = row_ok[:, None] & (j < K // 2)[None, :]
            b = tl.load(w_ptr + rows[:, None] * (K // 2) + j[None, :], mask=ok, other=0).to(tl.int32)
            lo = ((b & 15) ^ 8) - 8                                # sign-extend the low nibble: column 2j
            hi = (((b >> 4) & 15) ^ 8) - 8                         # high nibble: column 2j + 1
            s = tl.load(s_ptr + rows[:, None] * n_groups + (2 * j[None, :]) // GROUP, mask=ok, other=0.0)
            x_even = tl.load(x_ptr + 2 * j, mask=j < K // 2, other=0.0).to(tl.float32)
            x_odd = tl.load(x_ptr + 2 * j + 1, mask=j < K // 2, other=0.0).to(tl.float32)
            acc += tl.sum(s * (lo.to(tl.float32) * x_even[None, :] + hi.to(tl.float32) * x_odd[None, :]), axis=1)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)


def _check(x: Tensor, qweight: Tensor, scale: Tensor, bits: int, group_size: int) -> tuple[int, int]:
    if bits not in (4, 8):
        raise ValueError(f"dequant_gemv supports bits=4 or 8, got {bits!r}")
    if x.ndim != 1:
        raise ValueError(f"x must be one token vector (K,), got shape {tuple(x.shape)}")
    K = x.shape[0]
    N = qweight.shape[0]
    packed_k = K // 2 if bits == 4 else K
    if qweight.ndim != 2 or qweight.shape[1] != packed_k:
        raise ValueError(f"qweight {tuple(qweight.shape)} does not match x of {K} features at {bits} bits "
                         f"(expected (N, {packed_k}))")
    if group_size <= 0 or K % group_size or (bits == 4 and group_size % 2):
        raise ValueError(f"group_size={group_size} does not divide the {K} input features (or is odd for INT4)")
    if tuple(scale.shape) != (N, K // group_size):
        raise ValueError(f"scale {tuple(scale.shape)} should be (N, K / group_size) = ({N}, {K // group_size})")
    return N, K


def dequant_gemv(x: Tensor, qweight: Tensor, scale: Tensor, bits: int, group_size: int, *,
                 block_n: int = 16, block_k: int = 128) -> Tensor:
    """y (N,) = dequantize(qweight, scale) @ x for x (K,); see the module docstring for the layout."""
    N, K = _check(x, qweight, scale, bits, group_size)
    if not (qweight.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("dequant_gemv needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported")
    y = torch.empty(N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(N, block_n),)
    _dequant_gemv_kernel[grid](x.contiguous(), qweight.contiguous(), scale.float().contiguous(), y, N, K,
                               K // group_size, GROUP=group_size, BITS=bits, BLOCK_N=block_n, BLOCK_K=block_k)
    return y


def dequant_gemv_reference(x: Tensor, qweight: Tensor, scale: Tensor, bits: int, group_size: int) -> Tensor:
    """The same product in PyTorch: unpack, dequantize to float32, matrix-vector product."""
    N, K = _check(x, qweight, scale, bits, group_size)
    if bits == 4:
        lo, hi = (qweight & 0xF).to(torch.int8), (qweight >> 4).to(torch.int8)
        q = torch.stack([(lo ^ 8) - 8, (hi ^ 8) - 8], -1).reshape(N, K)
    else:
        q = qweight
    w = q.float() * scale.float().repeat_interleave(group_size, 1)
    return (w @ x.float()).to(x.dtype)
