"""The plumbing every figure widget of the course shares: controls in, an HTML readout and a PNG figure out.

    class MyView(FigureView):
        def __init__(self):
            super().__init__()
            self.n = W.IntSlider(value=4, min=1, max=16, description="n")
            self.widget = W.VBox([self.n, self.error, self.readout, self.image])
            self._watch(self.n)
            self.update()

        def _compute(self) -> tuple[str, Figure]:      # the readout's HTML and the figure for the controls' state
            ...

Redrawing is the slow part (a matplotlib figure rendered to PNG: 0.1-0.5 s on a 2-core machine), so:
- a slider redraws once when its handle is let go, not at every pixel of a drag (`continuous_update=False`;
  arrow keys still step one value at a time);
- a state already drawn is not drawn again (one control changing another fires two updates for one state), and
  the last `CACHE` states drawn are kept, so going back is immediate;
- the readout and the picture change together: the figure is rendered first, then text and image are sent in
  one burst (`hold_sync`), so the text never describes a picture that is not shown yet.
"""

from __future__ import annotations

import html
from collections import OrderedDict

import ipywidgets as W
from matplotlib.figure import Figure

from minigpt.teaching.plots import RenderedFigure, render_figure, show_rendered

__all__ = ["FigureView"]


class FigureView:
    """Subclasses build controls, call `_watch(*controls)` and `update()`, and define `_compute()`."""

    CACHE = 32

    def __init__(self) -> None:
        self.readout = W.HTML()
        self.image = W.Image(format="png")
        self.error = W.HTML()
        self._controls: tuple[W.Widget, ...] = ()
        self._drawn: tuple | None = None
        self._views: OrderedDict[tuple, tuple[str, RenderedFigure]] = OrderedDict()

    def _watch(self, *controls: W.Widget) -> None:
        """Redraw when any control's value changes; labels sized to their text, never cut short."""
        self._controls = controls
        for c in controls:
            if "description_width" in getattr(getattr(c, "style", None), "keys", ()):
                c.style.description_width = "initial"
            if hasattr(c, "continuous_update"):
                c.continuous_update = False
            c.observe(lambda _change: self.update(), names="value")

    def _state(self) -> tuple:
        return tuple(repr(c.value) for c in self._controls)

    def _arrange(self) -> None:
        """Show or hide controls for the current state (before drawing); nothing by default."""

    def _compute(self) -> tuple[str, Figure]:
        raise NotImplementedError

    def update(self) -> None:
        self._arrange()
        state = self._state()
        if state == self._drawn:
            return
        view = self._views.get(state)
        if view is None:
            try:
                text, fig = self._compute()
            except (ValueError, KeyError) as err:     # e.g. a precision this GPU lacks: say so, keep the controls
                self.error.value = f"<span style='color:#b00'>{html.escape(str(err))}</span>"
                self._drawn = None
                return
            view = self._views[state] = (text, render_figure(fig))
            while len(self._views) > self.CACHE:
                self._views.popitem(last=False)
        self._views.move_to_end(state)
        with self.error.hold_sync(), self.readout.hold_sync(), self.image.hold_sync():
            self.error.value = ""
            self.readout.value = view[0]
            show_rendered(self.image, view[1])
        self._drawn = state

    def _repr_mimebundle_(self, **kwargs):  # display the widget when the object is a cell's last expression
        return self.widget._repr_mimebundle_(**kwargs)
