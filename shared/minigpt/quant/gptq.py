"""GPTQ (Frantar et al., 2022): quantize a weight one input column at a time, pushing each column's
rounding error onto the columns not yet quantized, weighted by the layer Hessian.

For a linear with calibration inputs X (N, in), the output error of a weight change dW is
||X dW^T||^2 = tr(dW H dW^T) with H = 2 X^T X / N (in, in). Quantizing column i to q_i with error
e = (w_i - q_i) / [H^-1]_ii, the best update of the remaining columns j > i is  w_j -= e * [H^-1]_ij.
With U = cholesky(H^-1) (upper), the rows of U give exactly these coefficients for the shrinking problem,
so one Cholesky replaces a re-inversion per column. Columns are processed in blocks: updates inside a block
are immediate, those to later blocks are applied once per block (a matrix product: "lazy batch" updates).

H is damped, H + damp * mean(diag H) * I, so the Cholesky exists even for rarely active inputs.

act_order=True quantizes the columns in decreasing order of diag(H) (the inputs with the most energy first,
while the most columns are left to absorb their error), then puts the codes back in the original order. With
groups, their scales are then fixed up front from the original weights ("static groups"), since a group's
columns are no longer quantized together.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minigpt.model import GPT
from minigpt.quant.calibration import capture_inputs
from minigpt.quant.formats import QuantizedTensor, check_bits, check_finite, check_group_size, int_range
from minigpt.quant.linear import WeightOnlyLinear, projection_names, quantize_linears

__all__ = ["hessian", "gptq_quantize", "gptq_model"]


def hessian(x: Tensor) -> Tensor:
    """H = 2 X^T X / N for inputs x (N, in_features), in float64 for a stable Cholesky."""
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"the calibration set is empty: got inputs of shape {tuple(x.shape)}; need (N > 0, in_features)")
    check_finite(x, "calibration input")
    x = x.double()
    return 2.0 * x.T @ x / x.shape[0]


def _scale_for(w: Tensor, bits: int, symmetric: bool) -> tuple[Tensor, Tensor | None]:
    """Scale (and zero) per row for a slice w (out, cols), as round-to-nearest would choose them."""
    qmin, qmax = int_range(bits, symmetric)
    if symmetric:
        return (w.abs().amax(1) / qmax).clamp(min=1e-12), None
    lo, hi = w.amin(1).clamp(max=0), w.amax(1).clamp(min=0)
    scale = ((hi - lo) / qmax).clamp(min=1e-12)
    return scale, torch.round(-lo / scale).clamp(qmin, qmax)


def gptq_quantize(weight: Tensor, H: Tensor, bits: int = 4, group_size: int | None = 128, *,
                  symmetric: bool = True, block_size: int = 128, damp: float = 0.01,
                  act_order: bool = False) -> QuantizedTensor:
    """GPTQ codes for weight (out, in) given the Hessian H (in, in) of the layer's calibration inputs."""
    check_bits(bits)
    out_f, in_f = weight.shape
    check_group_size(in_f, group_size)
    check_finite(weight, "weight")
    if H.shape != (in_f, in_f):
        raise ValueError(f"Hessian {tuple(H.shape)} does not match the {in_f} input features of the weight")
    if group_size is not None and block_size % group_size:
        block_size = group_size * max(1, block_size // group_size)
    qmin, qmax = int_range(bits, symmetric)
    W = weight.detach().double().clone()
    H = H.double().clone()
    dead = torch.diag(H) == 0                       # inputs that were never active: any value is free
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(in_f, dtype=H.dtype)

    n_groups = 1 if group_size is None else in_f // group_size
    scales = torch.zeros(out_f, n_groups, dtype=torch.float64)
    zeros = None if symmetric else torch.zeros(out_f, n_groups, dtype=torch.float64)
    static = group_size is None or act_order                     # scales fixed before any column moves
    if static:
        for k in range(n_groups):
            cols = slice(None) if group_size is None else slice(k * group_size, (k + 1) * group_size)
            scale, zero = _scale_for(W[:, cols], bits, symmetric)
            scales[:, k] = scale
            if zeros is not None:
                zeros[:, k] = zero
    order = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else torch.arange(in_f)
    W, H = W[:, order], H[order][:, order]
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    Q = torch.zeros(out_f, in_f, dtype=torch.int16)
    for b0 in range(0, in_f, block_size):
        b1 = min(b0 + block_size, in_f)
        Wb = W[:, b0:b1].clone()
        Err = torch.zeros_like(Wb)
        Ub = U[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i                                                # position in processing order
            g = 0 if group_size is None else int(order[col]) // group_size
            if not static and col % group_size == 0:                     # scales from the already-updated weights
                scale, zero = _scale_for(Wb[:, i:i + group_size], bits, symmetric)
                scales[:, g] = scale
                if zeros is not None:
                    zeros[:, g] = zero
            s = scales[:, g]
            z = 0.0 if zeros is None else zeros[:, g]
            w = Wb[:, i]
            q = (torch.round(w / s) + z).clamp(qmin, qmax)
            Q[:, col] = q.to(torch.int16)
            err = (w - (q - z) * s) / Ub[i, i]
            Wb[:, i:] -= err[:, None] * Ub[i, i:][None, :]              # error to the rest of the block now
            Err[:, i] = err
        W[:, b1:] -= Err @ U[b0:b1, b1:]                                 # and to later blocks once per block
    Q = Q[:, torch.argsort(order)]                                       # back to the original column order
    dtype = torch.uint8 if (not symmetric and bits == 8) else torch.int8
    return QuantizedTensor(Q.to(dtype), scales.float(), None if zeros is None else zeros.float(), bits, group_size)


def gptq_model(model: GPT, calibration: Tensor, bits: int = 4, group_size: int | None = 128, *,
               symmetric: bool = True, block_size: int = 128, damp: float = 0.01, act_order: bool = False) -> GPT:
    """A W4A16 (or W8A16) copy of `model` quantized by GPTQ, the Hessians taken from the full-precision model's
    inputs on `calibration` tokens (N, T). (The paper quantizes layer by layer, feeding each the outputs of the
    already-quantized layers; using the full-precision inputs everywhere is simpler and close on small models.)"""
    if calibration.numel() == 0:
        raise ValueError("the calibration set is empty: GPTQ needs at least one sequence of tokens")
    names = projection_names(model)
    inputs = capture_inputs(model, calibration, names)
    by_input: dict[int, list[str]] = {}                 # wq, wk, wv (and w_gate, w_up) read one input: one pass
    for name in names:
        by_input.setdefault(id(inputs[name]), []).append(name)
    codes = {}
    for group in by_input.values():
        weights = [model.get_submodule(name).weight for name in group]
        qt = gptq_quantize(torch.cat(weights), hessian(inputs[group[0]]), bits, group_size, symmetric=symmetric,
                           block_size=block_size, damp=damp, act_order=act_order)   # rows are independent given H
        first = 0
        for name, w in zip(group, weights):
            rows = slice(first, first + w.shape[0])
            codes[name] = QuantizedTensor(qt.q[rows], qt.scale[rows], None if qt.zero is None else qt.zero[rows],
                                          qt.bits, qt.group_size)
            first += w.shape[0]
    return quantize_linears(model, lambda name, w: WeightOnlyLinear(codes[name]))
