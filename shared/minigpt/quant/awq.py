"""AWQ (Lin et al., 2023): activation-aware weight scaling before round-to-nearest.

A few input channels carry large activations; rounding errors in their weights cost the most. Scaling
input channel j of W up by s_j (and the activation down by 1/s_j) leaves the product unchanged,
x W^T = (x / s)(W s)^T, but shrinks the relative rounding error of the salient columns. AWQ picks

    s = mean|x|^alpha  (normalized),   alpha in a grid over [0, 1],

minimizing the output error || x W^T - (x / s) Q(W s)^T ||^2 on calibration inputs, for all projections that
read the same input together (computed as tr(D H D^T) with D = Q(W s)/s - W and H = x^T x: one (in, in) product
per candidate instead of a pass over every calibration token). The 1/s is folded into the operation that produces x, so the full-precision
model computes the same function and no extra work is done at run time:

    wq, wk, wv   read RMSNorm(x) * g  ->  g /= s        (attention norm weight)
    w_gate, w_up read RMSNorm(x) * g  ->  g /= s        (MLP norm weight)
    w_down       reads silu(gate) * up ->  w_up rows /= s
(wo reads the attention output, which under GQA is shared by several query heads per value head: left as is.)

Then (clip=True, as in the paper's code) each weight's range is clipped: for every output row and group, the
largest |w| kept is r * max|w| with r searched on a grid in [0.5, 1], minimizing that group's share of the output
error, d^T H_g d with d the rounding error and H_g = X_g^T X_g the group's block of the inputs' Gram matrix. At
3 and 2 bits the step is so coarse that giving up a few large weights for a finer grid on the rest pays.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from minigpt.model import GPT
from minigpt.quant.calibration import capture_inputs
from minigpt.quant.formats import check_finite, fake_quantize
from minigpt.quant.linear import projection_names, quantize_weight_only

__all__ = ["AWQ_GROUPS", "search_scale", "search_clip", "awq_scales", "apply_awq_scales", "awq_model"]

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
    H = x.T @ x / x.shape[0]                                                 # (in, in): ||x D^T||^2 = tr(D H D^T) N
    magnitude = x.abs().mean(0).clamp(min=1e-8)
    best_err, best_s, best_alpha = float("inf"), torch.ones_like(magnitude), 0.0
    for k in range(grid + 1):
        alpha = k / grid
        s = magnitude.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()                                     # centre the scales around 1
        D = fake_quantize(W * s, bits, symmetric=symmetric, group_size=group_size) / s - W
        err = ((D @ H) * D).sum().item() / W.shape[0]                          # mean squared output error per output
        if err < best_err:
            best_err, best_s, best_alpha = err, s, alpha
    return best_s, best_alpha


def search_clip(x: Tensor, weight: Tensor, bits: int = 4, group_size: int | None = 128, grid: int = 10,
                symmetric: bool = True, min_ratio: float = 0.5) -> Tensor:
    """The weight (out, in) with each (row, group) clipped to the ratio r of its range that minimizes that group's
    output error on inputs x (N, in); r = 1 (no clipping) is on the grid, so the result is never worse than RTN."""
    check_finite(x, "calibration input")
    W = weight.detach().float()
    out_f, in_f = W.shape
    g = in_f if group_size is None else group_size
    xg = x.float().reshape(-1, in_f // g, g)
    H = torch.einsum("ngk,ngl->gkl", xg, xg)                                 # (groups, g, g) blocks of X^T X
    Wg = W.reshape(out_f, -1, g)
    hi, lo = Wg.amax(-1, keepdim=True), Wg.amin(-1, keepdim=True)
    if symmetric:
        hi = torch.maximum(hi, -lo)
        lo = -hi
    best_err = torch.full(Wg.shape[:2], float("inf"))
    best = Wg.clone()
    for k in range(grid + 1):
        r = 1.0 - (1.0 - min_ratio) * k / grid
        clipped = torch.minimum(torch.maximum(Wg, lo * r), hi * r)
        d = fake_quantize(clipped.reshape(out_f, in_f), bits, symmetric=symmetric, group_size=group_size)
        d = d.reshape(Wg.shape) - Wg
        err = torch.einsum("ogk,gkl,ogl->og", d, H, d)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better[..., None], clipped, best)
    return best.reshape(out_f, in_f).to(weight.dtype)


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
              grid: int = 20, symmetric: bool = True, clip: bool = True) -> GPT:
    """Search the scales, fold them, clip each weight's range (clip=True), then round-to-nearest: a weight-only
    model (WeightOnlyLinear projections)."""
    if calibration.numel() == 0:
        raise ValueError("the calibration set is empty: AWQ needs at least one sequence of tokens")
    scaled = apply_awq_scales(model, awq_scales(model, calibration, bits, group_size, grid, symmetric))
    if clip:
        names = projection_names(scaled)
        inputs = capture_inputs(scaled, calibration, names)                   # the inputs the scaled layers see
        with torch.no_grad():
            for name in names:
                lin = scaled.get_submodule(name)
                lin.weight.copy_(search_clip(inputs[name], lin.weight, bits, group_size, symmetric=symmetric))
    return quantize_weight_only(scaled, bits, group_size, symmetric)
