"""The lab 02 pool view's pure part: `pool_layout` counts what the grid shows, over the sliders' ranges."""

from __future__ import annotations

import pytest

from minigpt.teaching.pool_view import POOL_TOKENS, PoolView, pool_layout, render_pool


@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("num_seqs", [1, 8])
@pytest.mark.parametrize("shared_len", [0, 256])
def test_layout_is_consistent(block_size, num_seqs, shared_len):
    lay = pool_layout(block_size, num_seqs, shared_len)
    assert lay.num_blocks == POOL_TOKENS // block_size
    assert len(lay.seq_tokens) == num_seqs
    held = sum(len(o) for o in lay.owners)
    assert held == sum(-(-n // block_size) for n in lay.seq_tokens)          # every table's blocks, shared ones counted per holder
    assert all(not (o and c) for o, c in zip(lay.owners, lay.cached_free))  # a held block is not "cached free"
    assert 0 <= lay.waste < num_seqs * block_size
    if shared_len >= block_size and num_seqs > 1:
        assert lay.seq_cached[1:] == [shared_len // block_size * block_size] * (num_seqs - 1)
        assert any(len(o) == num_seqs for o in lay.owners)
    assert "blocks used" in render_pool(lay)


def test_view_updates_on_slider_change():
    view = PoolView(block_size=16, num_seqs=2, shared_len=64)
    before = view.view.value
    view.num_seqs.value = 5
    assert view.view.value != before and "5 sequences" not in before


def test_widget_figures_are_sharp_and_shown_at_their_size():
    """Widgets render figures at twice their size and display them at their size (never stretched)."""
    from matplotlib.figure import Figure
    import ipywidgets as W

    from minigpt.teaching.plots import png_size, show_figure

    fig = Figure(figsize=(6.5, 4))
    fig.add_subplot().plot([0, 1], [1, 0])
    image = W.Image(format="png")
    show_figure(image, fig)
    width, height = png_size(image.value)
    assert (int(image.width), int(image.height)) == (round(width / 2), round(height / 2))
    assert width > 800, "the PNG should be rendered at twice 80 dpi"


def test_pool_view_labels_are_never_cut():
    from minigpt.teaching.pool_view import PoolView

    view = PoolView()
    for slider in (view.block_size, view.num_seqs, view.shared_len):
        assert slider.style.description_width == "initial"


def test_params_slider_lands_on_the_values_it_shows():
    from minigpt.teaching.widgets import KVCacheCalculator

    calc = KVCacheCalculator()
    calc.params_b.value = 8
    assert calc.params_b.value == 8 and 8 in calc.params_b.options
