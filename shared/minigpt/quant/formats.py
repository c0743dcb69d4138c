"""Number formats for quantization: integers with scales, INT4 packing, FP8.

Integer quantization maps a real tensor x onto a grid of 2^bits levels:

    symmetric:   q = clamp(round(x / s), -(2^(b-1) - 1), 2^(b-1) - 1),    s = max|x| / (2^(b-1) - 1)
    asymmetric:  q = clamp(round(x / s) + z, 0, 2^b - 1),                 s = (max x - min x) / (2^b - 1),
                 z = round(-min x / s)
    dequantize:  x_hat = s * q    (symmetric)      x_hat = s * (q - z)    (asymmetric)

One scale covers a whole tensor (per-tensor), one row of a weight (out_features, in_features) (per
output channel), or `group_size` consecutive inputs of one row (per group: scales (out, in / group_size)).
Symmetric INT8 keeps -128 unused, so the grid is symmetric and max|x| maps exactly to +-127.

INT4 codes are packed two to a byte along the last axis: element 2j in the low nibble, 2j+1 in the high.

FP8 (torch.float8_e4m3fn, torch.float8_e5m2) is a float with 4 or 5 exponent bits: the grid is finer near
zero and coarser far from it. A cast saturates nothing by itself, so x is divided by a scale
s = max|x| / fp8_max first and multiplied back after.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SUPPORTED_BITS", "QuantizedTensor", "int_range", "check_finite", "check_bits", "check_group_size",
           "quantize", "dequantize", "fake_quantize", "pack_int4", "unpack_int4", "FP8_DTYPES", "fp8_format",
           "quantize_fp8", "dequantize_fp8"]

SUPPORTED_BITS = (2, 3, 4, 8)
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bits={bits!r}: integer quantization here supports {SUPPORTED_BITS}")


def check_finite(x: Tensor, what: str = "tensor") -> None:
    """Raise ValueError naming the problem when x holds a NaN or an infinity (a scale would be NaN)."""
    if not torch.isfinite(x).all():
        n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        raise ValueError(f"cannot quantize a {what} with {n_nan} NaN and {n_inf} infinite values "
                         f"(shape {tuple(x.shape)}): the scale would not be finite")


def check_group_size(in_features: int, group_size: int | None) -> None:
    if group_size is None:
        return
    if int(group_size) <= 0 or in_features % group_size:
        raise ValueError(f"group_size={group_size} does not divide the {in_features} input features; "
                         f"choose a divisor of {in_features} (or group_size=None for one scale per output channel)")


def int_range(bits: int, symmetric: bool = True) -> tuple[int, int]:
    """(qmin, qmax) of the integer grid: [-(2^(b-1)-1), 2^(b-1)-1] symmetric, [0, 2^b-1] asymmetric."""
    check_bits(bits)
    if symmetric:
        return -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
    return 0, 2 ** bits - 1


@dataclass
class QuantizedTensor:
    """Integer codes and the scales (and zero points) to read them back.

    q: int8 codes with the shape of the original tensor (uint8 for asymmetric 8-bit).
    scale, zero: (rows, n_groups) for a 2-D tensor with groups, (rows, 1) per channel, (1, 1) per tensor.
    """

    q: Tensor
    scale: Tensor
    zero: Tensor | None
    bits: int
    group_size: int | None

    @property
    def symmetric(self) -> bool:
        return self.zero is None

    def dequantize(self) -> Tensor:
        return dequantize(self)


def _grouped(x: Tensor, group_size: int | None, per_tensor: bool) -> Tensor:
    """View x (rows, cols) as (rows, n_groups, group) so one scale covers the last axis."""
    if per_tensor:
        return x.reshape(1, 1, -1)
    if group_size is None:
        return x.reshape(x.shape[0], 1, -1)
    return x.reshape(x.shape[0], -1, group_size)


def quantize(x: Tensor, bits: int, *, symmetric: bool = True, group_size: int | None = None,
             per_tensor: bool = False) -> QuantizedTensor:
    """Round-to-nearest quantization of a 2-D tensor (rows = output channels, cols = input features).

    group_size=None and per_tensor=False: one scale per row; group_size=g: one per g columns of a row;
    per_tensor=True: one scale for all.
    """
    check_bits(bits)
    if x.ndim != 2:
        raise ValueError(f"quantize expects a 2-D (out_features, in_features) tensor, got shape {tuple(x.shape)}")
    check_group_size(x.shape[1], None if per_tensor else group_size)
    check_finite(x)
    xg = _grouped(x.float(), group_size, per_tensor)
    qmin, qmax = int_range(bits, symmetric)
    if symmetric:
        scale = (xg.abs().amax(-1) / qmax).clamp(min=1e-12)                      # (rows, groups)
        q = torch.round(xg / scale[..., None]).clamp(qmin, qmax)
        zero = None
        dtype = torch.int8
    else:
        lo, hi = xg.amin(-1).clamp(max=0), xg.amax(-1).clamp(min=0)               # the grid holds 0 exactly
        scale = ((hi - lo) / qmax).clamp(min=1e-12)
        zero = torch.round(-lo / scale).clamp(qmin, qmax)
        q = (torch.round(xg / scale[..., None]) + zero[..., None]).clamp(qmin, qmax)
        dtype = torch.uint8 if bits == 8 else torch.int8
    return QuantizedTensor(q.reshape(x.shape).to(dtype), scale, zero, bits, None if per_tensor else group_size)


def dequantize(qt: QuantizedTensor) -> Tensor:
    """Float32 tensor s * (q - z), the scales broadcast over their groups."""
    qg = _grouped(qt.q.float(), qt.group_size, qt.scale.numel() == 1 and qt.q.shape[0] != 1)
    if qt.zero is not None:
        qg = qg - qt.zero[..., None]
    return (qg * qt.scale[..., None]).reshape(qt.q.shape)


def fake_quantize(x: Tensor, bits: int, *, symmetric: bool = True, group_size: int | None = None,
                  per_tensor: bool = False) -> Tensor:
    """dequantize(quantize(x)) in x's dtype: the values the quantized model computes with."""
    return dequantize(quantize(x, bits, symmetric=symmetric, group_size=group_size, per_tensor=per_tensor)).to(x.dtype)


