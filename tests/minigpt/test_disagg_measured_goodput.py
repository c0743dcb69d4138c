"""Lab 11's measured goodput: a tiny stream served colocated and split on two real processes gives every request
greedy decoding's tokens and a row with every field. Timings are this machine's and never asserted."""

from __future__ import annotations

import multiprocessing

import pytest

from minigpt.checkpoint import load_model
from minigpt.disagg import measured_goodput
from minigpt.disagg.measured_goodput import MODES, make_workload, measure
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.parallel.launch import RankError

ROW_FIELDS = {"rate", "mode", "n_requests", "goodput_rps", "goodput_per_worker", "attainment", "ttft_ok", "tpot_ok",
              "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "throughput_tok_s", "wall_s", "ttft_limit",
              "tpot_limit", "decode_step_p50_s", "decode_batch_mean", "decode_stalled_s", "tokens_agree",
              "mismatched", "others_cpu_share", "load_1min", "requests"}
REQUEST_FIELDS = {"request", "arrival_s", "worker", "prompt_tokens", "ttft_s", "tpot_s", "ok", "tokens"}
TINY = dict(n_requests=5, prompt_tokens=(8, 40), output_tokens=(1, 6), seed=2)


@pytest.fixture(scope="module")
def target():
    return load_model("target")


@pytest.fixture(scope="module")
def rows(target):
    return measure([40.0], model=target, ttft_limit=1.0, tpot_limit=0.1, check_greedy=True, timeout_s=90, **TINY)


def test_both_modes_give_every_request_greedy_decodings_tokens(target, rows) -> None:
    work = make_workload(TINY["n_requests"], 40.0, prompt_tokens=TINY["prompt_tokens"],
                         output_tokens=TINY["output_tokens"], seed=TINY["seed"])
    assert [r["mode"] for r in rows] == list(MODES)
    for row in rows:
        for w, req in zip(work, row["requests"], strict=True):
            want = generate_kv_cache(target, w.prompt, w.output_tokens, stop_token_ids=()).tokens
            assert req["tokens"] == want, f"{row['mode']} request {w.index}: {req['tokens']}, greedy alone {want}"
        assert row["tokens_agree"] and row["mismatched"] == [], f"{row['mode']}: mismatched {row['mismatched']}"


def test_every_row_and_request_has_its_fields(rows) -> None:
    for row in rows:
        assert ROW_FIELDS <= set(row), f"{row['mode']}: missing {ROW_FIELDS - set(row)}"
        assert row["n_requests"] == len(row["requests"]) == TINY["n_requests"]
        assert 0.0 <= row["attainment"] <= 1.0
        assert row["goodput_rps"] == pytest.approx(row["rate"] * row["attainment"])
        assert row["goodput_per_worker"] == pytest.approx(row["goodput_rps"] / 2)
        assert row["wall_s"] > 0 and row["ttft_p50_s"] <= row["ttft_p90_s"]
        assert row["others_cpu_share"] >= 0
        for req in row["requests"]:
            assert REQUEST_FIELDS <= set(req), f"missing {REQUEST_FIELDS - set(req)}"
            assert req["ttft_s"] > 0 and req["tpot_s"] >= 0


def test_no_decode_waits_for_a_prefill_when_split(rows) -> None:
    split = [r for r in rows if r["mode"] == "disaggregated"]
    assert split and all(r["decode_stalled_s"] == 0 for r in split), [r["decode_stalled_s"] for r in split]


def test_no_process_outlives_the_call(rows) -> None:
    assert multiprocessing.active_children() == [], "a rank outlived measure"


def test_a_failing_worker_is_named_and_no_process_is_left(target, monkeypatch) -> None:
    def broken_prefill_worker(*args, **kwargs):
        raise RuntimeError("prefill worker broke on purpose")

    monkeypatch.setattr(measured_goodput, "_prefill_worker", broken_prefill_worker)   # the forked ranks inherit it
    with pytest.raises(RankError, match=r"rank 0 failed: RuntimeError: prefill worker broke on purpose"):
        measure([40.0], model=target, modes=["disaggregated"], recv_timeout_s=2.0, timeout_s=60, **TINY)
    assert multiprocessing.active_children() == [], "a rank outlived the failed call"


def test_the_stream_is_the_same_requests_at_every_rate() -> None:
    slow, fast = (make_workload(6, rate, prompt_tokens=(10, 20), output_tokens=(2, 4), seed=1) for rate in (1.0, 9.0))
    assert [(w.prompt, w.output_tokens) for w in slow] == [(w.prompt, w.output_tokens) for w in fast]
    assert all(10 <= len(w.prompt) <= 20 and 2 <= w.output_tokens <= 4 for w in slow)
    assert slow[0].arrival_s == 0.0 and slow[-1].arrival_s > fast[-1].arrival_s


@pytest.mark.parametrize("kwargs, message", [
    (dict(modes=["colocated", "pipelined"]), r"modes must be some of"),
    (dict(prompt_tokens=(400, 500), output_tokens=32), r"beyond the model's context of 512"),
    (dict(prompt_tokens=(20, 10)), r"prompt_tokens must be an int >= 1 or a range"),
])
def test_a_bad_call_is_refused_before_any_process_starts(target, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        measure([1.0], model=target, n_requests=2, **kwargs)
