"""Lab 08, exercise 3: goodput of a load test (request_goodput)."""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

from autograder.harness import call_learner, check_answer
from autograder.lab08.common import _watched
from autograder.checking.reference_guard import own_work
from minigpt.serving.client_metrics import RequestRecord, request_goodput


# ---------------------------------------------------------------------------------------------------
# Goodput
# ---------------------------------------------------------------------------------------------------

def _record(i: int, send: float, first: float, tpot: float, n: int, end: float, *, status: int = 200,
            error: str | None = None) -> RequestRecord:
    return RequestRecord(i, send, end, [first + k * tpot for k in range(n)], n, 8, status=status, error=error)


def goodput_cases() -> dict[str, tuple[list[RequestRecord], float, float]]:
    """Named (records, ttft_limit, tpot_limit) cases. Limits 0.5 s TTFT and 0.25 s/token TPOT; times are exact
    binary fractions, so a request exactly AT a limit meets it."""
    mixed = [
        _record(0, 1.0, 1.25, 0.125, 5, 1.875),          # good
        _record(1, 0.5, 1.75, 0.125, 5, 2.5),            # TTFT 1.25: misses TTFT only
        _record(2, 2.0, 2.25, 0.75, 4, 4.5),             # TPOT 0.75: misses TPOT only
        _record(3, 0.0, 0.5, 0.25, 3, 1.0),              # exactly at both limits: good
        _record(4, 3.0, 3.125, 0.0, 1, 3.25),            # one token (TPOT 0): good
        _record(5, 3.5, 3.5, 0.0, 0, 3.5, status=429, error="HTTP 429: queue full"),     # rejected, no chunks
        _record(6, 4.0, 4.125, 0.125, 4, 8.0, error="the stream ended without data: [DONE]"),  # broken stream
        _record(7, 2.5, 3.5, 0.5, 3, 5.0),               # misses both
        _record(8, 1.5, 1.75, 0.5, 3, 3.0),              # TPOT 0.5: misses TPOT only
        _record(9, 4.5, 4.625, 1.0, 3, 6.75),            # TPOT 1.0: misses TPOT only
        _record(10, 5.0, 5.25, 0.125, 6, 7.0, error="cancelled: the benchmark's max_duration ran out"),
    ]
    all_good = [_record(i, 0.25 * i, 0.25 * i + 0.25, 0.125, 3, 0.25 * i + 0.75) for i in range(4)]
    later = [_record(i, 100.0 + 0.25 * i, 100.25 + 0.25 * i, 0.0, 1, 100.5 + 0.25 * i) for i in range(4)]
    return {"a mixed benchmark (11 requests: some slow to start, some slow per token, a 429, a broken and a "
            "cancelled stream)":
            (mixed, 0.5, 0.25),
            "four fast requests": (all_good, 0.5, 0.25),
            "four fast one-token requests sent 100 s after the clock's zero": (later, 0.5, 0.25),
            "one good request of 0.5 s (a benchmark shorter than a second)": ([_record(0, 2.0, 2.125, 0.125, 3, 2.5)],
                                                                              0.5, 0.25),
            "one request refused at once (429: it ends when it is sent, the benchmark lasts 0 s)":
            ([_record(0, 1.0, 1.0, 0.0, 0, 1.0, status=429, error="HTTP 429: queue full")], 0.5, 0.25),
            "no requests at all": ([], 0.5, 0.25)}


def _goodput_mistakes(records: list[RequestRecord], ttft: float, tpot: float) -> list[tuple[float, str]]:
    """Answers the usual mistakes give on these records, with their diagnosis."""
    if not records:
        return []
    ok = [r for r in records if r.ok]
    span = max(r.end_time for r in records) - min(r.send_time for r in records)
    if not ok or span <= 0:
        return []
    good = [r for r in ok if r.ttft <= ttft and r.tpot <= tpot]
    strict = [r for r in ok if r.ttft < ttft and r.tpot < tpot]
    counted_failed = [r for r in records if r.chunk_times and r.ttft <= ttft and r.tpot <= tpot]
    spans = {"the span of the ok requests only": max(r.end_time for r in ok) - min(r.send_time for r in ok),
             "the span of the good requests only": max(r.end_time for r in good) - min(r.send_time for r in good)
             if good else span,
             "the sum of the requests' latencies (they overlap in time)": sum(r.e2e for r in records),
             "the time to the last FIRST token": max(r.chunk_times[0] for r in ok) - min(r.send_time for r in records)}
    out = [(sum(r.ttft <= ttft for r in ok) / span, "a request that met only the TTFT limit counted; it must "
            "meet BOTH limits (TTFT <= ttft_limit AND TPOT <= tpot_limit)"),
           (sum(r.tpot <= tpot for r in ok) / span, "a request that met only the TPOT limit counted; it must "
            "meet BOTH limits"),
           (sum(r.ttft <= ttft or r.tpot <= tpot for r in ok) / span, "`or` instead of `and`: both limits must "
            "hold"),
           (len(counted_failed) / span, "failed requests (a 429, a broken stream) counted; only ok ones can be good"),
           (len(strict) / span, "a request exactly AT a limit must count (<=, not <)"),
           (len(good) / len(records), "that is the SHARE of good requests (lab 03); goodput here is a rate: "
            "good requests per second of benchmark"),
           (len(good), "that is a count; divide by the benchmark's duration in seconds")]
    out += [(len(good) / d, f"divided by {what}; the duration is max(end_time) - min(send_time) over ALL records")
            for what, d in spans.items() if d > 0]
    return [(v, m) for v, m in out if not math.isclose(v, len(good) / span, rel_tol=0.0, abs_tol=1e-9)]


def check_goodput(goodput_fn: Callable[[Sequence[RequestRecord], float, float], float]) -> None:
    """goodput_fn(records, ttft_limit, tpot_limit) equals the reference (requests/s) on hand-made benchmarks."""
    what = "Exercise 3 (request_goodput)"
    own_work(goodput_fn, request_goodput, what=what)
    goodput_fn = _watched(goodput_fn, (request_goodput,), what)
    for what, (records, ttft, tpot) in goodput_cases().items():
        expected = request_goodput(records, ttft, tpot)
        shuffled = list(records)
        random.Random(0).shuffle(shuffled)
        got = call_learner(f"goodput ({what})", goodput_fn, shuffled, ttft, tpot,
                           context="a failed request (record.ok is False: a 429, a broken or cancelled stream) may "
                                   "have no chunk_times, so no TTFT: skip failed records before looking at latencies; no "
                                   "records at all give 0.0")
        check_answer(got, expected, f"goodput of {what}, ttft_limit={ttft} s, tpot_limit={tpot} s",
                     _goodput_mistakes(records, ttft, tpot), unit="requests/s", rel=1e-6, reveal=True,
                     hint="Count the ok requests with TTFT <= ttft_limit AND TPOT <= tpot_limit, and divide by "
                          "max(end_time) - min(send_time) over all records (0.0 when there are none).")
