"""Lab 13's radix view without a browser: it steps through a trace a request at a time, its counters end where
`replay_trace` ends for the same trace and sizes, Reset and the sliders rebuild the replay, and `radix_html` shows
each edge's blocks, holders and clock, the pool, the host tier and the last request's outcome."""

from __future__ import annotations

import re

import pytest

from minigpt.cache.trace_replay import TraceReplay, replay_trace
from minigpt.serving.trace import TraceRecord, conversation_trace
from minigpt.teaching.radix_view import RadixView, radix_html

# Two prompts sharing their first two blocks: the first finishes before the second arrives, the second stays running.
FORK = [TraceRecord(0, 4, 1, (1, 2, 3, 4)), TraceRecord(100, 4, 1000, (1, 2, 5, 6))]
# A prompt evicted by another, then asked for again (tests/minigpt/test_trace_replay.py's host-tier case).
COMEBACK = [TraceRecord(0, 4, 1, (1, 2, 3, 4)), TraceRecord(100, 4, 1, (5, 6, 7, 8)),
            TraceRecord(200, 4, 1, (1, 2, 3, 4))]


def _text(markup: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", markup))


def _edge(markup: str, ids: str) -> str:
    """The markup of the tree's line whose hash ids start with `ids`."""
    lines = [line for line in markup.split("<li>") if f"</b> {ids}" in line]
    assert len(lines) == 1, f"expected one edge showing {ids!r}, found {len(lines)} in {markup}"
    return lines[0]


def test_next_request_serves_one_request_at_a_time():
    records = conversation_trace(0, sessions=6)
    view, replay = RadixView(records, pool_blocks=24), TraceReplay("radix", 24)
    assert (view.done, view.last) == (0, None) and "requests so far: 0 of" in _text(view.view.value)
    for i, r in enumerate(records[:5], 1):
        view.next_request()
        expected = replay.step(r)
        assert (view.done, view.last) == (i, expected), f"after {i} clicks: {view.last}, expected {expected}"
        assert f"requests so far: {i} of {len(records)}" in _text(view.view.value)
        assert f"request {i} arrived at {r.timestamp / 1000:.3f} s" in _text(view.view.value)


@pytest.mark.parametrize(("pool_blocks", "host_blocks"), [(16, 0), (24, 64), (48, 16), (256, 0)])
def test_after_the_last_request_the_counters_are_replay_traces(pool_blocks, host_blocks):
    records = conversation_trace(0)
    view = RadixView(records, pool_blocks=pool_blocks, host_blocks=host_blocks)
    while not view.finished:
        view.next_request()
    want = replay_trace(records, "radix", pool_blocks, host_blocks=host_blocks)
    assert view.replay.result == want, f"the view counted {view.replay.result}, replay_trace {want}"
    text = _text(view.view.value)
    for piece in (f"requests so far: {len(records)} of {len(records)} ({want.refused} refused)",
                  f"prompt blocks {want.blocks}", f"{want.gpu_hits} hit in the GPU pool",
                  f"{want.host_hits} hit in the host tier", f"{want.computed} computed",
                  f"hit rate so far {want.hit_rate:.1%}"):
        assert piece in text, f"{piece!r} missing from the counters: {text[:400]}"
    assert view.next_button.disabled and view.run_button.disabled


def test_run_to_end_is_next_request_to_the_end():
    records = conversation_trace(1, sessions=8)
    clicked, ran = RadixView(records, pool_blocks=20, host_blocks=8), RadixView(records, pool_blocks=20, host_blocks=8)
    while not clicked.finished:
        clicked.next_request()
    ran.run_to_end()
    assert ran.view.value == clicked.view.value
    clicked.next_request()                                    # past the end: nothing changes
    assert clicked.done == len(records) and clicked.view.value == ran.view.value


def test_reset_goes_back_to_no_request():
    view = RadixView(conversation_trace(0, sessions=6), pool_blocks=24)
    first = view.view.value
    for _ in range(4):
        view.next_request()
    view.reset()
    assert (view.done, view.last, view.replay.result.blocks) == (0, None, 0)
    assert view.view.value == first and not view.next_button.disabled


def test_a_slider_replays_the_requests_so_far_with_the_new_size():
    records = conversation_trace(0)
    view = RadixView(records, pool_blocks=24)
    for _ in range(30):
        view.next_request()
    view.pool_blocks.value = 64
    assert view.done == 30 and view.replay.pool.num_blocks == 64
    assert view.replay.result == replay_trace(records[:30], "radix", 64)
    assert "GPU pool: 64 blocks" in _text(view.view.value)
    view.host_blocks.value = 32
    assert view.replay.host.capacity == 32
    assert view.replay.result == replay_trace(records[:30], "radix", 64, host_blocks=32)
    assert "host tier: " in _text(view.view.value) and " of 32 blocks" in _text(view.view.value)


def test_an_edge_shows_its_blocks_holders_clock_and_the_last_path():
    replay = TraceReplay("radix", 16)
    last = [replay.step(r) for r in FORK][-1]
    markup = radix_html(replay, 2, 2, last)
    shared, old, new = _edge(markup, "#1 #2"), _edge(markup, "#3 #4"), _edge(markup, "#5 #6")
    assert "2 blocks" in shared and "held by 1 request" in shared       # the running second request holds it
    assert "unreferenced" in old and "next to evict" in old              # the first request finished
    assert "held by 1 request" in new and "next to evict" not in new
    stamps = {n.tokens: n.last_used for n in replay.tree.nodes()}
    assert f"last used {stamps[(5, 6)]}" in new and f"last used {stamps[(3, 4)]}" in old
    assert "2px solid" in shared and "2px solid" in new and "2px solid" not in old, "the last prompt's path"
    text = _text(markup)
    assert "2 hit in the GPU pool, 0 loaded from the host tier, 2 computed" in text
    assert "1 earlier request had finished and released its blocks" in text
    assert "GPU pool: 16 blocks: 6 cached in the tree (4 held by the 1 running request, 2 unreferenced" in text
    assert "host tier: none" in text


def test_long_edges_show_their_first_ids():
    replay = TraceReplay("radix", 16)
    last = replay.step(TraceRecord(0, 7, 1, (10, 11, 12, 13, 14, 15, 16)))
    assert "7 blocks #10 #11 #12 #13 … #16" in _text(radix_html(replay, 1, 1, last))


def test_the_host_tier_shows_what_it_holds_and_brings_back():
    replay = TraceReplay("radix", 4, ms_per_token=1, host_blocks=8)
    outcomes = [replay.step(r) for r in COMEBACK[:2]]
    text = _text(radix_html(replay, 2, 3, outcomes[-1]))
    assert "host tier: 4 of 8 blocks; most recent:" in text and "#1 at depth 1" in text
    assert "4 cached blocks evicted to make room" in text
    last = replay.step(COMEBACK[2])
    text = _text(radix_html(replay, 3, 3, last))
    assert "0 hit in the GPU pool, 4 loaded from the host tier, 0 computed" in text
    assert "4 hit in the host tier" in text


def test_a_refused_request_is_said_so():
    replay = TraceReplay("radix", 4)
    last = replay.step(TraceRecord(0, 6, 1, (1, 2, 3, 4, 5, 6)))
    text = _text(radix_html(replay, 1, 1, last))
    assert "refused" in text and "(1 refused)" in text and "the tree is empty" in text


def test_labels_are_never_cut():
    view = RadixView(FORK)
    for slider in (view.pool_blocks, view.host_blocks):
        assert slider.style.description_width == "initial" and slider.continuous_update is False
