"""Lab 08's load-test pictures: output throughput and p99 TTFT against the offered request rate.

Like `plots`, every function draws on an Axes it is given and uses no pyplot state.

    fig = Figure(figsize=(9, 3.5)); ax1, ax2 = fig.subplots(1, 2)
    plot_throughput_vs_rate(ax1, {"naive": naive_rows, "engine": engine_rows})
    plot_ttft_vs_rate(ax2, {"naive": naive_rows, "engine": engine_rows})
"""

from __future__ import annotations

import math
from typing import Mapping, Protocol, Sequence

from matplotlib.axes import Axes

__all__ = ["plot_throughput_vs_rate", "plot_ttft_vs_rate"]


class RatePoint(Protocol):
    """One load-test run: the offered rate (requests/s, inf = all at once) and what came out."""
    rate: float
    output_throughput: float
    p99_ttft: float


def _x(rows: Sequence[RatePoint], finite_max: float) -> list[float]:
    """Rates, with inf drawn one doubling past the largest finite rate."""
    return [2 * finite_max if math.isinf(r.rate) else r.rate for r in rows]


def _finite_max(series: Mapping[str, Sequence[RatePoint]]) -> float:
    finite = [r.rate for rows in series.values() for r in rows if math.isfinite(r.rate)]
    return max(finite, default=1.0)


def plot_throughput_vs_rate(ax: Axes, series: Mapping[str, Sequence[RatePoint]]) -> None:
    """Output tokens/s against offered request rate, one line per engine, on a log-2 rate axis."""
    top = _finite_max(series)
    for name, rows in series.items():
        ax.plot(_x(rows, top), [r.output_throughput for r in rows], "o-", label=name)
    _rate_axis(ax, series, top)
    ax.set_ylabel("output tokens/s")
    ax.set_title("throughput against load")


def plot_ttft_vs_rate(ax: Axes, series: Mapping[str, Sequence[RatePoint]]) -> None:
    """p99 time to first token (ms, log scale) against offered request rate."""
    top = _finite_max(series)
    for name, rows in series.items():
        ax.plot(_x(rows, top), [1e3 * r.p99_ttft for r in rows], "o-", label=name)
    _rate_axis(ax, series, top)
    ax.set_yscale("log")
    ax.set_ylabel("p99 TTFT (ms)")
    ax.set_title("queueing against load")


def _rate_axis(ax: Axes, series: Mapping[str, Sequence[RatePoint]], top: float) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("offered load (requests/s; rightmost: all at once)" if any(
        math.isinf(r.rate) for rows in series.values() for r in rows) else "offered load (requests/s)")
    ax.grid(True, alpha=0.3)
    ax.legend()
