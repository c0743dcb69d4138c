"""Interactive calculators (ipywidgets + matplotlib): a thin layer over `minigpt.costmodel.calculators`.

    from minigpt.teaching.widgets import KVCacheCalculator, RooflineCalculator
    KVCacheCalculator()                       # shows itself as the last expression of a cell
    RooflineCalculator(extra={"this machine": this_machine()})

All numbers come from pure functions (`kv_calculator_plan`, `kv_readout`, `roofline_readout`,
tested over the controls' full ranges); a calculator only reads its controls, calls them, and puts
the text into an HTML readout and the PNG of a matplotlib figure into an Image widget (`FigureView`).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Mapping

import ipywidgets as W
from matplotlib.figure import Figure

from minigpt.costmodel import calculators as calc
from minigpt.costmodel.calculators import GiB, PRESETS, MemoryPlan, ModelShape, RooflinePoint
from minigpt.costmodel.hardware import ACCELERATORS, Accelerator
from minigpt.teaching.figure_view import FigureView
from minigpt.teaching.plots import plot_memory_plan, plot_requests_vs_context, plot_roofline

CUSTOM = "custom"
CONTEXTS = [2**k for k in range(7, 18)]           # 128 .. 131072 tokens
BATCHES = [2**k for k in range(0, 11)]            # 1 .. 1024
SEQ_LENS = [2**k for k in range(4, 16)]           # 16 .. 32768
KV_HEADS = [1, 2, 4, 8, 16, 32, 64, 128]
HEAD_DIMS = [64, 80, 96, 128, 256]
# Billions of parameters of common published sizes: a slider that lands exactly on the value it shows.
PARAMS_B = [0.5, 1, 1.5, 2, 3, 4, 7, 8, 9, 13, 14, 27, 32, 34, 70, 72, 110, 123, 180, 405]
PRECISIONS = ["bf16", "fp16", "fp8", "int8", "fp32"]


@dataclass(frozen=True)
class CustomShape:
    """Just what the KV calculator needs for a model that is not a preset."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_params: int
    name: str = CUSTOM


def _params(shape: ModelShape | CustomShape) -> int:
    return shape.n_params if isinstance(shape, CustomShape) else calc.count_parameters(shape)


def _kv_per_token(shape: ModelShape | CustomShape, bpe: int) -> int:
    return 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * bpe


def kv_calculator_plan(shape: ModelShape | CustomShape, context_len: int, batch: int, gpu: Accelerator, *,
                       weight_precision: str = "bf16", kv_precision: str = "bf16",
                       memory_utilization: float = 0.9) -> MemoryPlan:
    """Weights + KV cache of `batch` requests of `context_len` tokens on `gpu` (see calculators.memory_plan)."""
    w = _params(shape) * calc.bytes_per_element(weight_precision)
    per_request = _kv_per_token(shape, calc.bytes_per_element(kv_precision)) * context_len
    return calc.memory_plan(w, per_request, batch, gpu.memory_bytes, memory_utilization)


def kv_readout(shape: ModelShape | CustomShape, context_len: int, batch: int, gpu: Accelerator, plan: MemoryPlan,
               kv_precision: str) -> str:
    """The KV calculator's text: exact bytes, GiB, share of memory, max concurrent requests."""
    per_token = _kv_per_token(shape, calc.bytes_per_element(kv_precision))
    kind = shape.attention_kind if isinstance(shape, ModelShape) else f"{shape.n_kv_heads} KV heads"
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    rows = [
        ("model", f"{shape.name} ({kind}), {_params(shape) / 1e9:.3g}B parameters"),
        ("KV cache per token", f"{per_token:,} bytes"),
        (f"KV cache per request ({context_len:,} tokens)", f"{plan.kv_bytes_per_request:,} bytes = {plan.kv_bytes_per_request / GiB:.3f} GiB"),
        (f"KV cache for batch {batch}", f"{plan.kv_bytes:,} bytes = {plan.kv_bytes / GiB:.3f} GiB"),
        ("weights", f"{plan.weight_bytes:,} bytes = {plan.weight_bytes / GiB:.3f} GiB"),
        (f"share of {gpu.name} memory ({gpu.memory_bytes / GiB:.1f} GiB)", f"{plan.share_of_memory:.1%} ({verdict})"),
        ("max concurrent requests", f"{plan.max_requests:,}"),
    ]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>" for k, v in rows)
    return f"<table class='kv-readout'>{body}</table>"


