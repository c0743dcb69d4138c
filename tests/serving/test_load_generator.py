"""The load generator (benchmark_serving) and client-side metrics, against fake replicas on loopback."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from minigpt.serving.client_metrics import (RequestRecord, benchmark_duration, request_goodput, summarize_records,
                                            token_goodput)
from minigpt.serving.load_generator import (benchmark, check_loopback, corpus_prompts, poisson_arrivals,
                                            shared_prefix_prompts)
from minigpt.tokenizer import load_tokenizer
from fakes import fake_replicas, serve_in_thread


@pytest.fixture(scope="module")
def replica() -> str:
    with fake_replicas("r0", token_delay=0.002) as urls:
        yield urls[0]


@pytest.mark.parametrize("url", ["http://example.com:8000", "http://10.0.0.5:8000", "http://0.0.0.0:80", "nonsense"])
def test_refuses_non_loopback_hosts(url: str) -> None:
    with pytest.raises(ValueError, match="loopback|host"):
        check_loopback(url)
    with pytest.raises(ValueError):
        benchmark(url, ["x"], max_tokens=1)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/", "http://localhost:1", "http://[::1]:9", "http://127.1.2.3"])
def test_accepts_loopback(url: str) -> None:
    assert check_loopback(url) == url.rstrip("/")


def test_poisson_arrivals_seeded_with_the_right_mean() -> None:
    a = poisson_arrivals(20000, rate=4.0, seed=3)
    assert a == poisson_arrivals(20000, rate=4.0, seed=3) and a != poisson_arrivals(20000, rate=4.0, seed=4)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert math.isclose(sum(gaps) / len(gaps), 0.25, rel_tol=0.03)
    # exponential: the share of gaps above the mean is e^-1
    assert math.isclose(sum(g > 0.25 for g in gaps) / len(gaps), math.exp(-1), rel_tol=0.05)
    assert poisson_arrivals(5, math.inf) == [0.0] * 5
    with pytest.raises(ValueError):
        poisson_arrivals(3, 0.0)


def test_workloads_are_seeded_and_share_prefixes() -> None:
    w = corpus_prompts(6, prompt_tokens=40, seed=1)
    assert w.prompts == corpus_prompts(6, prompt_tokens=40, seed=1).prompts and len(set(w.prompts)) == 6
    s = shared_prefix_prompts(3, 4, prefix_tokens=80, question_tokens=12, seed=0)
    assert len(s.prompts) == 12 and sorted(s.prefix_ids) == [0] * 4 + [1] * 4 + [2] * 4
    enc = load_tokenizer()
    heads = {}
    for pid, prompt in zip(s.prefix_ids, s.prompts):
        head = tuple(enc.encode(prompt)[:64])           # the first 4 blocks of 16
        assert heads.setdefault(pid, head) == head, "prompts of one system prompt must share their first blocks"
    assert len(set(heads.values())) == 3


def test_streams_and_records_every_chunk(replica: str) -> None:
    prompts = corpus_prompts(5, prompt_tokens=20, seed=0)
    for chat in (False, True):
        records = benchmark(replica, prompts, max_tokens=7, chat=chat, rate=math.inf)
        assert [r.request_id for r in records] == list(range(5))
        for r in records:
            assert r.ok, r.error
            assert len(r.chunk_times) == 7 and r.output_tokens == 7 and r.prompt_tokens > 0
            assert r.text == "".join(f" t{i}" for i in range(7))
            assert r.send_time < r.chunk_times[0] <= r.chunk_times[-1] <= r.end_time
            assert r.ttft > 0 and r.tpot >= 0 and len(r.itls) == 6
    summary = summarize_records(records, ttft_limit=10.0, tpot_limit=10.0)
    assert summary.num_ok == 5 and summary.output_tokens == 35 and summary.num_rejected == 0
    assert math.isclose(summary.goodput, summary.request_throughput)
    assert summary.ttft[50] <= summary.ttft[99]


def test_poisson_sends_follow_the_schedule(replica: str) -> None:
    planned = poisson_arrivals(8, rate=40.0, seed=5)
    records = benchmark(replica, ["hello"] * 8, max_tokens=2, rate=40.0, seed=5)
    t0 = records[0].send_time
    sent = [r.send_time - t0 for r in records]
    assert all(s >= p - 1e-3 for s, p in zip(sent, planned)), "a request left before its arrival time"


def test_bounded_in_time_and_count() -> None:
    with fake_replicas("slow", token_delay=0.2) as (url,):
        start = time.perf_counter()
        records = benchmark(url, ["a", "b", "c"], max_tokens=500, max_duration=0.5, max_requests=2)
        elapsed = time.perf_counter() - start
    assert len(records) == 2 and benchmark(url, [], max_tokens=1, model="m") == []
    assert elapsed < 20, "the benchmark must stop at max_duration, not wait 100 s for the streams"
    assert all(not r.ok and "max_duration" in r.error for r in records)


def test_errors_and_429_are_recorded_and_never_good() -> None:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def busy() -> JSONResponse:
        return JSONResponse({"error": {"message": "queue full", "type": "rate_limit", "param": None, "code": None}},
                            status_code=429, headers={"Retry-After": "1"})

    with serve_in_thread(app) as url:
        records = benchmark(url, ["x", "y"], max_tokens=3, model="m")
    assert all(r.status == 429 and not r.ok for r in records)
    summary = summarize_records(records)
    assert summary.num_rejected == 2 and summary.num_ok == 0 and summary.goodput == 0.0
    assert math.isnan(summary.ttft[50])


def test_benchmark_runs_inside_a_running_event_loop(replica: str) -> None:
    async def inside() -> list[RequestRecord]:
        return benchmark(replica, ["x"], max_tokens=2)       # as in a Jupyter cell

    assert asyncio.run(inside())[0].ok


def _rec(i: int, send: float, first: float, last: float, n: int, end: float, status: int = 200) -> RequestRecord:
    times = [first] if n == 1 else [first + k * (last - first) / (n - 1) for k in range(n)]
    return RequestRecord(i, send, end, times, n, 5, status=status)


def test_goodput_by_hand() -> None:
    records = [_rec(0, 0.0, 0.1, 0.5, 5, 0.6),          # TTFT 0.1, TPOT 0.1: good
               _rec(1, 0.5, 1.5, 1.9, 5, 2.0),          # TTFT 1.0: too slow to start
               _rec(2, 1.0, 1.1, 3.1, 5, 3.2),          # TPOT 0.5: too slow per token
               _rec(3, 1.5, 1.6, 1.6, 1, 4.0),          # one token: TPOT 0, good
               _rec(4, 2.0, 2.1, 2.5, 5, 2.5, status=429)]
    assert benchmark_duration(records) == 4.0
    assert math.isclose(request_goodput(records, ttft_limit=0.5, tpot_limit=0.2), 2 / 4.0)
    assert math.isclose(token_goodput(records, ttft_limit=0.5, tpot_limit=0.2), 6 / 4.0)
    assert request_goodput([], 1.0, 1.0) == 0.0


def test_steady_window_skips_the_warm_up_and_follows_late_requests_to_their_end() -> None:
    """Sustained goodput (lab 08 Q1): the first quarter of the sends is warm-up; the other requests arrived at
    (n - 1) / window per second, and only those meeting both objectives count, however late they end."""
    from minigpt.serving.experiments import steady_window_rates
    records = [_rec(i, 0.5 * i, 0.5 * i + 0.1, 0.5 * i + 0.5, 5, 0.5 * i + 0.6) for i in range(8)]   # all good
    records[0].chunk_times = [9.0, 9.1]                   # warm-up: slow, not counted
    records[5].chunk_times = [2.5 + 1.5, 2.5 + 1.6]       # sent at 2.5, TTFT 1.5: served late, not good
    records[6].status, records[6].error = 429, "queue full"
    goodput, served, window, n = steady_window_rates(records, warmup_share=0.25, ttft_limit=1.0, tpot_limit=0.2)
    assert (window, n) == (2.5, 6)                        # sends 1.0, 1.5, ..., 3.5: 5 gaps in 2.5 s
    assert math.isclose(goodput, 5 / 2.5 * 4 / 6) and math.isclose(served, 5 / 2.5 * 5 / 6)
    with pytest.raises(ValueError, match="no steady window"):
        steady_window_rates(records[:2], warmup_share=0.5)


def test_engine_comparison_picks_the_highest_rate_both_sustain() -> None:
    from minigpt.serving.experiments import EngineComparison, RatePoint

    def point(engine: str, rate: float, tokens_per_s: float, failed: int = 0) -> RatePoint:
        records = [_rec(i, 0.0, 0.1, 0.5, 5, 1.0) for i in range(4)]
        for r in records[:failed]:
            r.status, r.error = 429, "queue full"
        s = summarize_records(records)
        return RatePoint(engine, rate, type(s)(**{**s.__dict__, "output_throughput": tokens_per_s}))

    cmp = EngineComparison([point("naive", 1.0, 10.0), point("naive", 4.0, 12.0), point("naive", math.inf, 12.0, 2),
                            point("continuous", 1.0, 10.0), point("continuous", 4.0, 60.0),
                            point("continuous", math.inf, 90.0)])
    assert cmp.highest_common_rate() == 4.0                 # naive dropped requests when all came at once
    assert cmp.speedup() == 5.0 and cmp.speedup(1.0) == 1.0
    assert set(cmp.series()) == {"naive", "continuous"} and "all at once" in cmp.table()

    from matplotlib.figure import Figure

    from minigpt.teaching.serving_plots import plot_throughput_vs_rate, plot_ttft_vs_rate

    ax1, ax2 = Figure().subplots(1, 2)
    plot_throughput_vs_rate(ax1, cmp.series())
    plot_ttft_vs_rate(ax2, cmp.series())
    assert [list(line.get_xdata()) for line in ax1.get_lines()] == [[1.0, 4.0, 8.0]] * 2   # inf drawn at 2 x 4
    assert list(ax1.get_lines()[1].get_ydata()) == [10.0, 60.0, 90.0]


def test_against_the_real_server_streaming_completions_and_chat(tiny, tokenizer) -> None:
    """The client parses the real server's SSE (text, chat deltas, the usage chunk), not only the fake's."""
    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import EngineConfig, LLMEngine

    engine = LLMEngine(tiny, EngineConfig(num_blocks=64, block_size=16), tokenizer=tokenizer)
    with serve_in_thread(create_app(AsyncLLMEngine(engine))) as url:
        work = corpus_prompts(4, prompt_tokens=24, seed=3)
        for chat in (False, True):
            records = benchmark(url, work, max_tokens=6, chat=chat, rate=50.0, seed=1)
            assert all(r.ok for r in records), [r.error for r in records]
            assert all(0 < len(r.chunk_times) <= r.output_tokens <= 6 and r.prompt_tokens > 0 for r in records)
            assert summarize_records(records).output_tokens == sum(r.output_tokens for r in records)


def test_command_line_prints_the_summary(replica: str, capsys) -> None:
    from minigpt.serving.load_generator import main

    main(["--url", replica, "--num-prompts", "6", "--workload", "shared-prefix", "--system-prompts", "2",
          "--max-tokens", "3", "--rate", "100"])
    out = capsys.readouterr().out
    assert "6/6 ok" in out and "TTFT p50/90/99" in out and "goodput" in out
    with pytest.raises(ValueError, match="loopback"):
        main(["--url", "http://192.168.1.1:8000", "--num-prompts", "1"])


def test_a_trace_sets_the_arrivals_and_the_output_lengths(replica: str) -> None:
    from minigpt.serving.trace import TraceRecord, replay_over_http
    records = [TraceRecord(0, 3, 2, (0,)), TraceRecord(40, 3, 4, (0,)), TraceRecord(90, 3, 1, (1,))]
    done = replay_over_http(replica, records, [[5, 6, 7], [5, 6, 7], [8, 9, 10]])
    t0 = done[0].send_time
    assert all(r.ok for r in done)
    assert all(r.send_time - t0 >= rec.timestamp / 1000 - 1e-3 for r, rec in zip(done, records))
    assert [r.output_tokens for r in done] == [2, 4, 1]
    with pytest.raises(ValueError, match="arrivals"):
        benchmark(replica, ["a", "b"], arrivals=[1.0, 0.5], max_tokens=1)
    with pytest.raises(ValueError, match="max_tokens"):
        benchmark(replica, ["a", "b"], max_tokens=[1], model="m")
