"""Serving metrics (lab 03), per request and per run.

Per request (times in seconds; tokens produced at t_1 <= ... <= t_n, arrival a, finish f):
    TTFT  = t_1 - a                      time to first token (queueing + prefill)
    ITL_i = t_{i+1} - t_i                inter-token latencies (n - 1 of them)
    TPOT  = (t_n - t_1) / (n - 1)        mean time per output token after the first (0 if n == 1)
    E2E   = f - a
Per run: output tokens/s = total output tokens / (last finish - first arrival); p50/p90/p99 of each;
goodput = share of requests meeting BOTH TTFT <= ttft_limit AND TPOT <= tpot_limit (DistServe's SLO
attainment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

import numpy as np

__all__ = ["RequestMetrics", "request_metrics", "percentile", "goodput", "RunSummary", "summarize"]


@dataclass(frozen=True)
class RequestMetrics:
    request_id: Hashable
    ttft: float
    tpot: float
    itls: tuple[float, ...]
    e2e: float
    num_output_tokens: int


def request_metrics(seq: object) -> RequestMetrics:
    """From any object with arrival_time, first_token_time, token_times and finish_time (a `Sequence`)."""
    times = list(seq.token_times)
    if seq.first_token_time is None or seq.finish_time is None:
        raise ValueError(f"request {getattr(seq, 'seq_id', '?')!r} has not finished: no metrics yet")
    itls = tuple(b - a for a, b in zip(times, times[1:]))
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    return RequestMetrics(getattr(seq, "seq_id", None), seq.first_token_time - seq.arrival_time, tpot, itls,
                          seq.finish_time - seq.arrival_time, len(times))


def percentile(values: Iterable[float], p: float) -> float:
    """The p-th percentile (0..100), linear interpolation between order statistics (numpy's default)."""
    values = list(values)
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be in [0, 100], got {p}")
    return float(np.percentile(np.asarray(values, dtype=float), p))


def goodput(metrics: Sequence[RequestMetrics], ttft_limit: float, tpot_limit: float) -> float:
    """Fraction of requests with TTFT <= ttft_limit AND TPOT <= tpot_limit."""
    if not metrics:
        return 0.0
    return sum(m.ttft <= ttft_limit and m.tpot <= tpot_limit for m in metrics) / len(metrics)


@dataclass(frozen=True)
class RunSummary:
    num_requests: int
    output_tokens: int
    duration: float
    tokens_per_second: float
    ttft: dict[int, float]          # {50: p50, 90: p90, 99: p99}
    tpot: dict[int, float]
    itl: dict[int, float]
    e2e: dict[int, float]

    def row(self) -> str:
        ms = lambda d: "/".join(f"{1e3 * d[p]:.0f}" for p in (50, 90, 99))     # noqa: E731
        return (f"{self.output_tokens} tokens in {self.duration:.2f} s = {self.tokens_per_second:.1f} tok/s; "
                f"TTFT p50/90/99 {ms(self.ttft)} ms, TPOT {ms(self.tpot)} ms, ITL {ms(self.itl)} ms")


def summarize(sequences: Sequence[object]) -> RunSummary:
    ms = [request_metrics(s) for s in sequences]
    if not ms:
        raise ValueError("no finished requests to summarize")
    start = min(s.arrival_time for s in sequences)
    end = max(s.finish_time for s in sequences)
    tokens = sum(m.num_output_tokens for m in ms)
    itls = [x for m in ms for x in m.itls] or [0.0]
    pct = lambda xs: {p: percentile(xs, p) for p in (50, 90, 99)}      # noqa: E731
    return RunSummary(len(ms), tokens, end - start, tokens / (end - start) if end > start else 0.0,
                      pct(m.ttft for m in ms), pct(m.tpot for m in ms), pct(itls), pct(m.e2e for m in ms))