def roofline_readout(shape: ModelShape, gpu: Accelerator, precision: str, batch: int, seq_len: int,
                     report: Mapping[str, RooflinePoint]) -> str:
    """The roofline calculator's text: intensity, bound, and time lower bounds of each phase."""
    peak, bw = gpu.peak(precision), gpu.memory_bandwidth
    lines = [f"{html.escape(shape.name)} on {html.escape(gpu.name)} ({precision}): peak {peak / 1e12:.4g} TFLOP/s, "
             f"{bw / 1e12:.4g} TB/s, ridge {peak / bw:.4g} FLOP/byte; batch {batch}, {seq_len:,} tokens"]
    for p in report.values():
        bound = "compute-bound" if p.compute_bound else "memory-bound"
        lines.append(f"<b>{p.name}</b>: {p.flops:.4g} FLOP, {p.bytes:.4g} bytes, intensity <b>{p.intensity:.4g}</b> FLOP/byte, "
                     f"{bound}, &ge; {p.time_s * 1e3:.4g} ms, &le; {p.tokens / p.time_s:,.0f} tokens/s")
    return "<br>".join(lines)


class KVCacheCalculator(FigureView):
    """Model preset or custom shape, context, batch, precisions, GPU -> KV bytes, memory share, max requests."""

    def __init__(self, extra: Mapping[str, Accelerator] | None = None, *, model: str = "Llama-3-8B",
                 gpu: str = "H100-SXM", context_len: int = 8192, batch: int = 8) -> None:
        super().__init__()
        self.accelerators = {**ACCELERATORS, **(extra or {})}
        self.model = W.Dropdown(options=[*PRESETS, CUSTOM], value=model, description="model")
        self.gpu = W.Dropdown(options=list(self.accelerators), value=gpu, description="GPU")
        self.context = W.SelectionSlider(options=CONTEXTS, value=context_len, description="context")
        self.batch = W.IntSlider(value=batch, min=1, max=256, description="batch")
        self.weight_precision = W.Dropdown(options=PRECISIONS, value="bf16", description="weights")
        self.kv_precision = W.Dropdown(options=PRECISIONS, value="bf16", description="KV cache")
        self.utilization = W.FloatSlider(value=0.9, min=0.5, max=1.0, step=0.05, description="mem. util.")
        self.layers = W.IntSlider(value=32, min=1, max=128, description="layers")
        self.kv_heads = W.Dropdown(options=KV_HEADS, value=8, description="KV heads")
        self.head_dim = W.Dropdown(options=HEAD_DIMS, value=128, description="head dim")
        self.params_b = W.SelectionSlider(options=PARAMS_B, value=8, description="params (B)")
        self.custom_box = W.HBox([self.layers, self.kv_heads, self.head_dim, self.params_b])
        controls = [self.model, self.gpu, self.context, self.batch, self.weight_precision, self.kv_precision,
                    self.utilization, self.layers, self.kv_heads, self.head_dim, self.params_b]
        self.widget = W.VBox([W.HBox([self.model, self.gpu]), W.HBox([self.context, self.batch]),
                              W.HBox([self.weight_precision, self.kv_precision, self.utilization]),
                              self.custom_box, self.error, self.readout, self.image])
        self._watch(*controls)
        self.update()

    def shape(self) -> ModelShape | CustomShape:
        if self.model.value == CUSTOM:
            return CustomShape(self.layers.value, self.kv_heads.value, self.head_dim.value, int(self.params_b.value * 1e9))
        return PRESETS[self.model.value]

    def _arrange(self) -> None:
        self.custom_box.layout.display = "" if self.model.value == CUSTOM else "none"

    def _compute(self) -> tuple[str, Figure]:
        shape, gpu = self.shape(), self.accelerators[self.gpu.value]
        kw = dict(weight_precision=self.weight_precision.value, kv_precision=self.kv_precision.value,
                  memory_utilization=self.utilization.value)
        plan = kv_calculator_plan(shape, self.context.value, self.batch.value, gpu, **kw)
        fig = Figure(figsize=(9, 2.8))
        ax_bar, ax_req = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        plot_memory_plan(ax_bar, plan, title=f"{gpu.name}: {shape.name}, batch {self.batch.value} x {self.context.value:,} tokens")
        requests = [kv_calculator_plan(shape, c, 1, gpu, **kw).max_requests for c in CONTEXTS]
        plot_requests_vs_context(ax_req, CONTEXTS, requests, current=(self.context.value, plan.max_requests))
        fig.tight_layout()
        return kv_readout(shape, self.context.value, self.batch.value, gpu, plan, self.kv_precision.value), fig


