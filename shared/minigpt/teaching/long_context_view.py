"""Perplexity against position, per RoPE scaling method and per window (lab 09): an interactive view.

    from minigpt.teaching.long_context_view import LongContextView
    LongContextView(curves, trained_len=512)        # curves: {name: per-position NLL (B, T-1) or (T-1,)}

Pick the curves to show (scaling methods, sliding windows, sinks), the width of the buckets positions are
averaged over, and a linear or log axis. The readout is a table of perplexity per bucket of the trained
length's multiples (`curve_table`); the figure draws exp(mean NLL) per bucket, with the trained length marked.
"""

from __future__ import annotations

import html
from typing import Mapping, Sequence

import ipywidgets as W
import torch
from matplotlib.figure import Figure
from torch import Tensor

from minigpt.teaching.figure_view import FigureView

__all__ = ["LongContextView", "curve_table", "bucketed_perplexity", "BUCKETS"]

BUCKETS = [64, 128, 256, 512]


def bucketed_perplexity(nll: Tensor, bucket: int) -> tuple[list[int], list[float]]:
    """Bucket starts and exp(mean NLL) per bucket of `bucket` positions (NLL (B, T) or (T,), pooled over B)."""
    if bucket < 1:
        raise ValueError(f"bucket must be >= 1, got {bucket}")
    nll = nll.reshape(-1, nll.shape[-1]).float()
    starts = list(range(0, nll.shape[-1], bucket))
    return starts, [float(nll[:, s:s + bucket].mean().exp()) for s in starts]


def curve_table(curves: Mapping[str, Tensor], names: Sequence[str], trained_len: int) -> str:
    """HTML table: one row per curve, perplexity over [0, L), [L, 2L), [2L, 4L), [4L, 8L) (those the curves reach)."""
    if not names:
        raise ValueError("choose at least one curve")
    T = min(curves[n].shape[-1] for n in names)
    edges = [0, trained_len]
    while edges[-1] * 2 <= T:
        edges.append(edges[-1] * 2)
    if edges[-1] < T:
        edges.append(T)
    head = "".join(f"<th>[{a:,}, {b:,})</th>" for a, b in zip(edges[:-1], edges[1:]))
    rows = []
    for name in names:
        nll = curves[name].reshape(-1, curves[name].shape[-1]).float()
        cells = "".join(f"<td>{float(nll[:, a:b].mean().exp()):.1f}</td>" for a, b in zip(edges[:-1], edges[1:]))
        rows.append(f"<tr><td><b>{html.escape(name)}</b></td>{cells}</tr>")
    return (f"<table class='longctx-readout'><tr><th>perplexity at positions</th>{head}</tr>{''.join(rows)}</table>"
            f"<div>trained context: {trained_len:,} tokens</div>")


class LongContextView(FigureView):
    """Curves to show, bucket width, log axis -> a table of perplexity per length band and the figure."""

    def __init__(self, curves: Mapping[str, Tensor], *, trained_len: int = 512, show: Sequence[str] | None = None,
                 bucket: int = 256) -> None:
        super().__init__()
        if not curves:
            raise ValueError("no curves to show")
        self.curves, self.trained_len = dict(curves), trained_len
        names = list(self.curves)
        self.names = W.SelectMultiple(options=names, value=tuple(show or names[:4]), description="curves",
                                      rows=min(8, len(names)))
        self.bucket = W.SelectionSlider(options=BUCKETS, value=bucket, description="bucket")
        self.log_y = W.Checkbox(value=True, description="log perplexity axis")
        self.widget = W.VBox([W.HBox([self.names, W.VBox([self.bucket, self.log_y])]), self.error, self.readout,
                              self.image])
        self._watch(self.names, self.bucket, self.log_y)
        self.update()

    def _compute(self) -> tuple[str, Figure]:
        names = list(self.names.value)
        text = curve_table(self.curves, names, self.trained_len)
        fig = Figure(figsize=(6.5, 3))
        ax = fig.subplots()
        for name in names:
            starts, ppl = bucketed_perplexity(self.curves[name], self.bucket.value)
            ax.plot([s + self.bucket.value / 2 for s in starts], ppl, marker=".", label=name)
        ax.axvline(self.trained_len, color="grey", ls=":", lw=1)
        ax.text(self.trained_len, ax.get_ylim()[1], " trained length", fontsize=7, va="top", color="grey")
        if self.log_y.value:
            ax.set_yscale("log")
        ax.set_xlabel("position in the sequence")
        ax.set_ylabel(f"perplexity (bucket {self.bucket.value})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return text, fig
