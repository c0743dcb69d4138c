"""A radix-tree prefix cache, request by request (lab 13): what a trace's requests find, keep and push out.

    from minigpt.teaching.radix_view import RadixView
    RadixView(pool_blocks=48, host_blocks=0)       # the seeded conversation trace; shows itself as a cell's last value

The requests of a Mooncake-format trace (`minigpt.serving.trace.conversation_trace` unless given) arrive one per
click of "Next request" ("Run to end" serves the rest), replayed by `minigpt.cache.trace_replay.TraceReplay` with a
`RadixCache` over a GPU pool of one-id blocks and, when its slider is above 0, a host tier of evicted blocks. Moving
a slider replays the requests seen so far with the new sizes (same trace, same point); "Reset" goes back to none.

The view shows the tree (one line per edge: its blocks, their first hash ids, how many requests hold them, the
tree's clock when last matched or inserted; the last request's path marked, the leaf LRU eviction takes next named),
the pool and the host tier, the counters so far (blocks hit in the pool, loaded from the host tier, computed, and
the hit rate: after the last request, `replay_trace`'s result) and what the last request met. `radix_html` is the
pure function behind it (tested without a browser).
"""

from __future__ import annotations

import html
from typing import Sequence

import ipywidgets as W

from minigpt.cache.radix_cache import RadixNode
from minigpt.cache.trace_replay import StepOutcome, TraceReplay
from minigpt.serving.trace import TraceRecord, conversation_trace

__all__ = ["radix_html", "RadixView"]

SHOWN_IDS = 4                       # hash ids shown per edge
SHOWN_HOST = 8                      # host-tier entries shown, most recent first
COLOURS = {"held": "#c8f7c5", "free": "#eeeeee", "path": "#1f5fa8"}


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _ids(ids: Sequence[int]) -> str:
    shown = " ".join(f"#{i}" for i in ids[:SHOWN_IDS])
    return shown + (f" … #{ids[-1]}" if len(ids) > SHOWN_IDS else "")


def _holders(replay: TraceReplay, node: RadixNode) -> str:
    """Requests holding the edge's blocks (the tree's own reference left out); they never grow down an edge."""
    held = [replay.pool.ref_counts[b] - 1 for b in node.blocks]
    if max(held) == 0:
        return "unreferenced"
    if held[0] == held[-1]:
        return f"held by {_n(held[0], 'request')}"
    return f"held by {held[0]}…{held[-1]} requests"


def _next_victim(replay: TraceReplay) -> RadixNode | None:
    """The leaf `RadixCache.evict` would take a block from first: unreferenced, least recently used."""
    leaves = [n for n in replay.tree.nodes() if not n.children and replay.pool.ref_counts[n.blocks[-1]] == 1]
    return min(leaves, key=lambda n: n.last_used, default=None)


def _tree_html(replay: TraceReplay, path_ids: tuple[int, ...]) -> str:
    victim = _next_victim(replay)

    def edge(node: RadixNode, depth: int) -> str:
        ids = node.tokens
        on_path = path_ids[depth:depth + len(ids)] == ids
        state = _holders(replay, node)
        colour = COLOURS["free" if state == "unreferenced" else "held"]
        border = f"2px solid {COLOURS['path']}" if on_path else "1px solid #bbb"
        label = (f"<b>{_n(len(node.blocks), 'block')}</b> {html.escape(_ids(ids))} · {state} · "
                 f"last used {node.last_used}" + (" · <b>next to evict</b>" if node is victim else ""))
        below = sorted(node.children.items())
        inner = "".join(edge(child, depth + len(ids)) for _, child in below)
        return (f"<li><span style='background:{colour};border:{border};padding:0 4px;border-radius:3px'>{label}"
                f"</span>{f'<ul>{inner}</ul>' if inner else ''}</li>")

    edges = "".join(edge(child, 0) for _, child in sorted(replay.tree.root.children.items()))
    return (f"<ul style='margin:0;padding-left:1.2em;font-family:monospace;font-size:12px'>"
            f"<li>root<ul>{edges}</ul></li></ul>" if edges else "<i>the tree is empty</i>")


def _outcome_html(last: StepOutcome | None, index: int) -> str:
    if last is None:
        return "no request yet: press <b>Next request</b>"
    r = last.record
    head = (f"<b>request {index}</b> arrived at {r.timestamp / 1000:.3f} s: {_n(len(r.hash_ids), 'prompt block')}, "
            f"{_n(r.output_length, 'output token')}")
    released = (f"; {_n(last.released, 'earlier request')} had finished and released "
                f"{'its' if last.released == 1 else 'their'} blocks" if last.released else "")
    evicted = f"; {_n(last.evicted, 'cached block')} evicted to make room" if last.evicted else ""
    if last.refused:
        return (f"{head}{released}{evicted}. <b style='color:#b00'>refused</b>: the pool could not give it the blocks "
                f"beyond its cached prefix even after evicting every unreferenced one (counted, not queued)")
    return (f"{head}{released}{evicted}. <b>{last.gpu_hits}</b> hit in the GPU pool, <b>{last.host_hits}</b> loaded "
            f"from the host tier, <b>{last.computed}</b> computed")


