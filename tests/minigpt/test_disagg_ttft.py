"""Lab 11's TTFT breakdown on two real processes: every field there, the same greedy tokens in every mode, the bytes
moved equal to the formula. Timings are this machine's and never asserted beyond their signs."""

from __future__ import annotations

import multiprocessing

import pytest

from minigpt.checkpoint import load_model
from minigpt.disagg import MODES, ttft_breakdown
from minigpt.disagg.transfer_cost import kv_bytes_per_request
from minigpt.disagg.ttft import random_prompts
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.costmodel.calculators import ModelShape

FIELDS = {"mode", "request", "prompt_tokens", "arrival_s", "closed_loop", "queueing_s", "prefill_s", "transfer_s",
          "decode_wait_s", "first_decode_step_s", "ttft_s", "time_to_second_token_s", "e2e_s", "kv_bytes",
          "kv_bytes_received", "kv_bytes_formula", "header_bytes", "first_token", "tokens", "link"}
DURATIONS = ("queueing_s", "prefill_s", "transfer_s", "decode_wait_s", "first_decode_step_s", "ttft_s",
             "time_to_second_token_s", "e2e_s")


@pytest.fixture(scope="module")
def target():
    return load_model("target")


def test_every_mode_reports_every_field_and_the_same_greedy_tokens(target) -> None:
    lengths, new = [12, 40], 3
    rows = ttft_breakdown(target, lengths, MODES, max_new_tokens=new, seed=3, warmup=False)
    assert [(r["mode"], r["request"]) for r in rows] == [(m, i) for m in MODES for i in range(2)]
    prompts = random_prompts(lengths, target.config.vocab_size, seed=3)
    shape = ModelShape.from_config(target.config, "target")
    for r in rows:
        assert FIELDS <= set(r), f"missing fields {FIELDS - set(r)}"
        want = generate_kv_cache(target, prompts[r["request"]], new, stop_token_ids=()).tokens
        assert r["tokens"] == want, f"{r['mode']} request {r['request']}: {r['tokens']}, colocated greedy {want}"
        assert r["first_token"] == want[0]
        formula = kv_bytes_per_request(shape, r["prompt_tokens"], 4)
        assert r["kv_bytes_formula"] == formula
        moved = 0 if r["mode"] == "colocated" else formula
        assert r["kv_bytes"] == r["kv_bytes_received"] == moved, f"{r['mode']}: {r['kv_bytes']} bytes, want {moved}"
        assert all(r[f] >= 0 for f in DURATIONS), {f: r[f] for f in DURATIONS}
        assert r["ttft_s"] <= r["time_to_second_token_s"] <= r["e2e_s"]
    assert multiprocessing.active_children() == [], "a rank outlived ttft_breakdown"


def test_ttft_is_the_clients_first_token_its_parts_summed(target) -> None:
    """One TTFT in lab 11: colocated, queue + prefill; split, the client streams from the decode worker, so the
    exposed transfer and the wait for the decode worker count too, and the second token is one decode step later."""
    rows = ttft_breakdown(target, [24], MODES, max_new_tokens=3, link_bandwidth=20e6, warmup=False)
    assert [r["mode"] for r in rows] == list(MODES)
    for r in rows:
        parts = r["queueing_s"] + r["prefill_s"] + r["transfer_s"] + r["decode_wait_s"]
        assert r["ttft_s"] == pytest.approx(parts, abs=1e-9), f"{r['mode']}: ttft {r['ttft_s']} s, parts {parts} s"
        second = r["ttft_s"] + r["first_decode_step_s"]
        assert r["time_to_second_token_s"] == pytest.approx(second, abs=1e-9), r["mode"]


def test_given_arrivals_and_an_emulated_link_are_reported_as_such(target) -> None:
    rows = ttft_breakdown(target, [8, 8], ["whole"], max_new_tokens=2, arrivals_s=[0.0, 0.001],
                          link_bandwidth=1e9, warmup=False)
    assert [r["arrival_s"] for r in rows] == [0.0, 0.001]
    assert not any(r["closed_loop"] for r in rows)
    assert all(r["link"].startswith("EMULATED 1000 MB/s") for r in rows), rows[0]["link"]
    assert all(r["queueing_s"] >= 0 for r in rows)


@pytest.mark.parametrize("kwargs, message", [
    (dict(modes=["colocated", "pipelined"]), r"unknown mode\(s\) \['pipelined'\]"),
    (dict(prompt_lengths=[510], max_new_tokens=8), r"prompt length\(s\) \[510\] \+ max_new_tokens 8 exceed"),
    (dict(prompt_lengths=[8, 8], arrivals_s=[0.0]), "arrivals_s must give one non-decreasing time"),
])
def test_a_bad_request_is_refused_before_any_process_starts(target, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ttft_breakdown(target, **kwargs)
