"""Exercise 4: TTFT, TPOT, inter-token latencies, E2E and goodput on hand-made timelines."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from autograder.harness import call_learner
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.engine.metrics import RequestMetrics, goodput, request_metrics


@dataclass
class Timeline:
    """What request_metrics reads of a finished request (a dataclass: judged, it travels to the kernel as data)."""

    seq_id: str
    arrival_time: float
    token_times: list[float]
    first_token_time: float
    finish_time: float


def timeline(rid: str, arrival: float, times: list[float], finish: float | None = None) -> Timeline:
    return Timeline(rid, arrival, times, times[0], finish if finish is not None else times[-1])


def check_metrics(request_metrics_fn: Callable, goodput_fn: Callable) -> None:
    """TTFT, TPOT, ITLs, E2E (to the finish time, which may come after the last token) and goodput on hand-made
    timelines; goodput of no requests is 0."""
    what = "Exercise 4 (metrics)"
    own_work(request_metrics_fn, request_metrics, what=what)
    own_work(goodput_fn, goodput, what=what)
    with no_calls_into(request_metrics, goodput, what=what):
        metrics_cases(request_metrics_fn, goodput_fn)


def metrics_cases(request_metrics_fn: Callable, goodput_fn: Callable) -> None:
    """The cases of check_metrics without the refusal of the reference (the package's tests run it on the reference)."""
    a = timeline("a", 1.0, [1.5, 1.6, 1.8, 2.1])
    b = timeline("b", 0.0, [0.2])
    c = timeline("c", 0.5, [3.5, 3.55, 3.6], finish=3.7)
    got = call_learner("request_metrics", request_metrics_fn, a)
    for name, want in {"ttft": 0.5, "tpot": 0.2, "e2e": 1.1, "num_output_tokens": 4}.items():
        val = getattr(got, name, None)
        if not isinstance(val, (int, float)) or not math.isclose(val, want, rel_tol=1e-9, abs_tol=1e-12):
            hint = {"tpot": " TPOT = (last token time - first token time) / (n - 1): the first token is TTFT's.",
                    "ttft": " TTFT counts from the ARRIVAL (queueing included)."}.get(name, "")
            got = f"{val:.6g}" if isinstance(val, float) else repr(val)       # 0.15, not 0.15000000000000002
            raise AssertionError(f"tokens at 1.5, 1.6, 1.8, 2.1 s for a request arriving at 1.0 s: {name} should be "
                                 f"{want}, got {got}.{hint}")
    try:
        itls = [round(x, 9) for x in getattr(got, "itls", ())]
    except TypeError:               # None, or something that is not a sequence of numbers
        itls = None
    if itls != [0.1, 0.2, 0.3]:
        raise AssertionError(f"tokens at 1.5, 1.6, 1.8, 2.1 s: the inter-token latencies (itls) should be (0.1, 0.2, "
                             f"0.3), got {getattr(got, 'itls', None)!r:.200}")
    if getattr(got, "request_id", None) != "a":
        raise AssertionError(f"request_id should be the sequence's id 'a' (seq.seq_id), got "
                             f"{getattr(got, 'request_id', None)!r}")
    two = call_learner("request_metrics", request_metrics_fn, timeline("d", 0.0, [1.0, 1.5]))
    if getattr(two, "tpot", None) != 0.5:
        raise AssertionError(f"tokens at 1.0 and 1.5 s: TPOT should be 0.5 (one gap, n - 1 = 1), got "
                             f"{getattr(two, 'tpot', None)!r}")
    one = call_learner("request_metrics", request_metrics_fn, b)
    if getattr(one, "tpot", None) != 0.0:
        raise AssertionError(f"a one-token output has TPOT 0 (no gap between tokens), got {getattr(one, 'tpot', None)!r}")
    late = call_learner("request_metrics", request_metrics_fn, c)
    if not isinstance(getattr(late, "e2e", None), (int, float)) or not math.isclose(late.e2e, 3.2, rel_tol=1e-9):
        raise AssertionError(f"a request arriving at 0.5 s whose last token comes at 3.6 s and that finishes at 3.7 s "
                             f"has E2E 3.2 s, got {getattr(late, 'e2e', None)!r}: E2E runs from the arrival to the "
                             "FINISH time (seq.finish_time), not to the last token")
    ms = [got, one, late]        # TTFT 0.5 / 0.2 / 3.0, TPOT 0.2 / 0 / 0.05
    for (ttft, tpot), want in {(1.0, 0.1): 1 / 3, (0.5, 0.25): 2 / 3, (5.0, 0.3): 1.0, (0.1, 1.0): 0.0}.items():
        val = call_learner("goodput", goodput_fn, ms, ttft, tpot)
        if not isinstance(val, (int, float)) or not math.isclose(val, want, rel_tol=1e-9):
            raise AssertionError(f"goodput with TTFT <= {ttft} s and TPOT <= {tpot} s over requests with (TTFT, TPOT) = "
                                 f"(0.5, 0.2), (0.2, 0), (3.0, 0.05) should be {want:.4g}, got {val!r}: a request counts "
                                 "only if it meets BOTH limits (<=), as a share of all requests")
    at_limits = [RequestMetrics("x", 0.5, 0.25, (0.25,), 0.75, 2), RequestMetrics("y", 0.25, 0.5, (0.5,), 0.75, 2)]
    val = call_learner("goodput", goodput_fn, at_limits, 0.5, 0.25)
    if val != 0.5:
        raise AssertionError(f"goodput with TTFT <= 0.5 s and TPOT <= 0.25 s over requests with (TTFT, TPOT) = (0.5, "
                             f"0.25), (0.25, 0.5) should be 0.5, got {val!r}: a request exactly at a limit meets it (<=)")
    empty = call_learner("goodput of no requests", goodput_fn, [], 1.0, 1.0)
    if empty != 0:
        raise AssertionError(f"goodput of an empty list of requests should be 0, got {empty!r}")
