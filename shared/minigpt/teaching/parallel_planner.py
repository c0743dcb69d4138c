"""An interactive parallelism planner (lab 07): model, GPU, link, GPU count, TP and PP sizes ->
memory per GPU, bytes communicated per token, estimated time per token, and whether it fits.

    from minigpt.teaching.parallel_planner import ParallelismPlanner
    ParallelismPlanner()                      # shows itself as the last expression of a cell

All numbers come from `minigpt.costmodel.parallel_cost.parallel_plan`; `planner_readout` turns a plan
into the HTML table, and the figure shows time per token against TP for the chosen link and PP.
"""

from __future__ import annotations

import html

import ipywidgets as W
from matplotlib.figure import Figure

from minigpt.costmodel.calculators import GiB, PRESETS, ModelShape
from minigpt.costmodel.hardware import ACCELERATORS, Accelerator
from minigpt.costmodel.parallel_cost import INTERCONNECTS, Interconnect, ParallelPlan, parallel_plan
from minigpt.teaching.figure_view import FigureView

__all__ = ["ParallelismPlanner", "planner_readout", "GPU_COUNTS", "SIZES"]

GPU_COUNTS = [1, 2, 4, 8, 16]
SIZES = [1, 2, 4, 8, 16]
CONTEXTS = [2**k for k in range(9, 18)]           # 512 .. 131072 tokens


def planner_readout(shape: ModelShape, gpu: Accelerator, link: Interconnect, n_gpus: int, plan: ParallelPlan,
                    context_len: int, batch: int) -> str:
    """The planner's table: memory per GPU (weights, KV cache), fit, bytes per token, time per token."""
    if plan.tp * plan.pp != n_gpus:
        raise ValueError(f"TP x PP = {plan.tp} x {plan.pp} = {plan.tp * plan.pp} GPUs, but {n_gpus} are selected; "
                         "make TP x PP equal the GPU count")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    rows = [
        ("plan", f"{shape.name} on {n_gpus} x {gpu.name} over {link.name}: TP={plan.tp}, PP={plan.pp}, "
                 f"batch {batch} x {context_len:,} tokens"),
        ("weights per GPU", f"{plan.weight_bytes_per_gpu / GiB:.2f} GiB"),
        ("KV cache per GPU", f"{plan.kv_bytes_per_gpu / GiB:.2f} GiB"),
        (f"memory per GPU (of {gpu.memory_bytes / GiB:.1f} GiB, 90% usable)",
         f"{plan.memory_per_gpu_bytes / GiB:.2f} GiB: {verdict}"),
        ("TP all-reduce bytes sent per GPU per token", f"{plan.tp_bytes_per_token:,.0f} bytes"),
        ("PP bytes between stages per token", f"{plan.pp_bytes_per_token:,} bytes"),
        ("compute (memory-bound) per token", f"{plan.compute_s * 1e3:.3f} ms"),
        ("TP communication per token", f"{plan.tp_comm_s * 1e3:.3f} ms"
                                        + (" (overlapped)" if plan.overlap else "")),
        ("estimated time per token", f"{plan.time_per_token_s * 1e3:.3f} ms = {1 / plan.time_per_token_s:,.1f} tokens/s "
                                     "per sequence"),
    ]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>" for k, v in rows)
    return f"<table class='parallel-readout'>{body}</table>"


class ParallelismPlanner(FigureView):
    """Model, GPU, link, GPU count, TP, PP, context, batch, overlap -> memory, bytes and time per token."""

    def __init__(self, *, model: str = "Llama-3-70B", gpu: str = "H100-SXM", link: str = "NVLink 4",
                 n_gpus: int = 8, tp: int = 8, pp: int = 1, context_len: int = 4096, batch: int = 1) -> None:
        super().__init__()
        self.model = W.Dropdown(options=[p for p in PRESETS if not p.startswith("minigpt")], value=model,
                                description="model")
        self.gpu = W.Dropdown(options=list(ACCELERATORS), value=gpu, description="GPU")
        self.link = W.Dropdown(options=list(INTERCONNECTS), value=link, description="link")
        self.n_gpus = W.Dropdown(options=GPU_COUNTS, value=n_gpus, description="GPUs")
        self.tp = W.Dropdown(options=SIZES, value=tp, description="TP")
        self.pp = W.Dropdown(options=SIZES, value=pp, description="PP")
        self.context = W.SelectionSlider(options=CONTEXTS, value=context_len, description="context")
        self.batch = W.IntSlider(value=batch, min=1, max=256, description="batch")
        self.overlap = W.Checkbox(value=False, description="overlap comm.")
        self.widget = W.VBox([W.HBox([self.model, self.gpu, self.link]), W.HBox([self.n_gpus, self.tp, self.pp]),
                              W.HBox([self.context, self.batch, self.overlap]), self.error, self.readout, self.image])
        self._watch(self.model, self.gpu, self.link, self.n_gpus, self.tp, self.pp, self.context, self.batch,
                    self.overlap)
        self.update()

    def plan(self, tp: int | None = None) -> ParallelPlan:
        return parallel_plan(PRESETS[self.model.value], ACCELERATORS[self.gpu.value], INTERCONNECTS[self.link.value],
                             tp=self.tp.value if tp is None else tp, pp=self.pp.value, context_len=self.context.value,
                             batch=self.batch.value, overlap=self.overlap.value)

    def _compute(self) -> tuple[str, Figure]:
        shape, gpu, link = PRESETS[self.model.value], ACCELERATORS[self.gpu.value], INTERCONNECTS[self.link.value]
        plan = self.plan()
        text = planner_readout(shape, gpu, link, self.n_gpus.value, plan, self.context.value, self.batch.value)
        sizes, compute, comm = [], [], []
        for tp in SIZES:
            try:
                p = self.plan(tp)
            except ValueError:
                continue
            sizes.append(str(tp))
            compute.append(p.compute_s * 1e3)
            comm.append((p.time_per_token_s - p.compute_s) * 1e3)
        fig = Figure(figsize=(6, 2.6))
        ax = fig.subplots()
        edges = ["black" if s == str(plan.tp) else "none" for s in sizes]      # outline the chosen TP
        ax.bar(sizes, compute, label="compute (HBM-bound)", color="tab:blue", edgecolor=edges, linewidth=2)
        ax.bar(sizes, comm, bottom=compute, label="communication not hidden", color="tab:red", edgecolor=edges,
               linewidth=2)
        ax.set_xlabel(f"TP (PP={self.pp.value})")
        ax.set_ylabel("ms per token")
        ax.set_title(f"{shape.name}, {gpu.name}, {link.name}", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        return text, fig
