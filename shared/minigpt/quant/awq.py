"""AWQ (Lin et al., 2023): activation-aware weight scaling before round-to-nearest.

A few input channels carry large activations; rounding errors in their weights cost the most. Scaling
input channel j of W up by s_j (and the activation down by 1/s_j) leaves the product unchanged,
x W^T = (x / s)(W s)^T, but shrinks the relative rounding error of the salient columns. AWQ picks

    s = mean|x|^alpha  (normalized),   alpha in a grid over [0, 1],

minimizing the output error || x W^T - (x / s) Q(W s)^T || on calibration inputs, for all projections that
read the same input together. The 1/s is folded into the operation that produces x, so the full-precision
model computes the same function and no extra work is done at run time:

    wq, wk, wv   read RMSNorm(x) * g  ->  g /= s        (attention norm weight)
    w_gate, w_up read RMSNorm(x) * g  ->  g /= s        (MLP norm weight)
    w_down       reads silu(gate) * up ->  w_up rows /= s
(wo reads the attention output, which under GQA is shared by several query heads per value head: left as is.)
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from minigpt.model import GPT
from minigpt.quant.calibration import capture_inputs
from minigpt.quant.formats import check_finite, fake_quantize
from minigpt.quant.linear import quantize_weight_only

__all__ = ["AWQ_GROUPS", "search_scale", "awq_scales", "apply_awq_scales", "awq_model"]

# (projections reading one input, where 1/s is folded: a norm weight or the rows of a linear)
AWQ_GROUPS = [(("attn.wq", "attn.wk", "attn.wv"), "attn_norm"),
              (("mlp.w_gate", "mlp.w_up"), "mlp_norm"),
              (("mlp.w_down",), "mlp.w_up")]


def search_scale(x: Tensor, weights: list[Tensor], bits: int = 4, group_size: int | None = 128,
                 grid: int = 20, symmetric: bool = True) -> tuple[Tensor, float]:
    """Best per-input-channel scale s (in,) for the weights (out_i, in) reading inputs x (N, in), and its alpha.

    alpha = 0 gives s = 1 (plain round-to-nearest), so the result is never worse than RTN on x.
    """
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"the calibration set is empty: got inputs of shape {tuple(x.shape)}")
    check_finite(x, "calibration input")
    x = x.float()
    W = torch.cat([w.detach().float() for w in weights])                    # (sum out, in)
    reference = x @ W.T
    magnitude = x.abs().mean(0).clamp(min=1e-8)
    best_err, best_s, best_alpha = float("inf"), torch.ones_like(magnitude), 0.0
    for k in range(grid + 1):
        alpha = k / grid
        s = magnitude.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()                                     # centre the scales around 1
        Wq = fake_quantize(W * s, bits, symmetric=symmetric, group_size=group_size) / s
        err = (x @ Wq.T - reference).pow(2).mean().item()
        if err < best_err:
            best_err, best_s, best_alpha = err, s, alpha
    return best_s, best_alpha


@torch.inference_mode()
def awq_scales(model: GPT, calibration: Tensor, bits: int = 4, group_size: int | None = 128,
               grid: int = 20, symmetric: bool = True) -> dict[str, Tensor]:
    """{"layers.i.<fold target>": s} for every AWQ group, searched on the model's inputs on `calibration`."""
    names = [f"layers.{i}.{p}" for i in range(len(model.layers)) for projs, _ in AWQ_GROUPS for p in projs]
    inputs = capture_inputs(model, calibration, names)
    scales = {}
    for i in range(len(model.layers)):
        for projs, fold in AWQ_GROUPS:
            first = f"layers.{i}.{projs[0]}"
            weights = [model.get_submodule(f"layers.{i}.{p}").weight for p in projs]
            scales[f"layers.{i}.{fold}"], _ = search_scale(inputs[first], weights, bits, group_size, grid, symmetric)
    return scales


@torch.no_grad()
def apply_awq_scales(model: GPT, scales: dict[str, Tensor]) -> GPT:
    """A full-precision copy of `model` with each s folded in: consumers' columns * s, producer / s.
    The copy computes the same function as `model` up to float rounding."""
    new = copy.deepcopy(model)
    for key, s in scales.items():
        i = int(key.split(".")[1])
        fold = key.split(".", 2)[2]
        projs = next(p for p, f in AWQ_GROUPS if f == fold)
        for p in projs:
            lin = new.get_submodule(f"layers.{i}.{p}")
            lin.weight.mul_(s.to(lin.weight.dtype)[None, :])
        producer = new.get_submodule(key)
        if fold.endswith("norm"):
            producer.weight.div_(s.to(producer.weight.dtype))
        else:
            producer.weight.div_(s.to(producer.weight.dtype)[:, None])
    return new


def awq_model(model: GPT, calibration: Tensor, bits: int = 4, group_size: int | None = 128, *,
              grid: int = 20, symmetric: bool = True) -> GPT:
    """Search the scales, fold them, then round-to-nearest: a W4A16 model (WeightOnlyLinear projections)."""
    if calibration.numel() == 0:
        raise ValueError("the calibration set is empty: AWQ needs at least one sequence of tokens")
    scaled = apply_awq_scales(model, awq_scales(model, calibration, bits, group_size, grid, symmetric))
    return quantize_weight_only(scaled, bits, group_size, symmetric)