def pack_int4(q: Tensor) -> Tensor:
    """INT4 codes (..., n) in [-8, 15] (int8 or uint8) -> uint8 (..., n/2); element 2j low nibble, 2j+1 high."""
    if q.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even last dimension, got {q.shape[-1]}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 15):
        raise ValueError(f"INT4 codes must lie in [-8, 7] (signed) or [0, 15] (unsigned), got [{int(q.min())}, {int(q.max())}]")
    nib = (q.to(torch.int16) & 0xF).to(torch.uint8)
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def unpack_int4(packed: Tensor, signed: bool = True) -> Tensor:
    """uint8 (..., n/2) -> int8 codes (..., n); signed nibbles are sign-extended to [-8, 7]."""
    lo, hi = (packed & 0xF).to(torch.int8), (packed >> 4).to(torch.int8)
    if signed:
        lo, hi = (lo ^ 8) - 8, (hi ^ 8) - 8
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def fp8_format(dtype: torch.dtype | str) -> dict[str, float]:
    """Range and precision of an FP8 format, computed from torch.finfo and the bit layout.

    max: largest finite value; smallest_normal: 2^(1 - bias); smallest_subnormal: 2^(1 - bias - mantissa_bits);
    eps: 2^-mantissa_bits, the relative step between neighbouring normal values.
    """
    dtype = FP8_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in FP8_DTYPES.values():
        raise ValueError(f"not an FP8 dtype: {dtype!r}; use one of {list(FP8_DTYPES)}")
    fi = torch.finfo(dtype)
    mantissa_bits = int(round(-torch.log2(torch.tensor(fi.eps)).item()))
    exponent_bits = fi.bits - 1 - mantissa_bits
    return {"bits": fi.bits, "exponent_bits": exponent_bits, "mantissa_bits": mantissa_bits, "max": float(fi.max),
            "smallest_normal": float(fi.smallest_normal), "smallest_subnormal": float(fi.smallest_normal) * float(fi.eps),
            "eps": float(fi.eps)}


def quantize_fp8(x: Tensor, dtype: torch.dtype | str = "e4m3", per_channel: bool = True) -> tuple[Tensor, Tensor]:
    """x (rows, cols) -> (codes in the FP8 dtype, float32 scale (rows, 1) or (1, 1)), with max|x| mapped to fp8 max."""
    dtype = FP8_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    fmax = fp8_format(dtype)["max"]
    check_finite(x)
    x32 = x.float()
    amax = x32.abs().amax(-1, keepdim=True) if per_channel else x32.abs().amax().reshape(1, 1)
    scale = (amax / fmax).clamp(min=1e-12)
    return (x32 / scale).clamp(-fmax, fmax).to(dtype), scale


def dequantize_fp8(codes: Tensor, scale: Tensor) -> Tensor:
    return codes.float() * scale
