"""Matplotlib pictures for the labs: the roofline and a GPU's memory budget.

Every function draws on an Axes it is given (so notebooks can lay figures out as they like) and
uses no pyplot state; `figure_png` renders a standalone Figure to PNG bytes for widgets.

    fig = Figure(figsize=(6, 4)); ax = fig.add_subplot()
    plot_roofline(ax, peak=989.5e12, bandwidth=3.35e12, points={"decode": (7.1, 2.4e13)})
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from minigpt.costmodel.calculators import GiB, MemoryPlan

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def figure_png(fig: Figure, dpi: int = 80) -> bytes:
    """Render a Figure (no pyplot involved) to PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def show_figure(image, fig: Figure, dpi: int = 80, scale: int = 2) -> None:
    """Put `fig` into an ipywidgets Image, rendered at `scale` times `dpi` and shown at its size at `dpi`,
    so it is sharp on high-density screens and never stretched."""
    show_rendered(image, render_figure(fig, dpi, scale))


@dataclass(frozen=True)
class RenderedFigure:
    """A figure's PNG and the size (CSS pixels) to show it at."""

    png: bytes
    width: int
    height: int


def render_figure(fig: Figure, dpi: int = 80, scale: int = 2) -> RenderedFigure:
    """Render at `scale` x `dpi`, to be shown at its size at `dpi` (sharp on high-density screens)."""
    png = figure_png(fig, dpi * scale)
    width, height = png_size(png)
    return RenderedFigure(png, round(width / scale), round(height / scale))


def show_rendered(image, figure: RenderedFigure) -> None:
    """Put a rendered figure into an ipywidgets Image."""
    image.value = figure.png
    image.width, image.height = str(figure.width), str(figure.height)


def plot_roofline(ax: Axes, peak: float, bandwidth: float, points: Mapping[str, tuple[float, float]] | None = None,
                  *, label: str = "", intensity_range: tuple[float, float] = (0.1, 1e5), color: str = "black",
                  annotate: bool = True) -> None:
    """Draw min(peak, intensity * bandwidth) on log-log axes, plus named points (intensity, FLOP/s).

    The ridge point, peak / bandwidth, is marked with a dotted line.
    """
    lo, hi = intensity_range
    ai = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.loglog(ai, np.minimum(peak, ai * bandwidth), color=color, lw=2,
              label=label or f"roofline ({peak / 1e12:.3g} TFLOP/s, {bandwidth / 1e12:.3g} TB/s)")
    ridge = peak / bandwidth
    ax.axvline(ridge, color=color, ls=":", lw=1)
    if annotate:
        ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak), textcoords="offset points", xytext=(4, -14), fontsize=8)
    for name, (x, y) in (points or {}).items():
        c = PHASE_COLORS.get(name.split()[0], None)
        ax.loglog([x], [y], "o", ms=8, color=c, label=f"{name}: {x:.3g} FLOP/B")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable FLOP/s")
    ax.grid(True, which="major", alpha=0.3)


def plot_memory_plan(ax: Axes, plan: MemoryPlan, *, title: str = "") -> None:
    """One horizontal stacked bar, in GiB: weights | KV cache of the batch | free, against the usable memory."""
    w, kv = plan.weight_bytes / GiB, plan.kv_bytes / GiB
    free = max(plan.free_bytes, 0) / GiB
    ax.barh([0], [w], color="tab:gray", label=f"weights {w:.3g} GiB")
    ax.barh([0], [kv], left=[w], color="tab:red" if not plan.fits else "tab:blue", label=f"KV cache {kv:.3g} GiB")
    ax.barh([0], [free], left=[w + kv], color="tab:green", alpha=0.3, label=f"free {free:.3g} GiB")
    ax.axvline(plan.usable_bytes / GiB, color="black", ls="--", lw=1, label=f"usable {plan.usable_bytes / GiB:.3g} GiB")
    ax.axvline(plan.memory_bytes / GiB, color="black", lw=1.5, label=f"memory {plan.memory_bytes / GiB:.3g} GiB")
    ax.set_yticks([])
    ax.set_xlabel("GiB")
    ax.set_xlim(0, max(w + kv, plan.memory_bytes / GiB) * 1.05)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)


def plot_requests_vs_context(ax: Axes, contexts: Sequence[int], requests: Sequence[int], *,
                             current: tuple[int, int] | None = None) -> None:
    """Max concurrent requests against context length (log x), with the current setting marked."""
    ax.semilogx(contexts, requests, color="tab:blue", lw=2)
    if current is not None:
        ax.semilogx([current[0]], [current[1]], "o", color="tab:red", ms=8, label=f"{current[1]} requests at {current[0]} tokens")
        ax.legend(fontsize=8)
    ax.set_xlabel("context length (tokens per request)")
    ax.set_ylabel("max concurrent requests")
    ax.grid(True, alpha=0.3)
