"""FigureView, the plumbing of the course's figure widgets: one redraw per state, text and figure sent together,
sliders that redraw when let go, drawn states kept (issue 40 item 8)."""

from __future__ import annotations

import ipywidgets as W
import pytest
from matplotlib.figure import Figure

from minigpt.teaching import figure_view
from minigpt.teaching.figure_view import FigureView
from minigpt.teaching.flash_stepper import OnlineSoftmaxStepper
from minigpt.teaching.widgets import KVCacheCalculator, RooflineCalculator


class Squares(FigureView):
    def __init__(self) -> None:
        super().__init__()
        self.n = W.IntSlider(value=2, min=1, max=9, description="n")
        self.double = W.Checkbox(value=False, description="double")
        self.widget = W.VBox([self.n, self.double, self.error, self.readout, self.image])
        self.computed: list[tuple[int, bool]] = []
        self._watch(self.n, self.double)
        self.update()

    def _compute(self) -> tuple[str, Figure]:
        if self.n.value == 9:
            raise ValueError("n = 9 is not allowed")
        self.computed.append((self.n.value, self.double.value))
        fig = Figure(figsize=(2, 1))
        fig.subplots().plot([0, 1], [0, self.n.value * (2 if self.double.value else 1)])
        return f"n = {self.n.value}", fig


def _events(view: FigureView, monkeypatch) -> list[str]:
    """What happens, in order: 'render' (a figure drawn to PNG), 'text' and 'image' (a widget value changed)."""
    log: list[str] = []
    real = figure_view.render_figure
    monkeypatch.setattr(figure_view, "render_figure", lambda fig: (log.append("render"), real(fig))[1])
    view.readout.observe(lambda _c: log.append("text"), names="value")
    view.image.observe(lambda _c: log.append("image"), names="value")
    return log


def test_the_figure_is_rendered_before_the_text_changes(monkeypatch):
    view = Squares()
    log = _events(view, monkeypatch)
    view.n.value = 3
    assert log == ["render", "text", "image"], "render first, then text and picture together (never text, render)"


def test_one_state_is_drawn_once_and_a_state_seen_before_comes_from_the_cache():
    view = Squares()
    view.n.value = 3
    view.update()                                  # the same state again (as when one control moves another)
    view.n.value = 2                               # back to the first state
    assert view.computed == [(2, False), (3, False)]
    assert view.readout.value == "n = 2"


def test_the_cache_is_bounded():
    view = Squares()
    view.CACHE = 2
    for n in (3, 4, 5, 2):
        view.n.value = n
    assert view.computed == [(2, False), (3, False), (4, False), (5, False), (2, False)]


def test_an_error_is_shown_not_cached_and_cleared_by_the_next_state():
    view = Squares()
    view.n.value = 9
    assert "n = 9 is not allowed" in view.error.value and view.readout.value == "n = 2"
    view.n.value = 4
    assert view.error.value == "" and view.readout.value == "n = 4"


def test_sliders_redraw_when_let_go_and_labels_are_whole():
    view = Squares()
    assert view.n.continuous_update is False
    assert view.n.style.description_width == "initial"


@pytest.mark.parametrize("make", [KVCacheCalculator, RooflineCalculator, OnlineSoftmaxStepper])
def test_the_course_widgets_draw_each_state_once(make, monkeypatch):
    view = make()
    if isinstance(view, RooflineCalculator):
        view.precision.value = "fp8"
    log = _events(view, monkeypatch)
    if isinstance(view, RooflineCalculator):
        view.gpu.value = "A100-SXM-80GB"           # no fp8 there: the precision moves too, still one redraw
    elif isinstance(view, KVCacheCalculator):
        view.batch.value = 16
    else:
        view.block.value = 12                      # shrinks the step's range (clamping it): one redraw
    assert log == ["render", "text", "image"], log
    if isinstance(view, RooflineCalculator):
        assert view.precision.value == "bf16" and "A100" in view.readout.value
