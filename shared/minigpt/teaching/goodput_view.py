"""Colocated or disaggregated (lab 11): goodput per GPU against the request rate, and the latencies at one rate.

    from minigpt.teaching.goodput_view import GoodputView
    GoodputView(rate=10, prompt_len=4096, output_len=128, n_gpus=4, prefill_gpus=3)
    GoodputView(rate=10, prompt_len=4096, chunked_prefill=512)     # colocated GPUs chunk prompts, 512 tokens a step

Every number comes from `goodput_readout`, a pure function over `minigpt.disagg.goodput_sim`: at each preset rate it
serves the same seeded workload (Poisson arrivals, fixed lengths) on N colocated GPUs (prompts prefilled whole, or
in chunks of a step's token budget: the chunk control) and on P prefill + (N - P) decode GPUs, and counts the requests meeting both SLOs (TTFT and TPOT, the mean gap between tokens). The figure: goodput per
GPU against the offered load per GPU (the dotted line is everything offered), then the p50/p90/p99 TTFT and gaps
between tokens of both at the chosen rate (TPOT per request; ITL p99 over every gap, where a colocated prefill's stall
shows), the SLOs dashed. The readout says who wins at that rate, by how much, and
which split would have been best there.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as W
from matplotlib.figure import Figure

from minigpt.disagg import goodput_sim as gs
from minigpt.teaching.figure_view import FigureView

__all__ = ["RATES", "PROMPTS", "OUTPUTS", "TTFT_LIMITS", "ITL_LIMITS_MS", "GoodputReadout", "goodput_readout",
           "GoodputView"]

RATES = [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0]     # offered requests/s per GPU
PROMPTS = [512, 1024, 2048, 4096, 8192]
OUTPUTS = [32, 64, 128, 256, 512]
TTFT_LIMITS = [0.25, 0.5, 1.0, 2.0, 5.0]                              # seconds
ITL_LIMITS_MS = [10, 15, 20, 30, 50, 100]
CHUNKS = [("none: whole prompts", 0), ("8192 (vLLM's H100 default)", 8192), ("2048", 2048), ("512", 512)]
PERCENTILES = (50, 90, 99)
COLORS = {"colocated": "tab:purple", "disaggregated": "tab:green"}


def requests_for(n_gpus: int) -> int:
    """Requests per simulated run: 100 a GPU and at least 300, so each GPU sees many request lifetimes."""
    return max(300, 100 * n_gpus)


@dataclass(frozen=True)
class GoodputReadout:
    """Goodput per GPU at each rate per GPU, both runs at the chosen rate, and the best split there."""

    rates: list[float]
    colocated: list[float]
    disaggregated: list[float]
    at_rate: dict[str, gs.SimResult]          # {"colocated": ..., "disaggregated": ...}
    best: gs.Placement

    def winner(self, rate: float) -> str:
        i = self.rates.index(rate)
        co, dis = self.colocated[i], self.disaggregated[i]
        return "disaggregated" if dis > co else "colocated" if co > dis else "tie"


def simulate_curves(rate: float, prompt_len: int, output_len: int, n_gpus: int, prefill_gpus: int, ttft_limit: float,
                    itl_limit: float, *, seed: int = 0, config: gs.SimConfig = gs.SimConfig()) -> GoodputReadout:
    """Both modes at every preset rate (and `rate`), per GPU; the best split at `rate`."""
    if not 1 <= prefill_gpus < n_gpus:
        raise ValueError(f"the split needs 1 <= prefill GPUs < GPUs, got {prefill_gpus} of {n_gpus}")
    rates = sorted(set(RATES) | {rate})
    n = requests_for(n_gpus)
    co, dis, at_rate = [], [], {}
    for r in rates:
        wl = gs.make_workload(n, r * n_gpus, prompt_len=prompt_len, output_len=output_len, seed=seed)
        runs = {"colocated": gs.simulate_colocated(wl, n_gpus, config),
                "disaggregated": gs.simulate_disaggregated(wl, prefill_gpus, n_gpus - prefill_gpus, config)}
        co.append(gs.goodput(runs["colocated"], ttft_limit, itl_limit, per_gpu=True))
        dis.append(gs.goodput(runs["disaggregated"], ttft_limit, itl_limit, per_gpu=True))
        if r == rate:
            at_rate = runs
    best = gs.best_placement(rate * n_gpus, n_gpus, prompt_len=prompt_len, output_len=output_len, n_requests=n,
                             seed=seed, ttft_limit=ttft_limit, itl_limit=itl_limit, config=config)
    return GoodputReadout(rates, co, dis, at_rate, best)


def _latency_rows(data: GoodputReadout, ttft_limit: float, itl_limit: float) -> str:
    head = ("<tr><th></th><th>goodput / GPU</th><th>meet both SLOs</th>"
            + "".join(f"<th>TTFT p{p}</th>" for p in PERCENTILES) + "".join(f"<th>TPOT p{p}</th>" for p in PERCENTILES)
            + "<th>ITL p99 (every gap)</th></tr>")
    rows = []
    for mode, run in data.at_rate.items():
        pct = run.percentiles(PERCENTILES)
        label = mode if run.placement is None else f"{mode} ({run.placement[0]} + {run.placement[1]})"
        cells = [f"{gs.goodput(run, ttft_limit, itl_limit, per_gpu=True):.2f}",
                 f"{run.attainment(ttft_limit, itl_limit):.0%}"]
        cells += [f"{pct['ttft'][p]:.2f} s" for p in PERCENTILES]
        cells += [f"{1e3 * pct['tpot'][p]:.1f} ms" for p in PERCENTILES]
        cells.append(f"{1e3 * pct['itl'][99]:.0f} ms")
        rows.append(f"<tr><td><b>{html.escape(label)}</b></td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _verdict(data: GoodputReadout, rate: float, prefill_gpus: int, n_gpus: int) -> str:
    i = data.rates.index(rate)
    co, dis = data.colocated[i], data.disaggregated[i]
    split = f"{prefill_gpus} prefill + {n_gpus - prefill_gpus} decode"
    who = data.winner(rate)
    if who == "tie":
        line = f"a <b>tie</b>: both serve {co:.2f} req/s per GPU within the SLOs"
    elif who == "colocated":
        line = f"<b>colocated</b> wins: {co:.2f} against {dis:.2f} req/s per GPU for {split}"
    else:
        line = f"<b>disaggregated</b> ({split}) wins: {dis:.2f} against {co:.2f} req/s per GPU colocated"
    best = data.best
    return (f"At {rate:g} req/s per GPU ({rate * n_gpus:g} req/s on {n_gpus} GPUs), {line}. "
            f"Best split at this rate: {best.prefill_gpus} + {best.decode_gpus}, "
            f"{best.goodput_per_gpu:.2f} req/s per GPU.")


def goodput_readout(rate: float, prompt_len: int, output_len: int, n_gpus: int, prefill_gpus: int, *,
                    ttft_limit: float = gs.DEFAULT_TTFT_S, itl_limit: float = gs.DEFAULT_ITL_S, seed: int = 0,
                    config: gs.SimConfig = gs.SimConfig()) -> tuple[str, Figure, GoodputReadout]:
    """The readout's HTML, the figure and the numbers behind them, for one state of the controls."""
    data = simulate_curves(rate, prompt_len, output_len, n_gpus, prefill_gpus, ttft_limit, itl_limit, seed=seed,
                           config=config)
    slo = f"TTFT &le; {ttft_limit:g} s and TPOT &le; {1e3 * itl_limit:g} ms"
    chunking = (f"with chunked prefill, {config.chunked_prefill} tokens a step" if config.chunked_prefill
                else "without chunked prefill")
    text = (f"<div class='goodput-readout'><div>{config.model} on {n_gpus} x {config.gpu}, prompts of "
            f"{prompt_len:,} tokens, {output_len} output tokens, colocated {chunking}; goodput = requests/s "
            f"meeting {slo}.</div>"
            f"{_latency_rows(data, ttft_limit, itl_limit)}<div>{_verdict(data, rate, prefill_gpus, n_gpus)}</div>"
            "</div>")

    fig = Figure(figsize=(11, 3.2), layout="constrained")
    ax_g, ax_t, ax_i = fig.subplots(1, 3, gridspec_kw={"width_ratios": [3, 2, 2]})
    ax_g.plot(data.rates, data.rates, ":", color="grey", label="offered")
    ax_g.plot(data.rates, data.colocated, "o-", color=COLORS["colocated"], label=f"colocated ({n_gpus})")
    ax_g.plot(data.rates, data.disaggregated, "s-", color=COLORS["disaggregated"],
              label=f"disaggregated ({prefill_gpus} + {n_gpus - prefill_gpus})")
    ax_g.axvline(rate, color="black", lw=0.8, ls="--")
    ax_g.set(xlabel="offered load (req/s per GPU)", ylabel="goodput (req/s per GPU)",
             title=f"prompt {prompt_len:,}, output {output_len}", ylim=(0, max(data.rates) * 1.05))
    ax_g.legend(fontsize=7)
    width = 0.38
    for k, (mode, run) in enumerate(data.at_rate.items()):
        pct = run.percentiles(PERCENTILES)
        xs = [j + (k - 0.5) * width for j in range(len(PERCENTILES))]
        ax_t.bar(xs, [pct["ttft"][p] for p in PERCENTILES], width, color=COLORS[mode], label=mode)
        ax_i.bar(xs, [1e3 * pct["tpot"][p] for p in PERCENTILES], width, color=COLORS[mode], label=mode)
        ax_i.bar(len(PERCENTILES) + (k - 0.5) * width, 1e3 * pct["itl"][99], width, color=COLORS[mode], hatch="//",
                 alpha=0.6)
    labels = [f"p{p}" for p in PERCENTILES]
    ax_t.axhline(ttft_limit, color="red", ls="--", lw=1)
    ax_t.set_xticks(range(len(PERCENTILES)), labels)
    ax_t.set(ylabel="TTFT (s)", title=f"at {rate:g} req/s per GPU")
    ax_i.axhline(1e3 * itl_limit, color="red", ls="--", lw=1)
    ax_i.set_xticks(list(range(len(PERCENTILES))) + [len(PERCENTILES)], labels + ["ITL p99\n(every gap)"])
    ax_i.set(ylabel="ms", title="TPOT (a request's mean gap), ITL")
    ax_i.legend(fontsize=7)
    return text, fig, data