def radix_html(replay: TraceReplay, done: int, total: int, last: StepOutcome | None) -> str:
    """The view's HTML for a "radix" `replay` after `done` of `total` requests, `last` the outcome of the last one
    (None before any). Reads the replay, changes nothing."""
    res, pool, host = replay.result, replay.pool, replay.host
    in_tree = sum(len(n.blocks) for n in replay.tree.nodes())
    held = sum(c >= 2 for c in pool.ref_counts)
    hit = "n/a" if not res.blocks else f"{res.hit_rate:.1%}"
    counters = (f"<b>requests so far: {done} of {total}</b> ({res.refused} refused) · prompt blocks {res.blocks}: "
                f"<b>{res.gpu_hits}</b> hit in the GPU pool, <b>{res.host_hits}</b> hit in the host tier, "
                f"<b>{res.computed}</b> computed · <b>hit rate so far {hit}</b>")
    pool_line = (f"GPU pool: {pool.num_blocks} blocks: {in_tree} cached in the tree ({held} held by the "
                 f"{_n(len(replay.running), 'running request')}, {in_tree - held} unreferenced, evictable), "
                 f"{pool.num_free} free; {replay.evicted} evicted so far")
    if host.capacity:
        recent = [f"#{key[-1]} at depth {len(key)}" for key in reversed(host.keys)][:SHOWN_HOST]
        more = " …" if len(host.keys) > SHOWN_HOST else ""
        host_line = (f"host tier: {len(host.keys)} of {host.capacity} blocks"
                     + (f"; most recent: {html.escape(', '.join(recent))}{more}" if recent else ""))
    else:
        host_line = "host tier: none (an evicted block is lost: computed again if asked for)"
    path = last.record.hash_ids if last is not None and not last.refused else ()
    tree = (f"<div style='max-height:420px;overflow:auto;border:1px solid #ddd;padding:4px'>"
            f"{_tree_html(replay, tuple(path))}</div>")
    legend = ("<small>an edge: its blocks (one per hash id, the first ids shown), the requests holding them (green: "
              "held; grey: only the tree holds them, evictable from a leaf), and the tree's clock when it was last "
              "matched or inserted (eviction takes the unreferenced leaf used longest ago). Blue border: the last "
              "request's prompt. The host tier names a block by its hash id and its depth in the prompt.</small>")
    return (f"<div>{counters}<br>{_outcome_html(last, done)}<br>{pool_line}<br>{host_line}"
            f"{tree}{legend}</div>")


class RadixView:
    """Next request / Run to end / Reset over one trace replayed against a radix cache; sliders for the pool's and the
    host tier's blocks."""

    def __init__(self, records: Sequence[TraceRecord] | None = None, *, pool_blocks: int = 48, host_blocks: int = 0,
                 ms_per_token: float = 20.0) -> None:
        """records: a trace (`conversation_trace(0)`, 75 requests, unless given). pool_blocks, host_blocks: the
        sliders' first values (host_blocks 0: no host tier). ms_per_token: how long a request holds its blocks."""
        self.records = list(records) if records is not None else conversation_trace(0)
        self.ms_per_token = ms_per_token
        whole = {"style": {"description_width": "initial"}, "continuous_update": False}
        self.pool_blocks = W.IntSlider(value=pool_blocks, min=min(4, pool_blocks), max=max(256, pool_blocks),
                                       description="GPU pool (blocks)", **whole)
        self.host_blocks = W.IntSlider(value=host_blocks, min=0, max=max(256, host_blocks),
                                       description="host tier (blocks, 0 = none)", **whole)
        self.next_button = W.Button(description="Next request", button_style="primary")
        self.run_button = W.Button(description="Run to end")
        self.reset_button = W.Button(description="Reset")
        self.view = W.HTML()
        self.next_button.on_click(lambda _: self.next_request())
        self.run_button.on_click(lambda _: self.run_to_end())
        self.reset_button.on_click(lambda _: self.reset())
        for slider in (self.pool_blocks, self.host_blocks):
            slider.observe(lambda _change: self._replay(self.done), names="value")
        self.widget = W.VBox([W.HBox([self.next_button, self.run_button, self.reset_button]),
                              W.HBox([self.pool_blocks, self.host_blocks]), self.view])
        self.reset()

    # queries

    @property
    def finished(self) -> bool:
        return self.done == len(self.records)

    def html(self) -> str:
        return radix_html(self.replay, self.done, len(self.records), self.last)

    # changes

    def reset(self) -> None:
        """Back to no request, with the sizes the sliders show."""
        self._replay(0)

    def next_request(self) -> None:
        """Serve the next request (nothing once the trace is done)."""
        if not self.finished:
            self.last = self.replay.step(self.records[self.done])
            self.done += 1
        self._render()

    def run_to_end(self) -> None:
        while not self.finished:
            self.last = self.replay.step(self.records[self.done])
            self.done += 1
        self._render()

    def _replay(self, upto: int) -> None:
        """A fresh replay with the sliders' sizes, through the first `upto` requests."""
        self.replay = TraceReplay("radix", self.pool_blocks.value, ms_per_token=self.ms_per_token,
                                  host_blocks=self.host_blocks.value)
        self.done, self.last = 0, None
        for r in self.records[:upto]:
            self.last = self.replay.step(r)
            self.done += 1
        self._render()

    def _render(self) -> None:
        self.view.value = self.html()
        self.next_button.disabled = self.run_button.disabled = self.finished

    def _repr_mimebundle_(self, **kwargs):  # display the widget when the object is a cell's last expression
        return self.widget._repr_mimebundle_(**kwargs)
