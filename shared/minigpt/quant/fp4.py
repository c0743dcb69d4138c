"""Block-scaled 4-bit floats: MXFP4 (OCP Microscaling v1.0) and NVFP4 (NVIDIA, Blackwell), as fake quantization.

Both store each weight as an FP4 E2M1 element (1 sign, 2 exponent bits with bias 1, 1 mantissa bit, no infinity
and no NaN), whose magnitudes are the eight values

    E2M1_GRID = {0, 0.5, 1, 1.5, 2, 3, 4, 6}      (0.5 subnormal; largest normal 6 = 1.5 * 2^2, so emax = 2)

and one shared scale per block of consecutive weights along the last (input) axis:

    MXFP4:  blocks of 32, scale X = 2^e in E8M0 (an 8-bit power of two, e in [-127, 127]) with
            e = floor(log2(max|block|)) - emax,   elements P = RNE_E2M1(w / X) saturated at +-6;
            w_hat = X * P.                                                 4 + 8/32 = 4.25 bits per weight.
    NVFP4:  blocks of 16, a per-tensor FP32 scale t = max|w| / (6 * 448) and per block an E4M3 scale
            s = e4m3(max|block| / (6 * t)),  P = RNE_E2M1(w / (s * t)) saturated at +-6;
            w_hat = t * s * P.                                             4 + 8/16 = 4.5 bits per weight
                                                                           (t is shared by the whole tensor).

RNE_E2M1 rounds to the nearest grid value, ties to the one with an even code (mantissa bit 0): 0.25 -> 0,
0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. The MX rule maps max|block| into [4, 8) before
rounding, so a block's largest values can saturate at 6 (the spec's choice: a power-of-two scale that never
rounds up); NVFP4's fractional E4M3 scale maps max|block| to about 6 exactly. An all-zero block gets zero
elements (and the smallest E8M0 scale, 2^-127, or an E4M3 scale of 0), never NaN.

Shapes: w (..., n) with n divisible by the block size; elements like w (float32 holding E2M1 values); MX scales
(..., n / 32) float32 powers of two; NVFP4 block scales (..., n / 16) torch.float8_e4m3fn and a one-element
float32 tensor scale.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minigpt.quant.formats import check_finite

__all__ = ["E2M1_GRID", "E2M1_MAX", "E2M1_EMAX", "MX_BLOCK", "NV_BLOCK", "E8M0_MIN_EXP", "E4M3_MAX",
           "round_to_e2m1", "quantize_mxfp4", "dequantize_mxfp4", "quantize_nvfp4", "dequantize_nvfp4",
           "fake_quantize_mxfp4", "fake_quantize_nvfp4", "bits_per_weight"]

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E2M1_EMAX = 2                       # exponent of the largest normal E2M1 value: 6 = 1.5 * 2^2
MX_BLOCK, NV_BLOCK = 32, 16
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def bits_per_weight(block: int, scale_bits: int = 8, element_bits: int = 4) -> float:
    """Stored bits per weight of a block-scaled format: element bits + scale bits / block size."""
    return element_bits + scale_bits / block


def round_to_e2m1(x: Tensor) -> Tensor:
    """Round x (any shape, float) to the nearest E2M1 value, ties to even, saturating at +-6; float32 out.

    The grid step is 0.5 below 2 (subnormals and the binade [1, 2)), 1 in [2, 4) and 2 from 4 up, so
    round-half-even of |x| / step (torch.round) picks the neighbour with the even code.
    """
    a = x.float().abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    q = (torch.round(a / step) * step).clamp(max=E2M1_MAX)
    return torch.copysign(q, x.float())


def _blocks(w: Tensor, block: int) -> Tensor:
    """w (..., n) -> float32 (..., n / block, block); ValueError when block does not divide n."""
    if w.ndim == 0 or w.shape[-1] % block:
        raise ValueError(f"the last dimension ({w.shape[-1] if w.ndim else 'a scalar'}) must be a multiple of the "
                         f"block size {block}")
    check_finite(w)
    return w.float().reshape(*w.shape[:-1], w.shape[-1] // block, block)


def quantize_mxfp4(w: Tensor, block: int = MX_BLOCK) -> tuple[Tensor, Tensor]:
    """MXFP4 of w (..., n): (elements float32 (..., n) on the E2M1 grid, scales float32 (..., n / block), powers of
    two) with scale 2^(floor(log2 max|block|) - 2) clamped to E8M0's [2^-127, 2^127]; w ~ elements * scale."""
    wb = _blocks(w, block)
    amax = wb.abs().amax(-1)                                          # (..., n / block)
    exp = torch.floor(torch.log2(amax.clamp(min=torch.finfo(torch.float32).tiny))) - E2M1_EMAX
    exp = torch.where(amax > 0, exp, torch.full_like(exp, E8M0_MIN_EXP)).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    scale = torch.exp2(exp.double())                                  # 2^-127 is below float32's normals: divide in
    elements = round_to_e2m1((wb.double() / scale[..., None]).float())  # float64, then store the scale in float32
    return elements.reshape(w.shape), scale.float()


def dequantize_mxfp4(elements: Tensor, scales: Tensor) -> Tensor:
    """elements (..., n) * their block's scale (..., n / block) -> float32 (..., n)."""
    block = elements.shape[-1] // scales.shape[-1]
    return (elements.float().reshape(*scales.shape, block) * scales.float()[..., None]).reshape(elements.shape)


def quantize_nvfp4(w: Tensor, block: int = NV_BLOCK) -> tuple[Tensor, Tensor, Tensor]:
    """NVFP4 of w (..., n): (elements float32 (..., n) on the E2M1 grid, block scales torch.float8_e4m3fn
    (..., n / block), tensor scale float32 (1,)), t = max|w| / (6 * 448), s = e4m3(max|block| / (6 t));
    w ~ elements * s * t. A block whose scale rounds to 0 in E4M3 (all zero, or 2^10 below the tensor's max) is 0."""
    wb = _blocks(w, block)
    tensor_scale = (wb.abs().amax() / (E2M1_MAX * E4M3_MAX)).clamp(min=1e-30).reshape(1)
    block_scale = (wb.abs().amax(-1) / (E2M1_MAX * tensor_scale)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = block_scale.float()[..., None] * tensor_scale
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    elements = torch.where(denom > 0, round_to_e2m1(wb / safe), torch.zeros_like(wb))
    return elements.reshape(w.shape), block_scale, tensor_scale


def dequantize_nvfp4(elements: Tensor, block_scales: Tensor, tensor_scale: Tensor) -> Tensor:
    """elements (..., n) * block scale (..., n / block) * tensor scale -> float32 (..., n)."""
    block = elements.shape[-1] // block_scales.shape[-1]
    s = block_scales.float()[..., None] * tensor_scale.float()
    return (elements.float().reshape(*block_scales.shape, block) * s).reshape(elements.shape)


def fake_quantize_mxfp4(w: Tensor) -> Tensor:
    """dequantize(quantize(w)) in MXFP4, in w's dtype: the weights an MXFP4 model computes with."""
    return dequantize_mxfp4(*quantize_mxfp4(w)).to(w.dtype)


def fake_quantize_nvfp4(w: Tensor) -> Tensor:
    """dequantize(quantize(w)) in NVFP4, in w's dtype."""
    return dequantize_nvfp4(*quantize_nvfp4(w)).to(w.dtype)
