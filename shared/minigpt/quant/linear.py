"""Weight-only quantized linears (W8A16, W4A16, FP8 weights), plugged in through the model's `make_linear`.

    qmodel = quantize_weight_only(model, bits=4, group_size=128)    # a new GPT; `model` is left untouched

Only the projections built by `make_linear` (wq, wk, wv, wo, w_gate, w_up, w_down of every layer) are
quantized. The token embedding and the tied LM head stay in the model's precision: they are one matrix
(vocab x d_model) used at both ends of the network, and its error lands directly on the logits.

A weight-only linear stores integer codes and scales and dequantizes on the fly:
y = x @ (s * q)^T. The activations stay in high precision; only the bytes read per token shrink.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minigpt.model import GPT
from minigpt.quant.formats import (QuantizedTensor, dequantize, dequantize_fp8, pack_int4, quantize,
                                   quantize_fp8, unpack_int4)

__all__ = ["WeightOnlyLinear", "FP8WeightLinear", "projection_names", "quantize_linears", "quantize_weight_only",
           "quantize_fp8_weights", "weight_bytes"]


class WeightOnlyLinear(nn.Module):
    """y = x @ W_hat^T with W_hat = scale * (q - zero) per group of `group_size` inputs (per row if None).

    Buffers: qweight int8 (out, in) for 8 bits, or uint8 (out, in / 2) with two INT4 codes per byte;
    scale float32 (out, n_groups); zero (out, n_groups) for asymmetric codes, else absent.
    2- and 3-bit codes (lab 05's low-bit sweep) are stored in the same nibbles: the arithmetic is exact, the bytes
    are those of INT4 (a real 3-bit kernel packs them tighter).
    """

    def __init__(self, qt: QuantizedTensor) -> None:
        super().__init__()
        if qt.bits not in (2, 3, 4, 8):
            raise ValueError(f"WeightOnlyLinear stores 2-, 3-, 4- or 8-bit codes, got bits={qt.bits}")
        self.bits, self.group_size = qt.bits, qt.group_size
        self.out_features, self.in_features = qt.q.shape
        self.register_buffer("qweight", pack_int4(qt.q) if qt.bits <= 4 else qt.q.clone())
        self.register_buffer("scale", qt.scale.float().clone())
        self.register_buffer("zero", None if qt.zero is None else qt.zero.float().clone())

    @classmethod
    def from_weight(cls, weight: Tensor, bits: int = 8, group_size: int | None = None,
                    symmetric: bool = True) -> "WeightOnlyLinear":
        """Round-to-nearest quantization of a float weight (out_features, in_features)."""
        return cls(quantize(weight.detach(), bits, symmetric=symmetric, group_size=group_size))

    def codes(self) -> QuantizedTensor:
        q = unpack_int4(self.qweight, signed=self.zero is None) if self.bits <= 4 else self.qweight
        return QuantizedTensor(q, self.scale, self.zero, self.bits, self.group_size)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return dequantize(self.codes()).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype))

    @property
    def nbytes(self) -> int:
        """Bytes stored: codes + scales (+ zero points)."""
        return sum(b.nbytes for b in self.buffers())

    def extra_repr(self) -> str:
        g = "per-channel" if self.group_size is None else f"group_size={self.group_size}"
        return f"in={self.in_features}, out={self.out_features}, int{self.bits}, {g}, {'sym' if self.zero is None else 'asym'}"


class FP8WeightLinear(nn.Module):
    """Weights stored as FP8 (E4M3 or E5M2) with one float32 scale per output channel; y = x @ (s * w8)^T."""

    def __init__(self, weight: Tensor, fmt: str = "e4m3") -> None:
        super().__init__()
        codes, scale = quantize_fp8(weight.detach(), fmt, per_channel=True)
        self.out_features, self.in_features = weight.shape
        self.register_buffer("qweight", codes)
        self.register_buffer("scale", scale)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, dequantize_fp8(self.qweight, self.scale).to(x.dtype))

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scale.nbytes


def projection_names(model: GPT) -> list[str]:
    """Names of the linears the model built through `make_linear` ("layers.0.attn.wq", ...)."""
    return [name for name, _ in model.named_modules() if name.startswith("layers.") and
            name.rsplit(".", 1)[-1] in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")]


def quantize_linears(model: GPT, make: Callable[[str, Tensor], nn.Module]) -> GPT:
    """A new GPT whose projections are `make(name, float_weight)`; everything else copied from `model`.

    The model is rebuilt through its `make_linear` factory (no fork of model.py); `model` is not modified.
    """
    state = {k: v.detach() for k, v in model.state_dict().items()}
    names = set(projection_names(model))
    built: dict[str, dict[str, Tensor]] = {}        # name -> the module's state as `make` built it

    def factory(in_features: int, out_features: int, name: str) -> nn.Module:
        weight = state[f"{name}.weight"]
        if tuple(weight.shape) != (out_features, in_features):
            raise ValueError(f"{name}: weight {tuple(weight.shape)} does not match ({out_features}, {in_features})")
        module = make(name, weight)
        built[name] = {k: v.clone() for k, v in module.state_dict().items()}
        return module

    new = GPT(model.config, make_linear=factory, attention=model.layers[0].attn.attention)
    for name, state_of_module in built.items():     # GPT.__init__ re-initializes nn.Linear weights: restore them
        new.get_submodule(name).load_state_dict(state_of_module)
    rest = {k: v for k, v in state.items() if k.rsplit(".", 1)[0] not in names}
    missing, unexpected = new.load_state_dict(rest, strict=False)
    leftover = [k for k in missing if k.rsplit(".", 1)[0] not in built]
    if leftover or unexpected:
        raise RuntimeError(f"quantize_linears: parameters not copied {leftover}, unexpected {unexpected}")
    return new.to(model.device).eval()


def quantize_weight_only(model: GPT, bits: int = 8, group_size: int | None = None, symmetric: bool = True) -> GPT:
    """Round-to-nearest W8A16 / W4A16 copy of `model` (per-channel scales, or per group of inputs)."""
    return quantize_linears(model, lambda name, w: WeightOnlyLinear.from_weight(w, bits, group_size, symmetric))


def quantize_fp8_weights(model: GPT, fmt: str = "e4m3") -> GPT:
    """Copy of `model` with FP8 projection weights (per-channel scales), activations unchanged."""
    return quantize_linears(model, lambda name, w: FP8WeightLinear(w, fmt))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (a tied embedding counted once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.nbytes
    return total

