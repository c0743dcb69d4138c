"""PyTorch's real CPU kernels for quantized matrix products, wrapped as `y = f(x)` for x (M, K).

* `Int8DynamicLinear`: W8A8 with dynamic activation quantization through oneDNN
  (`torch.ops.onednn.qlinear_prepack` / `qlinear_pointwise`, the x86 path that torch.compile's quantization uses),
  x quantized per tensor to uint8 on each call, weights int8 per output channel.
* `Int4WeightOnlyLinear`: W4A16 grouped, `torch.ops.aten._weight_int4pack_mm_for_cpu` (bf16 activations),
  the "tinygemm" layout torchao uses: w = (q - 8) * scale + zero with unsigned q in [0, 15].
* `Int8WeightOnlyLinear`: W8A16 per channel, `torch.ops.aten._weight_int8pack_mm`.

These are plain tensors in and out (no quantized tensor types, no torch.ao.quantization front end).
"""

from __future__ import annotations

import torch
from torch import Tensor

from minigpt.quant.formats import check_finite, check_group_size

__all__ = ["Int8DynamicLinear", "Int4WeightOnlyLinear", "Int8WeightOnlyLinear"]


class Int8DynamicLinear:
    """y = x @ W^T with x quantized to uint8 per call and W int8 per output channel (oneDNN, x86)."""

    def __init__(self, weight: Tensor) -> None:
        check_finite(weight, "weight")
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.w_scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
        codes = torch.round(w / self.w_scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(codes, [1, self.in_features])
        self.w_zero = torch.zeros(self.out_features, dtype=torch.int64)
        self.nbytes = codes.nbytes + self.w_scale.nbytes

    def __call__(self, x: Tensor) -> Tensor:
        lo, hi = float(x.min().clamp(max=0)), float(x.max().clamp(min=0))
        scale = max((hi - lo) / 255, 1e-12)
        zero = int(round(-lo / scale))
        qx = torch.clamp(torch.round(x / scale) + zero, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(qx, scale, zero, self.packed, self.w_scale, self.w_zero, None,
                                                  1.0, 0, torch.float32, "none", [], "")


class Int4WeightOnlyLinear:
    """y = x @ W_hat^T, W_hat asymmetric INT4 per group of `group_size` inputs; x is cast to bf16."""

    def __init__(self, weight: Tensor, group_size: int = 128) -> None:
        check_finite(weight, "weight")
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        check_group_size(self.in_features, group_size)
        self.group_size = group_size
        wg = w.reshape(self.out_features, -1, group_size)
        lo, hi = wg.amin(-1), wg.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(w.shape), 1)
        # (n_groups, out, 2): scale and the value of code 8 (the kernel computes (q - 8) * scale + zero)
        self.scales_and_zeros = torch.stack([scale.T, (lo + 8 * scale).T], -1).to(torch.bfloat16).contiguous()
        self.nbytes = self.packed.nbytes + self.scales_and_zeros.nbytes

    def __call__(self, x: Tensor) -> Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, self.group_size,
                                                          self.scales_and_zeros)


class Int8WeightOnlyLinear:
    """y = x @ (s * q)^T with int8 q per output channel, `_weight_int8pack_mm` (x stays float32)."""

    def __init__(self, weight: Tensor) -> None:
        check_finite(weight, "weight")
        w = weight.detach().float()
        self.scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
        self.codes = torch.round(w / self.scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.nbytes = self.codes.nbytes + self.scale.nbytes

    def __call__(self, x: Tensor) -> Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scale)