class GoodputView(FigureView):
    """Rate, prompt and output lengths, GPUs, the split, the two SLOs -> who serves more requests per GPU in time."""

    def __init__(self, *, rate: float = 10.0, prompt_len: int = 4096, output_len: int = 128, n_gpus: int = 4,
                 prefill_gpus: int = 3, ttft_limit: float = gs.DEFAULT_TTFT_S,
                 itl_limit_ms: int = round(1e3 * gs.DEFAULT_ITL_S), chunked_prefill: int | None = None) -> None:
        super().__init__()
        self.rate = W.SelectionSlider(options=RATES, value=float(rate), description="rate (req/s per GPU)")
        self.prompt_len = W.SelectionSlider(options=PROMPTS, value=prompt_len, description="prompt tokens")
        self.output_len = W.SelectionSlider(options=OUTPUTS, value=output_len, description="output tokens")
        self.n_gpus = W.IntSlider(value=n_gpus, min=2, max=8, description="GPUs")
        self.prefill_gpus = W.IntSlider(value=prefill_gpus, min=1, max=n_gpus - 1, description="prefill GPUs (P of N)")
        self.ttft_limit = W.SelectionSlider(options=TTFT_LIMITS, value=ttft_limit, description="TTFT SLO (s)")
        self.itl_limit = W.SelectionSlider(options=ITL_LIMITS_MS, value=itl_limit_ms, description="TPOT SLO (ms)")
        self.chunk = W.Dropdown(options=CHUNKS, value=chunked_prefill or 0, description="colocated chunk")
        self.widget = W.VBox([W.HBox([self.rate, self.prompt_len, self.output_len]),
                              W.HBox([self.n_gpus, self.prefill_gpus, self.chunk]),
                              W.HBox([self.ttft_limit, self.itl_limit]),
                              self.error, self.readout, self.image])
        self._watch(self.rate, self.prompt_len, self.output_len, self.n_gpus, self.prefill_gpus, self.ttft_limit,
                    self.itl_limit, self.chunk)
        self.update()

    def _arrange(self) -> None:
        """The split leaves at least one GPU to each side (the slider clamps P when N shrinks)."""
        self.prefill_gpus.max = self.n_gpus.value - 1

    def _compute(self) -> tuple[str, Figure]:
        text, fig, _ = goodput_readout(self.rate.value, self.prompt_len.value, self.output_len.value,
                                       self.n_gpus.value, self.prefill_gpus.value, ttft_limit=self.ttft_limit.value,
                                       itl_limit=self.itl_limit.value / 1e3,
                                       config=gs.SimConfig(chunked_prefill=self.chunk.value or None))
        return text, fig
