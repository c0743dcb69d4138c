"""Retrieval against depth and length, and perplexity per band of positions, per way of running a model past its
trained context (lab 09): an interactive view.

    from minigpt.longctx.retrieval import stored_grid
    from minigpt.teaching.retrieval_view import RetrievalView
    RetrievalView(stored_grid()["grids"], trained_len=512, policy="yarn", compare="none")

Each grid is a `RetrievalGrid.__dict__`: a policy's fraction of needles found per (total length, depth) cell and the
perplexity per band of positions of its longest texts. Pick a policy, another to compare it with, and the metric:
"retrieval" draws one heatmap per policy (rows: total length, columns: depth of the needle, 0 = the start of the text,
1 = just before the question; colour fixed to 0..1), "perplexity" the band perplexity of both (log axis), the trained
length marked in each. The readout (`readout_table`) gives mean retrieval per length and perplexity per band, and which
policy keeps the most retrieval past the trained length.
"""

from __future__ import annotations

import html
from typing import Mapping, Sequence

import ipywidgets as W
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.ticker import LogFormatter

from minigpt.teaching.figure_view import FigureView

__all__ = ["RetrievalView", "accuracy_by_length", "grids_by_policy", "readout_table", "plot_heatmap", "plot_band_perplexity",
           "NO_COMPARE", "METRICS"]

NO_COMPARE = "(none)"
METRICS = ["retrieval", "perplexity"]


def accuracy_by_length(grid: Mapping) -> list[float]:
    """Mean accuracy over depths, one per length: accuracy (len(lengths), len(depths)) -> (len(lengths),)."""
    return [sum(row) / len(row) for row in grid["accuracy"]]


def _check_grid(grid: Mapping) -> None:
    name, lengths, depths, acc = grid["policy"], grid["lengths"], grid["depths"], grid["accuracy"]
    if not lengths or not depths:
        raise ValueError(f"grid {name!r} has no lengths or no depths")
    if len(acc) != len(lengths) or any(len(row) != len(depths) for row in acc):
        raise ValueError(f"grid {name!r}: accuracy must be {len(lengths)} lengths x {len(depths)} depths, "
                         f"got {[len(row) for row in acc]}")
    if any(not 0 <= a <= 1 for row in acc for a in row):
        raise ValueError(f"grid {name!r}: accuracy must be fractions in [0, 1]")
    edges, ppl = grid.get("band_edges", []), grid.get("band_perplexity", [])
    if len(ppl) != max(len(edges) - 1, 0):
        raise ValueError(f"grid {name!r}: {len(edges)} band edges need {max(len(edges) - 1, 0)} band perplexities, "
                         f"got {len(ppl)}")


def grids_by_policy(grids: Sequence[Mapping]) -> dict[str, Mapping]:
    """{policy name: grid}, after checking every grid is whole and all share lengths, depths and band edges."""
    if not grids:
        raise ValueError("no retrieval grids to show")
    out: dict[str, Mapping] = {}
    first = grids[0]
    for grid in grids:
        _check_grid(grid)
        name = grid["policy"]
        if name in out:
            raise ValueError(f"two grids for policy {name!r}")
        for key in ("lengths", "depths", "band_edges"):
            if list(grid.get(key, [])) != list(first.get(key, [])):
                raise ValueError(f"grid {name!r} has {key} {list(grid.get(key, []))} but grid {first['policy']!r} "
                                 f"has {list(first.get(key, []))}: all grids must share them")
        out[name] = grid
    return out


def _band_labels(edges: Sequence[int]) -> list[str]:
    return [f"[{a:,}, {b:,})" for a, b in zip(edges[:-1], edges[1:])]


def _beyond_line(grids_by_name: Mapping[str, Mapping], names: Sequence[str], trained_len: int) -> str:
    """Which policy keeps the most retrieval at the lengths past `trained_len` (mean over those lengths and depths)."""
    lengths = grids_by_name[names[0]]["lengths"]
    beyond = [i for i, n in enumerate(lengths) if n > trained_len]
    if not beyond:
        return f"no measured length is past the trained context ({trained_len:,} tokens)"
    kept = {n: sum(accuracy_by_length(grids_by_name[n])[i] for i in beyond) / len(beyond) for n in names}
    best = max(kept.values())
    winners = [n for n in names if kept[n] == best]
    span = f"{lengths[beyond[0]]:,}" + (f" to {lengths[beyond[-1]]:,}" if len(beyond) > 1 else "")
    who = " and ".join(f"<b>{html.escape(n)}</b>" for n in winners)
    verb = "tie for" if len(winners) > 1 else "keeps"
    others = "; ".join(f"{html.escape(n)}: {kept[n]:.0%}" for n in names if n not in winners)
    return (f"past the trained context ({trained_len:,} tokens; lengths {span}), {who} {verb} the most retrieval: "
            f"{best:.0%} of needles found" + (f" ({others})" if others else ""))


