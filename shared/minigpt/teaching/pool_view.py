"""An interactive view of the paged KV-cache pool (lab 02), driven by the reference `BlockManager`.

    from minigpt.teaching.pool_view import PoolView
    PoolView()                 # shows itself as the last expression of a cell

Controls: block size, number of live sequences, shared (system-prompt) prefix length. The scenario is
fixed and seeded: one earlier request with another prompt ran and finished (its full blocks stay
cached in the free queue), then the live sequences arrive, each the shared prefix plus its own
suffix, with prefix caching on. The grid shows every physical block: the sequence that holds it (a
colour), shared blocks (held by several sequences, with their ref count), cached free blocks, and
free ones; the readout counts them and the slots allocated but unused (internal waste).
`pool_layout` is the pure function behind it (tested without a browser).
"""

from __future__ import annotations

import html
import random
from dataclasses import dataclass

import ipywidgets as W

from minigpt.cache.block_manager import BlockManager
from minigpt.cache.block_pool import OutOfBlocks

__all__ = ["PoolLayout", "pool_layout", "render_pool", "PoolView"]

POOL_TOKENS = 2048                  # the pool's capacity in token slots, whatever the block size
COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f"]


@dataclass
class PoolLayout:
    block_size: int
    owners: list[list[int]]          # per physical block: the live sequences holding it
    cached_free: list[bool]          # per physical block: free but still findable by its hash
    seq_tokens: list[int]            # tokens of each live sequence
    seq_cached: list[int]            # prompt tokens each found in the prefix cache
    waste: int                       # slots allocated to live sequences but unused

    @property
    def num_blocks(self) -> int:
        return len(self.owners)


def pool_layout(block_size: int, num_seqs: int, shared_len: int, *, seed: int = 0) -> PoolLayout:
    """Run the scenario on a pool of POOL_TOKENS slots (sequences that do not fit are left out)."""
    rng = random.Random(seed)
    m = BlockManager(max(POOL_TOKENS // block_size, 1), block_size, enable_prefix_caching=True)
    old = [rng.randrange(1000, 2000) for _ in range(96)]
    m.add_sequence("old", old)
    m.free("old")
    shared = [rng.randrange(0, 1000) for _ in range(shared_len)]
    suffix_lens = [rng.choice([12, 20, 33, 47, 61, 75, 90, 110]) for _ in range(8)]
    cached = []
    for i in range(num_seqs):
        try:
            r = m.add_sequence(i, shared + [rng.randrange(2000, 3000) for _ in range(suffix_lens[i])])
        except OutOfBlocks:
            break
        cached.append(r.num_cached)
    num_seqs = len(cached)
    owners: list[list[int]] = [[] for _ in range(m.pool.num_blocks)]
    for i in range(num_seqs):
        for b in m.table(i).blocks:
            owners[b].append(i)
    cached_free = [m.pool.ref_counts[b] == 0 and m.prefix_cache.is_cached(b) for b in range(m.pool.num_blocks)]
    tokens = [m.num_tokens(i) for i in range(num_seqs)]
    held = {b for i in range(num_seqs) for b in m.table(i).blocks}
    waste = len(held) * block_size - len({(b, o) for i in range(num_seqs) for p in range(tokens[i])
                                          for b, o in [divmod(m.table(i).slot(p), block_size)]})
    return PoolLayout(block_size, owners, cached_free, tokens, cached, waste)


def render_pool(layout: PoolLayout) -> str:
    """HTML: a readout and a grid of the physical blocks."""
    used = sum(1 for o in layout.owners if o)
    shared = sum(1 for o in layout.owners if len(o) > 1)
    cached = sum(layout.cached_free)
    free = layout.num_blocks - used
    cell = max(6, min(28, 640 // max(16, int(layout.num_blocks ** 0.5) * 2)))
    squares = []
    for b, (o, c) in enumerate(zip(layout.owners, layout.cached_free)):
        if len(o) > 1:
            style, label, tip = "background:#333;color:#fff", str(len(o)), f"block {b}: shared by sequences {o}"
        elif o:
            style, label, tip = f"background:{COLOURS[o[0] % len(COLOURS)]}", "", f"block {b}: sequence {o[0]}"
        elif c:
            style, label, tip = "background:#ccc", "c", f"block {b}: free, cached (reusable until evicted)"
        else:
            style, label, tip = "background:#fff", "", f"block {b}: free"
        squares.append(f"<div title='{html.escape(tip)}' style='{style};width:{cell}px;height:{cell}px;"
                       f"border:1px solid #999;font-size:{max(cell // 2, 6)}px;text-align:center;"
                       f"line-height:{cell}px;overflow:hidden'>{label}</div>")
    seqs = ", ".join(f"seq {i}: {n} tokens ({c} from cache)" for i, (n, c) in
                     enumerate(zip(layout.seq_tokens, layout.seq_cached)))
    readout = (f"<b>pool view</b>: {layout.num_blocks} blocks of {layout.block_size} tokens; "
               f"{used} blocks used, {shared} shared, {cached} cached free, {free - cached} free never cached; "
               f"internal waste {layout.waste} slots ({layout.waste / max(len(layout.seq_tokens), 1):.1f} per sequence)"
               f"<br><small>{html.escape(seqs)}</small>")
    grid = f"<div style='display:flex;flex-wrap:wrap;gap:1px;max-width:680px'>{''.join(squares)}</div>"
    legend = ("<small>colour: the sequence holding the block; dark with a number: shared by that many sequences; "
              "grey 'c': free but cached; white: free</small>")
    return readout + grid + legend


class PoolView:
    """Sliders -> `pool_layout` -> `render_pool` into an HTML widget."""

    def __init__(self, *, block_size: int = 16, num_seqs: int = 4, shared_len: int = 64) -> None:
        whole = {"style": {"description_width": "initial"}}          # labels never cut ("shared pr...")
        self.block_size = W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128], value=block_size,
                                            description="block size", **whole)
        self.num_seqs = W.IntSlider(value=num_seqs, min=1, max=8, description="sequences", **whole)
        self.shared_len = W.IntSlider(value=shared_len, min=0, max=256, step=16, description="shared prefix", **whole)
        self.view = W.HTML()
        for c in (self.block_size, self.num_seqs, self.shared_len):
            c.observe(lambda _change: self.update(), names="value")
        self.widget = W.VBox([W.HBox([self.block_size, self.num_seqs, self.shared_len]), self.view])
        self.update()

    def update(self) -> None:
        layout = pool_layout(self.block_size.value, self.num_seqs.value, self.shared_len.value)
        self.view.value = render_pool(layout)

    def _repr_mimebundle_(self, **kwargs):   # display the widget when the object is a cell's last expression
        return self.widget._repr_mimebundle_(**kwargs)
