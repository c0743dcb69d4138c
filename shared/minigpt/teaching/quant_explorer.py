"""Lab 05's quantization explorer (ipywidgets + matplotlib): one layer of a model, bits, group size, method.

    QuantizationExplorer(model)          # shows itself as the last expression of a cell

`explorer_readout(...)` computes every number (tested without a browser); the widget only reads its controls,
calls it, and shows the HTML readout and a histogram of the layer's weights with the grid of one group.
Methods: round-to-nearest symmetric or asymmetric integers, or FP8 (E4M3 / E5M2) with one scale per row.
GPTQ and AWQ need calibration data and a few minutes; they are in the lab's quality table instead.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as W
import torch
from matplotlib.figure import Figure
from torch import Tensor

from minigpt.model import GPT
from minigpt.quant.formats import FP8_DTYPES, dequantize_fp8, fake_quantize, quantize, quantize_fp8
from minigpt.quant.linear import projection_names
from minigpt.costmodel.calculators import PRESETS, ModelShape, count_parameters, kv_cache_bytes
from minigpt.costmodel.hardware import ACCELERATORS, Accelerator
from minigpt.teaching.figure_view import FigureView

METHODS = ["RTN symmetric", "RTN asymmetric", "FP8 E4M3", "FP8 E5M2"]
BITS = [2, 3, 4, 8]
GROUPS = ["per channel", 32, 64, 128]
CONTEXTS = [2 ** k for k in range(9, 18)]
KV_VIEW = ["bf16", "int8 / fp8 + scales"]


@dataclass(frozen=True)
class Readout:
    bits_per_weight: float          # stored bits per weight of this layer, scales included
    rel_error: float                # ||W_hat - W|| / ||W||
    max_abs_error: float
    levels_used: int                # distinct values in the first group of row 0
    model_weight_bytes: int         # the chosen model shape at this bits_per_weight
    kv_bytes: int                   # its KV cache for one request of `context` tokens (codes + per-head scales)
    fits: bool                      # weights + KV fit in the GPU's memory

    def html(self, layer: str, method: str, shape_name: str, gpu: Accelerator, context: int, kv_format: str) -> str:
        total = self.model_weight_bytes + self.kv_bytes
        return (f"<b>{html.escape(layer)}</b>, {html.escape(method)}: relative error {self.rel_error:.4f}, "
                f"max |error| {self.max_abs_error:.4g}, {self.levels_used} levels used in one group, "
                f"{self.bits_per_weight:.2f} bits/weight<br>"
                f"<b>{html.escape(shape_name)}</b> at {self.bits_per_weight:.2f} bits/weight: weights "
                f"{self.model_weight_bytes / 2**30:.2f} GiB + KV cache ({context:,} tokens, {html.escape(kv_format)}) {self.kv_bytes / 2**30:.2f} GiB = "
                f"{total / 2**30:.2f} GiB of {gpu.memory_bytes / 2**30:.0f} GiB on {html.escape(gpu.name)}: "
                f"{'fits' if self.fits else 'does NOT fit'}")


def quantize_for_view(weight: Tensor, method: str, bits: int, group_size: int | None) -> tuple[Tensor, float]:
    """(dequantized weight, stored bits per weight with float32 scales / zero points)."""
    out_f, in_f = weight.shape
    if method.startswith("FP8"):
        codes, scale = quantize_fp8(weight, "e4m3" if "E4M3" in method else "e5m2")
        return dequantize_fp8(codes, scale), 8 + 32 / in_f
    symmetric = method == "RTN symmetric"
    w_hat = fake_quantize(weight, bits, symmetric=symmetric, group_size=group_size)
    per_group = 32 * (1 if symmetric else 2)
    return w_hat, bits + per_group / (group_size or in_f)


def explorer_readout(weight: Tensor, method: str, bits: int, group_size: int | None, shape: ModelShape,
                     gpu: Accelerator, context: int, kv_format: str = "bf16") -> Readout:
    w_hat, bpw = quantize_for_view(weight.detach().float(), method, bits, group_size)
    w = weight.detach().float()
    g = group_size or w.shape[1]
    if kv_format not in KV_VIEW:
        raise ValueError(f"unknown KV-cache format {kv_format!r}; choose one of {KV_VIEW}")
    kv_bpe = 2 if kv_format == "bf16" else 1
    kv = kv_cache_bytes(shape, context, 1, kv_bpe)
    if kv_bpe == 1:          # float32 scale per token, layer, K/V and KV head
        kv += 2 * shape.n_layers * shape.n_kv_heads * 4 * context
    weights = int(count_parameters(shape) * bpw / 8)
    return Readout(bits_per_weight=bpw, rel_error=((w_hat - w).norm() / w.norm()).item(),
                   max_abs_error=(w_hat - w).abs().max().item(), levels_used=int(w_hat[0, :g].unique().numel()),
                   model_weight_bytes=weights, kv_bytes=kv, fits=weights + kv <= gpu.memory_bytes)


def plot_layer(ax, weight: Tensor, method: str, bits: int, group_size: int | None, title: str) -> None:
    """Histogram of the layer's weights and the grid (vertical lines) of the first group of row 0."""
    w = weight.detach().float()
    ax.hist(w.flatten().numpy(), bins=120, color="#4c72b0", alpha=0.8)
    g = group_size or w.shape[1]
    first = w[:1, :g]
    if method.startswith("FP8"):
        codes, scale = quantize_fp8(first, "e4m3" if "E4M3" in method else "e5m2")
        finfo = torch.finfo(FP8_DTYPES["e4m3" if "E4M3" in method else "e5m2"])
        grid = torch.linspace(-finfo.max, finfo.max, 4001).to(codes.dtype).float().unique() * scale
    else:
        qt = quantize(first, bits, symmetric=method == "RTN symmetric")
        lo, hi = (-(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1) if qt.zero is None else (0, 2 ** bits - 1)
        levels = torch.arange(lo, hi + 1, dtype=torch.float32)
        grid = (levels - (0 if qt.zero is None else qt.zero.item())) * qt.scale.item()
    for x in grid.flatten().tolist()[:: max(1, grid.numel() // 64)]:
        ax.axvline(x, color="#c44e52", linewidth=0.5, alpha=0.6)
    ax.set_yscale("log")
    ax.set_xlabel("weight value (red: the grid of one group, row 0)")
    ax.set_title(title, fontsize=9)


class QuantizationExplorer(FigureView):
    """Layer, method, bits, group size, model shape for the memory, GPU and context -> readout + histogram."""

    def __init__(self, model: GPT, *, layer: str | None = None, method: str = "RTN symmetric", bits: int = 4,
                 group_size: int | str = 128, gpu: str = "H100-SXM", shape: str = "Llama-3-8B", context: int = 8192) -> None:
        super().__init__()
        self.model = model
        names = projection_names(model)
        self.layer = W.Dropdown(options=names, value=layer or names[0], description="layer")
        self.method = W.Dropdown(options=METHODS, value=method, description="method")
        self.bits = W.SelectionSlider(options=BITS, value=bits, description="bits")
        self.group = W.Dropdown(options=GROUPS, value=group_size, description="group")
        self.shape = W.Dropdown(options=list(PRESETS), value=shape, description="memory of")
        self.gpu = W.Dropdown(options=list(ACCELERATORS), value=gpu, description="GPU")
        self.context = W.SelectionSlider(options=CONTEXTS, value=context, description="context")
        self.kv = W.Dropdown(options=KV_VIEW, value="bf16", description="KV cache")
        self.widget = W.VBox([W.HBox([self.layer, self.method]), W.HBox([self.bits, self.group]),
                              W.HBox([self.shape, self.gpu]), W.HBox([self.context, self.kv]), self.error, self.readout, self.image])
        self._watch(self.layer, self.method, self.bits, self.group, self.shape, self.gpu, self.context, self.kv)
        self.update()

    def _compute(self) -> tuple[str, Figure]:
        group = None if self.group.value == "per channel" else int(self.group.value)
        weight = self.model.get_submodule(self.layer.value).weight
        gpu, shape = ACCELERATORS[self.gpu.value], PRESETS[self.shape.value]
        r = explorer_readout(weight, self.method.value, self.bits.value, group, shape, gpu, self.context.value,
                             self.kv.value)             # ValueError: e.g. a group size that does not divide the inputs
        text = r.html(self.layer.value, self.method.value, shape.name, gpu, self.context.value, self.kv.value)
        fig = Figure(figsize=(8, 2.8))
        method = self.method.value
        label = method if method.startswith("FP8") else f"{method}, INT{self.bits.value}, {self.group.value}"
        plot_layer(fig.subplots(), weight, method, self.bits.value, group, f"{self.layer.value}: {label}")
        return text, fig
