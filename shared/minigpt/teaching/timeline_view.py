"""An interactive timeline of the engine's loop (lab 12): the CPU's scheduling against the model's steps, serial
against overlapped.

    from minigpt.teaching.timeline_view import TimelineView
    TimelineView(model_ms=8.0, cpu_ms=0.4, handoff_ms=0.12)      # this machine's measured figures, say

Controls: the model's step, the CPU's work per step, the hand-off of an overlapped launch (milliseconds), and a
preset ("this CPU" as measured, "an H100, Llama-3.2-1B"). Two Gantt rows per loop: CPU work and model steps, from
`minigpt.engine.overlap.step_timeline` (Exercise 1's rule); the readout gives the time between tokens of each loop,
their ratio, and which of the two (model or CPU) sets the overlapped pace. `timeline_rows` is the pure function
behind it (tested without a browser).
"""

from __future__ import annotations

import html

import ipywidgets as W
from matplotlib.figure import Figure

from minigpt.engine.overlap import step_timeline
from minigpt.teaching.figure_view import FigureView

__all__ = ["timeline_rows", "TimelineView", "PRESETS"]

STEPS = 6
# (model ms, CPU ms, hand-off ms): "an H100" prices Llama-3.2-1B's bf16 weights at 3.35 TB/s (lab 00's rule) with a
# Python scheduler's 0.9 ms; "this CPU" is filled in by the notebook from its own measurement.
PRESETS = {"an H100, Llama-3.2-1B, batch 1": (0.74, 0.9, 0.05)}


def timeline_rows(model_ms: float, cpu_ms: float, handoff_ms: float, steps: int = STEPS) -> dict[str, dict]:
    """For "serial" and "overlapped": the CPU's (start, end) spans, the model's, and the mean time between tokens
    (ms). Serially the CPU works right before each step; overlapped, beside the step before (from its launch)."""
    model, cpu = [model_ms] * steps, [cpu_ms] * steps
    rows = {}
    for name, overlapped in (("serial", False), ("overlapped", True)):
        spans = step_timeline(model, cpu, overlapped=overlapped, handoff_s=handoff_ms)
        cpu_spans = [(start - cpu_ms - (handoff_ms if overlapped else 0.0), start - (handoff_ms if overlapped else 0.0))
                     for start, _ in spans]
        if overlapped:
            cpu_spans = [cpu_spans[0]] + [(spans[i - 1][0], spans[i - 1][0] + cpu_ms) for i in range(1, steps)]
        gaps = [b[1] - a[1] for a, b in zip(spans, spans[1:])]
        rows[name] = {"model": spans, "cpu": cpu_spans, "itl_ms": sum(gaps) / len(gaps)}
    return rows


class TimelineView(FigureView):
    """Sliders for the model's step, the CPU's work and the hand-off; Gantt rows of both loops."""

    def __init__(self, model_ms: float = 8.0, cpu_ms: float = 0.4, handoff_ms: float = 0.12,
                 presets: dict[str, tuple[float, float, float]] | None = None) -> None:
        super().__init__()
        self.presets = {"this CPU (measured)": (model_ms, cpu_ms, handoff_ms), **PRESETS, **(presets or {})}
        self.preset = W.Dropdown(options=list(self.presets), value="this CPU (measured)", description="preset")
        self.model = W.FloatSlider(value=model_ms, min=0.1, max=20.0, step=0.05, description="model step (ms)")
        self.cpu = W.FloatSlider(value=cpu_ms, min=0.0, max=10.0, step=0.05, description="CPU work (ms)")
        self.handoff = W.FloatSlider(value=handoff_ms, min=0.0, max=1.0, step=0.01, description="hand-off (ms)")
        self.preset.observe(self._apply_preset, names="value")
        self.widget = W.VBox([self.preset, W.HBox([self.model, self.cpu, self.handoff]), self.error, self.readout,
                              self.image])
        self._watch(self.model, self.cpu, self.handoff)
        self.update()

    def _apply_preset(self, change: dict) -> None:
        model, cpu, handoff = self.presets[change["new"]]
        with self.model.hold_trait_notifications(), self.cpu.hold_trait_notifications(), \
                self.handoff.hold_trait_notifications():
            self.model.value, self.cpu.value, self.handoff.value = model, cpu, handoff

    def _compute(self) -> tuple[str, Figure]:
        m, c, h = self.model.value, self.cpu.value, self.handoff.value
        rows = timeline_rows(m, c, h)
        serial, overlapped = rows["serial"]["itl_ms"], rows["overlapped"]["itl_ms"]
        pace = "the model's step" if m >= c else "the CPU's work"
        text = (f"time between tokens: serial {serial:.2f} ms, overlapped {overlapped:.2f} ms: "
                f"<b>{serial / overlapped:.2f}x</b>; overlapped, {html.escape(pace)} sets the pace "
                f"(max({m:.2f}, {c:.2f}) + {h:.2f} ms hand-off)")
        fig = Figure(figsize=(8, 2.6))
        ax = fig.subplots()
        lanes = [("serial: CPU", rows["serial"]["cpu"], "#f28e2b"), ("serial: model", rows["serial"]["model"], "#4e79a7"),
                 ("overlapped: CPU", rows["overlapped"]["cpu"], "#f28e2b"),
                 ("overlapped: model", rows["overlapped"]["model"], "#4e79a7")]
        for y, (_, spans, colour) in enumerate(lanes):
            ax.broken_barh([(a, b - a) for a, b in spans], (y - 0.35, 0.7), color=colour, edgecolor="white")
        ax.set_yticks(range(len(lanes)), [name for name, _, _ in lanes])
        ax.invert_yaxis()
        ax.set_xlabel("ms")
        fig.tight_layout()
        return text, fig
