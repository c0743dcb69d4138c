"""An online-softmax / tiling stepper (lab 04): one query's scores against the keys, read one key tile at a time.

    from minigpt.teaching.flash_stepper import OnlineSoftmaxStepper
    OnlineSoftmaxStepper()          # sliders: key tile size, tiles read so far; shows m, l, rescale, acc per tile

The numbers come from `stepper_rows` (pure, tested): for each tile, the running max m, the running
denominator l, the factor exp(m_old - m_new) that rescales the old l and accumulator, the accumulator
acc = sum exp(s_j - m) v_j and the current estimate acc / l. Values v_j are scalars so that every quantity
is one number; in attention acc is a D-vector updated the same way.
"""

from __future__ import annotations

import math

import ipywidgets as W
import torch
from matplotlib.figure import Figure

from minigpt.teaching.figure_view import FigureView

__all__ = ["stepper_rows", "OnlineSoftmaxStepper", "example_scores"]


def example_scores(n: int = 24, seed: int = 0) -> tuple[list[float], list[float]]:
    """Scores with a late, large maximum (so the max moves and rescaling shows), and scalar values."""
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randn(n, generator=g) * 1.5).tolist()
    scores[n * 2 // 3] = max(scores) + 3.0
    values = torch.randn(n, generator=g).tolist()
    return [round(s, 3) for s in scores], [round(v, 3) for v in values]


def stepper_rows(scores: list[float], values: list[float], block: int) -> list[dict[str, float]]:
    """One dict per key tile: start, stop, m, l, rescale (exp(m_old - m_new); 0 for the first tile), acc, out."""
    if block < 1 or len(scores) != len(values) or not scores:
        raise ValueError("need block >= 1 and as many values as scores (at least one)")
    m, l, acc, rows = -math.inf, 0.0, 0.0, []
    for start in range(0, len(scores), block):
        s, v = scores[start:start + block], values[start:start + block]
        m_new = max(m, max(s))
        rescale = math.exp(m - m_new) if m != -math.inf else 0.0
        p = [math.exp(x - m_new) for x in s]
        l = l * rescale + sum(p)
        acc = acc * rescale + sum(pi * vi for pi, vi in zip(p, v))
        m = m_new
        rows.append({"start": start, "stop": start + len(s), "m": m, "l": l, "rescale": rescale, "acc": acc,
                     "out": acc / l})
    return rows


class OnlineSoftmaxStepper(FigureView):
    """Sliders for the key tile size and the number of tiles read; a readout table and a figure."""

    def __init__(self, scores: list[float] | None = None, values: list[float] | None = None, *, block: int = 4) -> None:
        super().__init__()
        if scores is None:
            scores, values = example_scores()
        self.scores, self.values = list(scores), list(values or [1.0] * len(scores))
        n = len(self.scores)
        self.block = W.IntSlider(value=block, min=1, max=n, description="key tile")
        self.step = W.IntSlider(value=1, min=1, max=math.ceil(n / block), description="tiles read")
        self.widget = W.VBox([W.HBox([self.block, self.step]), self.error, self.readout, self.image])
        self.block.observe(self._on_block, names="value")          # before the redraw: the step's range first
        self._watch(self.block, self.step)
        self.update()

    def _on_block(self, _change) -> None:
        self.step.max = math.ceil(len(self.scores) / self.block.value)   # clamps the step when it shrinks

    def state(self) -> dict[str, float]:
        """The row shown: the state after `step` tiles."""
        rows = stepper_rows(self.scores, self.values, self.block.value)
        return rows[min(self.step.value, len(rows)) - 1]

    def _compute(self) -> tuple[str, Figure]:
        rows = stepper_rows(self.scores, self.values, self.block.value)
        k = min(self.step.value, len(rows))
        exact = sum(math.exp(s - max(self.scores)) * v for s, v in zip(self.scores, self.values)) / \
            sum(math.exp(s - max(self.scores)) for s in self.scores)
        head = "<tr><th>tile</th><th>keys</th><th>m</th><th>exp(m_old - m_new)</th><th>l</th><th>acc</th><th>acc / l</th></tr>"
        body = "".join(
            f"<tr style='{'font-weight:bold' if i == k - 1 else ''}'><td>{i + 1}</td><td>{r['start']}..{r['stop'] - 1}</td>"
            f"<td>{r['m']:.3f}</td><td>{r['rescale']:.4f}</td><td>{r['l']:.4f}</td><td>{r['acc']:.4f}</td>"
            f"<td>{r['out']:.4f}</td></tr>" for i, r in enumerate(rows[:k]))
        text = (f"<b>after tile {k} of {len(rows)} (tile of {self.block.value} keys)</b>: "
                f"m = {rows[k - 1]['m']:.3f}, l = {rows[k - 1]['l']:.4f}, "
                f"acc / l = {rows[k - 1]['out']:.4f}; exact softmax-weighted value over all keys "
                f"= {exact:.4f}<table>{head}{body}</table>")
        return text, self._figure(rows, k)

    def _figure(self, rows: list[dict[str, float]], k: int) -> Figure:
        fig = Figure(figsize=(8, 2.6))
        ax = fig.subplots()
        read = rows[k - 1]["stop"]
        colors = ["#1f77b4" if j < rows[k - 1]["start"] else "#d62728" if j < read else "#cccccc"
                  for j in range(len(self.scores))]
        ax.bar(range(len(self.scores)), self.scores, color=colors)
        ax.step([r["start"] - 0.5 for r in rows[:k]] + [read - 0.5], [r["m"] for r in rows[:k]] + [rows[k - 1]["m"]],
                where="post", color="black", label="running max m")
        for r in rows:
            ax.axvline(r["start"] - 0.5, color="#999999", lw=0.5)
        ax.set_xlabel("key index (blue: earlier tiles, red: this tile, grey: not read yet)")
        ax.set_ylabel("score")
        ax.set_title(f"tile {k}: m = {rows[k - 1]['m']:.2f}, l = {rows[k - 1]['l']:.3f}")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        return fig
