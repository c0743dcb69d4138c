"""Lab 11's goodput view without a browser: the readout's numbers are the simulator's, every control changes the
readout and the figure, the split stays within the GPUs, and an impossible split is refused."""

from __future__ import annotations

import pytest

from minigpt.disagg import goodput_sim as gs
from minigpt.teaching.goodput_view import GoodputView, goodput_readout, requests_for


@pytest.fixture(scope="module")
def view() -> GoodputView:
    return GoodputView(rate=10.0, prompt_len=4096, output_len=128, n_gpus=4, prefill_gpus=3)


def test_the_readout_reports_the_simulated_goodput_at_the_chosen_rate():
    text, fig, data = goodput_readout(10.0, 4096, 128, 4, 3)
    wl = gs.make_workload(requests_for(4), 40.0, prompt_len=4096, output_len=128, seed=0)
    co = gs.goodput(gs.simulate_colocated(wl, 4), per_gpu=True)
    dis = gs.goodput(gs.simulate_disaggregated(wl, 3, 1), per_gpu=True)
    i = data.rates.index(10.0)
    assert (data.colocated[i], data.disaggregated[i]) == (co, dis)
    assert dis > co and data.winner(10.0) == "disaggregated"
    assert f"<b>disaggregated</b> (3 prefill + 1 decode) wins: {dis:.2f} against {co:.2f}" in text, text
    assert "TTFT &le; 1 s and TPOT &le; 20 ms" in text and "<b>disaggregated (3 + 1)</b>" in text, text
    assert f"Best split at this rate: {data.best.prefill_gpus} + {data.best.decode_gpus}" in text
    assert len(fig.axes) == 3


def test_a_light_load_is_called_a_tie():
    text, _, data = goodput_readout(2.0, 1024, 128, 4, 2)
    assert data.winner(2.0) == "tie" and "a <b>tie</b>: both serve 2.00 req/s per GPU" in text, text


def test_the_view_starts_on_its_arguments(view):
    assert view.error.value == "" and "class='goodput-readout'" in view.readout.value
    assert "At 10 req/s per GPU (40 req/s on 4 GPUs)" in view.readout.value
    assert view.image.value[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("control, value, expect", [
    ("rate", 6.0, "At 6 req/s per GPU (24 req/s on 4 GPUs)"),
    ("prompt_len", 1024, "prompts of 1,024 tokens"),
    ("output_len", 256, "256 output tokens"),
    ("prefill_gpus", 2, "<b>disaggregated (2 + 2)</b>"),
    ("ttft_limit", 0.5, "TTFT &le; 0.5 s"),
    ("itl_limit", 50, "TPOT &le; 50 ms"),
    ("n_gpus", 6, "on 6 x H100-SXM"),
    ("chunk", 512, "colocated with chunked prefill, 512 tokens a step"),
])
def test_every_control_changes_the_readout_and_the_figure(view, control, value, expect):
    before_text, before_png = view.readout.value, view.image.value
    old = getattr(view, control).value
    getattr(view, control).value = value
    try:
        assert expect in view.readout.value, view.readout.value
        assert view.readout.value != before_text and view.image.value != before_png
    finally:
        getattr(view, control).value = old
    assert view.readout.value == before_text, "going back should show the first state again"


def test_fewer_gpus_clamp_the_split():
    view = GoodputView(rate=4.0, prompt_len=1024, n_gpus=6, prefill_gpus=5)
    view.n_gpus.value = 3
    assert view.prefill_gpus.max == 2 and view.prefill_gpus.value == 2
    assert "<b>disaggregated (2 + 1)</b>" in view.readout.value and view.error.value == ""


def test_an_impossible_split_is_refused():
    with pytest.raises(ValueError, match="1 <= prefill GPUs < GPUs"):
        goodput_readout(4.0, 1024, 128, 4, 4)


def test_the_chunk_control_sets_the_colocated_baseline():
    view = GoodputView(rate=10.0, prompt_len=4096, chunked_prefill=512)
    assert view.chunk.value == 512 and "colocated with chunked prefill, 512 tokens a step" in view.readout.value
    wl = gs.make_workload(requests_for(4), 40.0, prompt_len=4096, output_len=128, seed=0)
    chunked = gs.goodput(gs.simulate_colocated(wl, 4, gs.SimConfig(chunked_prefill=512)), per_gpu=True)
    assert f"{chunked:.2f}" in view.readout.value, view.readout.value
