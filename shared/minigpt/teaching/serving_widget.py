"""The lab 03 serving simulator as an ipywidgets view: goodput against offered load.

    from minigpt.teaching.serving_widget import ServingSimulator
    ServingSimulator()        # policy, request rates, output-length spread, token budget -> goodput curve

All numbers come from `serving_readout` (a pure function over `minigpt.costmodel.serving_simulator`);
the view reads its controls, calls it, and shows the text and the PNG of the figure.
"""

from __future__ import annotations

import ipywidgets as W
from matplotlib.figure import Figure

from minigpt.costmodel import serving_simulator as sim
from minigpt.teaching.figure_view import FigureView

__all__ = ["POLICIES", "BUDGETS", "serving_readout", "ServingSimulator"]

POLICIES = ["static", "dynamic", "continuous"]
BUDGETS = [512, 1024, 2048, 4096, 8192]
RATES = [1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0]


def serving_readout(policy: str, max_rate: float, spread: float, budget: int, *, n: int = 40, ttft_limit: float = 1.0,
                    tpot_limit: float = 0.05, model: str = "Llama-3-8B", gpu: str = "H100-SXM"
                    ) -> tuple[str, Figure, list[sim.GoodputPoint]]:
    """Goodput and throughput of `policy` at the preset rates up to `max_rate`, on the simulated GPU."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    rates = [r for r in RATES if r <= max_rate] or [RATES[0]]
    pts = sim.goodput_curve(policy, rates, n=n, spread=spread, ttft_limit=ttft_limit, tpot_limit=tpot_limit,
                            max_num_batched_tokens=budget, model=model, gpu=gpu)
    fig = Figure(figsize=(9, 3))
    a1, a2 = fig.subplots(1, 2)
    a1.plot(rates, [p.goodput for p in pts], "o-")
    a1.set(xscale="log", ylim=(-0.05, 1.05), xlabel="offered load (requests/s)", ylabel="goodput",
           title=f"{policy}, {model} on {gpu} (simulated)")
    a2.plot(rates, [p.tokens_per_second for p in pts], "o-")
    a2.set(xscale="log", xlabel="offered load (requests/s)", ylabel="output tokens/s")
    fig.tight_layout()
    knee = sim.knee(pts)
    text = (f"<b>{policy}</b>, token budget {budget}, output-length spread {spread:g}: goodput "
            f"(TTFT &le; {ttft_limit:g} s and TPOT &le; {1e3 * tpot_limit:g} ms) stays &ge; 0.9 up to "
            f"<b>{knee if knee is not None else 'no tested'} req/s</b>; at {rates[-1]:g} req/s: "
            f"{pts[-1].tokens_per_second:,.0f} tokens/s, p99 TTFT {pts[-1].p99_ttft:.2f} s, "
            f"p99 TPOT {1e3 * pts[-1].p99_tpot:.1f} ms")
    return text, fig, pts


class ServingSimulator(FigureView):
    """Controls in, HTML readout + PNG figure out, recomputed on every change."""

    def __init__(self, *, policy: str = "continuous", max_rate: float = 40.0, spread: float = 1.0,
                 budget: int = 2048) -> None:
        self.policy = W.Dropdown(options=POLICIES, value=policy, description="policy")
        self.max_rate = W.SelectionSlider(options=RATES, value=max_rate, description="max rate")
        self.spread = W.FloatSlider(value=spread, min=0.0, max=2.0, step=0.25, description="length spread")
        self.budget = W.SelectionSlider(options=BUDGETS, value=budget, description="token budget")
        super().__init__()
        self.widget = W.VBox([W.HBox([self.policy, self.max_rate]), W.HBox([self.spread, self.budget]),
                              self.error, self.readout, self.image])
        self._watch(self.policy, self.max_rate, self.spread, self.budget)
        self.update()

    def _compute(self) -> tuple[str, Figure]:
        text, fig, _ = serving_readout(self.policy.value, self.max_rate.value, self.spread.value, self.budget.value)
        return text, fig