class RooflineCalculator(FigureView):
    """GPU, precision, batch, sequence length -> prefill and decode points on that GPU's roofline."""

    def __init__(self, extra: Mapping[str, Accelerator] | None = None, *, model: str = "Llama-3-8B",
                 gpu: str = "H100-SXM", batch: int = 1, seq_len: int = 1024) -> None:
        super().__init__()
        self.accelerators = {**ACCELERATORS, **(extra or {})}
        self.model = W.Dropdown(options=list(PRESETS), value=model, description="model")
        self.gpu = W.Dropdown(options=list(self.accelerators), value=gpu, description="GPU")
        self.precision = W.Dropdown(options=self._precisions(gpu), value="bf16", description="precision")
        self.batch = W.SelectionSlider(options=BATCHES, value=batch, description="batch")
        self.seq_len = W.SelectionSlider(options=SEQ_LENS, value=seq_len, description="seq. len")
        self.gpu.observe(self._gpu_changed, names="value")
        self.widget = W.VBox([W.HBox([self.model, self.gpu, self.precision]), W.HBox([self.batch, self.seq_len]),
                              self.error, self.readout, self.image])
        self._watch(self.model, self.gpu, self.precision, self.batch, self.seq_len)
        self.update()

    def _precisions(self, gpu: str) -> list[str]:
        return [p for p in PRECISIONS if p in self.accelerators[gpu].precisions()]

    def _gpu_changed(self, _change: object) -> None:
        options = self._precisions(self.gpu.value)
        keep = self.precision.value if self.precision.value in options else options[0]
        with self.precision.hold_trait_notifications():
            self.precision.options = options
            self.precision.value = keep                  # the redraw follows (the GPU is a watched control)

    def _compute(self) -> tuple[str, Figure]:
        shape, gpu, prec = PRESETS[self.model.value], self.accelerators[self.gpu.value], self.precision.value
        bpe = calc.bytes_per_element(prec)
        peak, bw = gpu.peak(prec), gpu.memory_bandwidth
        report = calc.roofline_report(shape, peak, bw, batch=self.batch.value, seq_len=self.seq_len.value,
                                      weight_bytes_per_element=bpe, kv_bytes_per_element=bpe)
        fig = Figure(figsize=(6.5, 4))
        ax = fig.add_subplot()
        plot_roofline(ax, peak, bw, {n: (p.intensity, p.attainable) for n, p in report.items()},
                      label=f"{gpu.name} {prec}")
        ax.set_ylim(peak / 1e4, peak * 3)
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"{shape.name}, batch {self.batch.value}, {self.seq_len.value:,} tokens", fontsize=10)
        return roofline_readout(shape, gpu, prec, self.batch.value, self.seq_len.value, report), fig
