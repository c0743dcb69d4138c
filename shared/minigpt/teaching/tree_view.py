"""A token-tree view (lab 06, part two): step through the rounds of speculative decoding with the draft head, one
drafted tree at a time.

    from minigpt.teaching.tree_view import TreeView
    TreeView("def main():\n    ", depth=3, width=2, branch=2)     # the course target and head; shows itself

Each round draws the tree the head drafted below the root (the context's last token): a node per token, labelled
with its text, an edge from each parent to its children (likeliest child on top). Green: the path the target
accepted; red: children the walk checked and turned down; grey: nodes never reached; last, joined by a dashed edge,
the token the target adds where the walk stopped (amber: it replaces the children turned down; blue: a bonus
after a leaf). The readout gives the round's numbers (nodes verified in the one target forward, drafts accepted,
tokens emitted) and the running tokens per round. Controls: "Next round", "Reset", and the tree's shape (depth,
width, branch: a new shape starts over).

The rounds come from `minigpt.engine.head_speculative.head_rounds` (greedy), the loop `generate_with_head` runs;
`node_status`, `tree_layout` and `round_html` are pure functions behind the view, tested without a browser.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable, Sequence

import ipywidgets as W
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minigpt.engine.draft_head import DraftHead
from minigpt.engine.head_speculative import TreeRound, TreeShape, head_rounds
from minigpt.model import GPT
from minigpt.teaching.figure_view import FigureView

__all__ = ["node_status", "tree_layout", "draw_tree", "RunningTotals",
           "running_totals", "round_html", "TreeView", "NODE_COLORS"]

NODE_COLORS = {"root": "#dddddd", "accepted": "#c8f7c5", "rejected": "#f7c5c5", "not checked": "#f4f4f4",
               "correction": "#fde9a9", "bonus": "#c5dcf7"}
ACCEPTED_EDGE = "#2e8b3a"


def node_status(parents: Sequence[int], path: Sequence[int]) -> list[str]:
    """Per node: "root", "accepted" (on the path), "rejected" (a child of the root or of an accepted node that the
    greedy walk compared with the target's token and turned down), or "not checked" (below a node not accepted)."""
    on_path = set(path)
    visited = {0} | on_path
    return ["root" if i == 0 else "accepted" if i in on_path else "rejected" if parent in visited else "not checked"
            for i, parent in enumerate(parents)]


def tree_layout(parents: Sequence[int]) -> list[tuple[float, float]]:
    """(x, y) per node: x its depth; y from the top, the leaves 0, 1, 2, ... in depth-first order (children in
    node order), each parent level with the middle of its children."""
    children: list[list[int]] = [[] for _ in parents]
    for i, parent in enumerate(parents[1:], 1):
        children[parent].append(i)
    xy: list[tuple[float, float]] = [(0.0, 0.0)] * len(parents)
    next_leaf = 0

    def place(node: int, depth: int) -> float:
        nonlocal next_leaf
        if children[node]:
            ys = [place(c, depth + 1) for c in children[node]]
            y = (ys[0] + ys[-1]) / 2
        else:
            y, next_leaf = float(next_leaf), next_leaf + 1
        xy[node] = (float(depth), y)
        return y

    place(0, 0)
    return xy


def _with_extra(r: TreeRound) -> list[int]:
    """The tree's parents with one more node, the target's extra token, below the last accepted node (or the root)."""
    return list(r.parents) + [r.path[-1] if r.path else 0]


def _label(decode: Callable[[list[int]], str], token: int) -> str:
    return repr(decode([token]))


def draw_tree(ax: Axes, r: TreeRound, decode: Callable[[list[int]], str], fontsize: float = 9) -> None:
    """The round's tree on `ax`: the drafted nodes coloured by `node_status`, then the target's extra token joined
    to the last accepted node (or the root) by a dashed edge."""
    status = node_status(r.parents, r.path)
    last = r.path[-1] if r.path else 0
    bonus = last not in r.parents[1:]           # the walk ended at a leaf: no child was turned down
    parents, tokens = _with_extra(r), list(r.tokens) + [r.extra]
    status.append("bonus" if bonus else "correction")
    xy = tree_layout(parents)
    accepted = set(r.path)
    for i in range(1, len(parents)):
        (x0, y0), (x1, y1) = xy[parents[i]], xy[i]
        extra = i == len(parents) - 1
        good = i in accepted or extra
        ax.plot([x0, x1], [y0, y1], color=ACCEPTED_EDGE if good else "#aaaaaa", lw=2.2 if good else 1.0,
                ls="--" if extra else "-", zorder=1)
    for i, (x, y) in enumerate(xy):
        edge = ACCEPTED_EDGE if status[i] in ("accepted", "root") else "#777777"
        ax.text(x, y, _label(decode, tokens[i]), ha="center", va="center", fontsize=fontsize, family="monospace",
                parse_math=False, zorder=2,
                bbox={"boxstyle": "round,pad=0.3", "fc": NODE_COLORS[status[i]], "ec": edge,
                      "lw": 1.5 if status[i] in ("accepted", "root") else 0.8})
    ys = [y for _, y in xy]
    ax.set_xlim(-0.6, max(x for x, _ in xy) + 0.6)
    ax.set_ylim(max(ys) + 0.7, min(ys) - 0.7)
    levels = int(max(x for x, _ in xy))
    ax.set_xticks(range(levels + 1), ["root"] + [f"+{d}" for d in range(1, levels + 1)])
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("position after the root")
    names = {"root": "root (last token of the context)", "accepted": "accepted", "rejected": "checked, turned down",
             "not checked": "not reached", "correction": "the target's token (replaces them)",
             "bonus": "the target's bonus token"}
    shown = [s for s in names if s in status]
    ax.legend(handles=[Patch(fc=NODE_COLORS[s], ec="#777777", label=names[s]) for s in shown],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


@dataclass(frozen=True)
class RunningTotals:
    rounds: int
    tokens: int
    nodes: int                  # nodes verified, all rounds (the root included)
    accepted: int
    tokens_per_round: float


def running_totals(rounds: Sequence[TreeRound]) -> RunningTotals:
    tokens = sum(len(r.new_tokens) for r in rounds)
    return RunningTotals(len(rounds), tokens, sum(len(r.tokens) for r in rounds), sum(len(r.path) for r in rounds),
                         tokens / len(rounds) if rounds else float("nan"))


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def round_html(rounds: Sequence[TreeRound], shape: TreeShape, decode: Callable[[list[int]], str],
               text_before: str) -> str:
    """The readout for the last of `rounds`: its numbers, the running totals, and the text with its tokens marked."""
    r, totals = rounds[-1], running_totals(rounds)
    done = f" <b>(finished: {r.finish_reason})</b>" if r.finish_reason else ""
    summary = (f"<b>round {totals.rounds}</b>: the target verified <b>{_n(len(r.tokens), 'node')}</b> in one forward "
               f"(the root and {len(r.tokens) - 1} drafted), <b>{len(r.path)} accepted</b>, "
               f"<b>{_n(len(r.new_tokens), 'token')} emitted</b>{done}")
    running = (f"after {_n(totals.rounds, 'round')}: {_n(totals.tokens, 'token')}, "
               f"<b>{totals.tokens_per_round:.2f} tokens per round</b> (plain decoding: 1.00); "
               f"{totals.accepted} of {totals.nodes - totals.rounds} drafted nodes accepted; accepted per round: "
               f"{', '.join(str(len(x.path)) for x in rounds[-12:])}{' ...' if len(rounds) > 12 else ''}")
    shape_line = (f"tree: depth {shape.depth}, width {shape.width}, branch {shape.branch} (levels below the root, "
                  f"nodes expanded a level, children a node expanded): at most {shape.nodes} nodes a round")
    text = (f"<pre style='white-space:pre-wrap'>{html.escape(text_before)}"
            f"<span style='background:{NODE_COLORS['accepted']}'>{html.escape(decode(r.new_tokens))}</span></pre>")
    return f"<div>{summary}<br>{running}<br>{shape_line}{text}</div>"


class TreeView(FigureView):
    """Next round / Reset over one greedy generation with the head's trees; sliders for the tree's shape."""

    def __init__(self, prompt: str | Sequence[int], *, depth: int = 3, width: int = 2, branch: int = 2,
                 max_new_tokens: int = 48, target: GPT | None = None, head: DraftHead | None = None,
                 tokenizer=None) -> None:
        """prompt: text (encoded with `tokenizer`) or token ids. target, head, tokenizer: the course's
        (`load_model("target")`, `load_draft_head()`, `load_tokenizer()`) unless given."""
        super().__init__()
        if target is None or head is None or tokenizer is None:
            from minigpt.checkpoint import load_model
            from minigpt.engine.draft_head import load_draft_head
            from minigpt.tokenizer import load_tokenizer
            target = target or load_model("target")
            head = head or load_draft_head()
            tokenizer = tokenizer or load_tokenizer()
        self.target, self.head, self.decode = target, head, tokenizer.decode
        self.prompt = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if max_new_tokens < 1:
            raise ValueError(f"the view steps through rounds that emit tokens: max_new_tokens must be >= 1, "
                             f"got {max_new_tokens}")
        self.max_new_tokens = max_new_tokens
        self.depth = W.IntSlider(value=depth, min=0, max=6, description="depth")
        self.width = W.IntSlider(value=width, min=1, max=4, description="width")
        self.branch = W.IntSlider(value=branch, min=1, max=4, description="branch")
        self.next_button = W.Button(description="Next round", button_style="primary")
        self.reset_button = W.Button(description="Reset")
        self.next_button.on_click(lambda _: self.next_round())
        self.reset_button.on_click(lambda _: self.reset())
        self.shape: TreeShape | None = None
        self.rounds: list[TreeRound] = []
        self.widget = W.VBox([W.HBox([self.next_button, self.reset_button]),
                              W.HBox([self.depth, self.width, self.branch]), self.error, self.readout, self.image])
        self._watch(self.depth, self.width, self.branch)
        self.update()

    # queries

    def current_shape(self) -> TreeShape:
        return TreeShape(self.depth.value, self.width.value, self.branch.value)

    @property
    def tokens(self) -> list[int]:
        """The tokens generated so far."""
        return [t for r in self.rounds for t in r.new_tokens]

    @property
    def finished(self) -> bool:
        return bool(self.rounds) and self.rounds[-1].finish_reason is not None

    # changes

    def reset(self) -> None:
        """Start over with the shape the sliders show, and show its first round."""
        self.shape = self.current_shape()
        self._run = head_rounds(self.target, self.head, self.prompt, self.max_new_tokens, shape=self.shape)
        self.rounds = [next(self._run)]
        self.update()

    def next_round(self) -> None:
        """Verify the next tree (nothing once the generation is finished)."""
        if not self.finished:
            self.rounds.append(next(self._run))
        self.update()

    def update(self) -> None:
        if self.shape != self.current_shape():      # a new shape starts over (reset() comes back here)
            self.reset()
            return
        super().update()
        self.next_button.disabled = self.finished

    def _state(self) -> tuple:
        return (*super()._state(), len(self.rounds))

    def _compute(self) -> tuple[str, Figure]:
        before = [t for r in self.rounds[:-1] for t in r.new_tokens]
        text = round_html(self.rounds, self.shape, self.decode, self.decode(self.prompt[-40:] + before))
        r = self.rounds[-1]
        xy = tree_layout(_with_extra(r))
        leaves = max(y for _, y in xy) + 1
        levels = max(x for x, _ in xy) + 2
        fig = Figure(figsize=(min(1.35 * levels + 3.2, 13.0), min(max(0.34 * leaves + 0.9, 2.0), 11.0)))
        draw_tree(fig.subplots(), r, self.decode, fontsize=9 if leaves <= 24 else 7)
        fig.tight_layout()
        return text, fig