def readout_table(grids_by_name: Mapping[str, Mapping], names: Sequence[str], trained_len: int) -> str:
    """HTML: one row per policy in `names`, mean retrieval per length then perplexity per band of positions, and a line
    saying which of them keeps the most retrieval past `trained_len`."""
    if not names:
        raise ValueError("choose at least one policy")
    unknown = [n for n in names if n not in grids_by_name]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; the grids have {list(grids_by_name)}")
    first = grids_by_name[names[0]]
    head = "".join(f"<th>{n:,}</th>" for n in first["lengths"])
    head += "".join(f"<th>perplexity {b}</th>" for b in _band_labels(first.get("band_edges", [])))
    rows = []
    for name in names:
        grid = grids_by_name[name]
        cells = "".join(f"<td>{a:.0%}</td>" for a in accuracy_by_length(grid))
        cells += "".join(f"<td>{p:.1f}</td>" for p in grid.get("band_perplexity", []))
        rows.append(f"<tr><td><b>{html.escape(name)}</b></td>{cells}</tr>")
    return (f"<div class='retrieval-readout'><table><tr><th>retrieval at length</th>{head}</tr>{''.join(rows)}"
            f"</table><div>{_beyond_line(grids_by_name, names, trained_len)}</div></div>")


def plot_heatmap(ax: Axes, grid: Mapping, trained_len: int) -> AxesImage:
    """Accuracy (len(lengths), len(depths)) as a 0..1 heatmap, each cell's percentage written in it, a dashed line
    above the first length past `trained_len`. Returns the image (for a colour bar)."""
    acc, lengths, depths = grid["accuracy"], grid["lengths"], grid["depths"]
    im = ax.imshow(acc, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for i, row in enumerate(acc):
        for j, a in enumerate(row):
            ax.text(j, i, f"{a:.0%}", ha="center", va="center", fontsize=7, color="black" if a > 0.6 else "white")
    ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_yticks(range(len(lengths)), [f"{n:,}" for n in lengths])
    inside = sum(n <= trained_len for n in lengths)
    if inside < len(lengths):
        ax.axhline(inside - 0.5, color="red", ls="--", lw=1.5)
        marker = ax.secondary_yaxis("right")
        marker.set_yticks([inside - 0.5], ["trained length"], fontsize=7, color="red")
        marker.tick_params(length=0)
    ax.set_xlabel("depth of the needle (0: start, 1: just before the question)", fontsize=8)
    ax.set_title(f"{grid['policy']} ({grid.get('kind', 'retrieval')})", fontsize=9)
    return im


def plot_band_perplexity(ax: Axes, grids: Sequence[Mapping], trained_len: int) -> None:
    """Perplexity per band of positions (log axis), one line per grid, a dotted line where `trained_len` falls."""
    edges = grids[0].get("band_edges", [])
    if len(edges) < 2:
        raise ValueError("these grids store no band perplexity")
    for grid in grids:
        ax.plot(range(len(edges) - 1), grid["band_perplexity"], marker="o", label=grid["policy"])
    ax.set_xticks(range(len(edges) - 1), _band_labels(edges), fontsize=7)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter())                      # 20, 100 rather than 2 x 10^1 (mathtext)
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    for j, (a, b) in enumerate(zip(edges[:-1], edges[1:])):     # bands are drawn at 0, 1, ...: their edges at j +- 0.5
        if a <= trained_len <= b:
            x = j - 0.5 + (trained_len - a) / (b - a)
            ax.axvline(x, color="grey", ls=":", lw=1)
            marker = ax.secondary_xaxis("top")
            marker.set_xticks([x], ["trained length"], fontsize=7, color="grey")
            break
    ax.set_xlabel("band of positions (the longest texts)")
    ax.set_ylabel("perplexity")
    ax.legend(fontsize=7)


class RetrievalView(FigureView):
    """Policy, another to compare with, metric -> a table of retrieval per length and perplexity per band, and the
    heatmaps (or the perplexity curves)."""

    def __init__(self, grids: Sequence[Mapping], *, trained_len: int = 512, policy: str | None = None,
                 compare: str | None = None) -> None:
        super().__init__()
        self.grids = grids_by_policy(grids)
        self.trained_len = trained_len
        names = list(self.grids)
        for chosen in (policy, compare):
            if chosen not in (None, NO_COMPARE, *names):
                raise ValueError(f"unknown policy {chosen!r}; the grids have {names}")
        self.policy = W.Dropdown(options=names, value=policy or names[0], description="policy")
        self.compare = W.Dropdown(options=[NO_COMPARE, *names], value=compare or NO_COMPARE, description="compare with")
        self.metric = W.ToggleButtons(options=METRICS, value=METRICS[0], description="metric")
        self.widget = W.VBox([W.HBox([self.policy, self.compare]), self.metric, self.error, self.readout, self.image])
        self._watch(self.policy, self.compare, self.metric)
        self.update()

    def shown(self) -> list[str]:
        """The policies shown: the chosen one, then the one compared with (if another)."""
        other = self.compare.value
        return [self.policy.value] + ([other] if other not in (NO_COMPARE, self.policy.value) else [])

    def _compute(self) -> tuple[str, Figure]:
        names = self.shown()
        text = readout_table(self.grids, names, self.trained_len)
        if self.metric.value == "perplexity":
            fig = Figure(figsize=(6.5, 3), layout="constrained")
            plot_band_perplexity(fig.subplots(), [self.grids[n] for n in names], self.trained_len)
            return text, fig
        fig = Figure(figsize=(4.5 * len(names) + 1, 3.2), layout="constrained")
        axes = fig.subplots(1, len(names), squeeze=False, sharey=True)[0]
        for ax, name in zip(axes, names):
            im = plot_heatmap(ax, self.grids[name], self.trained_len)
        axes[0].set_ylabel("total length (tokens)")
        fig.colorbar(im, ax=list(axes), label="needles found", format=lambda v, _pos: f"{v:.0%}")
        return text, fig
