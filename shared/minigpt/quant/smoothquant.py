"""SmoothQuant (Xiao et al., 2022): W8A8 by migrating activation outliers into the weights.

Activations have a few channels with large magnitudes in every token; per-token INT8 of x then wastes its
grid on them. With per-input-channel factors

    s_j = max|x_j|^alpha / max|W_:,j|^(1 - alpha)        (alpha = migration strength, 0.5 by default)

x / s is easier to quantize and W * s a bit harder; their product is unchanged. The 1/s is folded into the
producer of x exactly as in AWQ (norm weights, or w_up's rows for w_down). Then every projection runs

    y = (s_x * q_x) @ (s_w * q_w)^T,   q_x = round(x / s_x) per token,  q_w = round(W / s_w) per output channel,

with INT8 codes in [-127, 127]: the integer product is what an INT8 tensor core (or VNNI on a CPU) computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minigpt.model import GPT
from minigpt.quant.awq import AWQ_GROUPS, apply_awq_scales
from minigpt.quant.calibration import capture_inputs
from minigpt.quant.formats import check_finite, quantize
from minigpt.quant.linear import quantize_linears

__all__ = ["smoothing_factors", "quantize_per_token", "W8A8Linear", "smooth_model", "smoothquant_model"]


def smoothing_factors(act_absmax: Tensor, weights: list[Tensor], alpha: float = 0.5) -> Tensor:
    """s (in,) = max|x_j|^alpha / max_over_outputs|W_:,j|^(1-alpha), over all weights reading x."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"migration strength alpha must be in [0, 1], got {alpha}")
    w_absmax = torch.cat([w.detach().float().abs() for w in weights]).amax(0)
    s = act_absmax.float().clamp(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1 - alpha)
    return s.clamp(min=1e-5)


def quantize_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (..., in) -> (int8 codes, float32 scale (..., 1)) with one symmetric scale per token (row)."""
    scale = (x.float().abs().amax(-1, keepdim=True) / 127).clamp(min=1e-12)
    return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


class W8A8Linear(nn.Module):
    """INT8 weights (per output channel) and INT8 activations (per token, quantized on the fly)."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        qt = quantize(weight.detach(), 8)                              # symmetric, per output channel
        self.out_features, self.in_features = weight.shape
        self.register_buffer("qweight", qt.q)
        self.register_buffer("scale", qt.scale.reshape(-1).float())

    def forward(self, x: Tensor) -> Tensor:
        qx, sx = quantize_per_token(x)
        # int8 x int8 products summed in float32 are exact here (|sum| < 127^2 * in_features < 2^24 for in <= 1040).
        acc = F.linear(qx.float(), self.qweight.float())
        return (acc * sx * self.scale).to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scale.nbytes


@torch.inference_mode()
def smooth_model(model: GPT, calibration: Tensor, alpha: float = 0.5) -> GPT:
    """A full-precision copy of `model` with SmoothQuant factors folded in (same function as `model`)."""
    if calibration.numel() == 0:
        raise ValueError("the calibration set is empty: SmoothQuant needs activation ranges from at least one sequence")
    names = [f"layers.{i}.{projs[0]}" for i in range(len(model.layers)) for projs, _ in AWQ_GROUPS]
    inputs = capture_inputs(model, calibration, names)
    factors = {}
    for i in range(len(model.layers)):
        for projs, fold in AWQ_GROUPS:
            x = inputs[f"layers.{i}.{projs[0]}"]
            check_finite(x, "calibration input")
            weights = [model.get_submodule(f"layers.{i}.{p}").weight for p in projs]
            factors[f"layers.{i}.{fold}"] = smoothing_factors(x.abs().amax(0), weights, alpha)
    return apply_awq_scales(model, factors)


def smoothquant_model(model: GPT, calibration: Tensor | None, alpha: float = 0.5) -> GPT:
    """W8A8 copy of `model`: smoothing (skipped when calibration is None, i.e. plain W8A8) then W8A8Linear."""
    base = model if calibration is None else smooth_model(model, calibration, alpha)
    return quantize_linears(base, lambda name, w: W8A8Linear(w))
