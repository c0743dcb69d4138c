"""Lab 12's timeline view without a browser: its rows follow Exercise 1's rule, and the view's readout states both
loops' time between tokens and which side sets the overlapped pace."""

from __future__ import annotations

import pytest

from minigpt.teaching.timeline_view import TimelineView, timeline_rows


def test_rows_follow_the_step_timeline():
    rows = timeline_rows(4.0, 1.0, 0.5, steps=3)
    assert rows["serial"]["model"] == [(1.0, 5.0), (6.0, 10.0), (11.0, 15.0)]
    assert rows["serial"]["cpu"] == [(0.0, 1.0), (5.0, 6.0), (10.0, 11.0)]
    assert rows["overlapped"]["model"] == [(1.5, 5.5), (6.0, 10.0), (10.5, 14.5)]
    assert rows["overlapped"]["cpu"] == [(0.0, 1.0), (1.5, 2.5), (6.0, 7.0)]          # beside the step before
    assert rows["serial"]["itl_ms"] == pytest.approx(5.0) and rows["overlapped"]["itl_ms"] == pytest.approx(4.5)


def test_the_readout_names_the_pace_and_the_preset_moves_the_sliders():
    view = TimelineView(model_ms=8.0, cpu_ms=0.4, handoff_ms=0.12)
    assert "serial 8.40 ms, overlapped 8.12 ms" in view.readout.value and "model" in view.readout.value
    view.preset.value = "an H100, Llama-3.2-1B, batch 1"
    assert (view.model.value, view.cpu.value, view.handoff.value) == (0.74, 0.9, 0.05)
    assert "1.73x" in view.readout.value and "CPU" in view.readout.value
