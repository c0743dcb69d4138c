"""Client-side serving metrics (lab 08): what a load generator sees of each request, and goodput.

A streamed request, as the client records it (times in seconds on the client's clock):

    send s          the request leaves the client
    chunks c_1..c_k arrival times of the SSE chunks that carried text (one token each on our server)
    end e           the stream ended (after `data: [DONE]`), or the error arrived
    n               output tokens, from the `usage` object the server sends last

    TTFT  = c_1 - s                       ITL_i = c_{i+1} - c_i
    TPOT  = (c_k - c_1) / (n - 1)         time per output token after the first (0 when n == 1)
    E2E   = e - s

Per benchmark (over ALL records, failed ones included: the run lasted that long):

    duration   = max(e) - min(s)
    goodput    = #{ok requests with TTFT <= ttft_limit AND TPOT <= tpot_limit} / duration     requests/s

Lab 03's `goodput` is the *share* of requests that meet both limits (SLO attainment); here it is the
serving-benchmark quantity, a *rate* (DistServe, vLLM's `vllm bench serve --goodput`): what a
replica delivers that users would accept. Failed requests (HTTP errors, 429s, broken streams)
never count as good.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

from minigpt.engine.metrics import RequestMetrics, percentile

__all__ = ["RequestRecord", "record_metrics", "benchmark_duration", "request_goodput", "token_goodput",
           "BenchmarkSummary", "summarize_records"]


@dataclass
class RequestRecord:
    """One request as the client saw it. `ok` is False for an HTTP error, a 429 or a broken stream."""
    request_id: Hashable
    send_time: float
    end_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    text: str = ""
    status: int = 0              # HTTP status code (0: no response at all)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        """c_1 - s (seconds); only meaningful for ok records."""
        return self.chunk_times[0] - self.send_time

    @property
    def tpot(self) -> float:
        """(c_k - c_1) / (n - 1): mean time per output token after the first, 0 for a 1-token answer."""
        n = max(self.output_tokens, len(self.chunk_times))
        return (self.chunk_times[-1] - self.chunk_times[0]) / (n - 1) if n > 1 else 0.0

    @property
    def itls(self) -> tuple[float, ...]:
        return tuple(b - a for a, b in zip(self.chunk_times, self.chunk_times[1:]))

    @property
    def e2e(self) -> float:
        return self.end_time - self.send_time


def record_metrics(record: RequestRecord) -> RequestMetrics:
    """Lab 03's per-request metrics (`minigpt.engine.metrics.RequestMetrics`) of an ok record."""
    if not record.ok:
        raise ValueError(f"request {record.request_id!r} failed ({record.status}, {record.error}): no latency metrics")
    return RequestMetrics(record.request_id, record.ttft, record.tpot, record.itls, record.e2e,
                          max(record.output_tokens, len(record.chunk_times)))


def benchmark_duration(records: Sequence[RequestRecord]) -> float:
    """max(end) - min(send) over every record: the wall time the benchmark ran."""
    if not records:
        raise ValueError("no records: the benchmark sent no requests")
    return max(r.end_time for r in records) - min(r.send_time for r in records)


def _good(records: Sequence[RequestRecord], ttft_limit: float, tpot_limit: float) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.ttft <= ttft_limit and r.tpot <= tpot_limit]


def request_goodput(records: Sequence[RequestRecord], ttft_limit: float, tpot_limit: float) -> float:
    """Requests per second that met BOTH objectives (TTFT <= ttft_limit and TPOT <= tpot_limit), over the whole
    benchmark's duration (max end - min send, all records). Failed requests never count. 0.0 for no records."""
    if not records:
        return 0.0
    duration = benchmark_duration(records)
    good = _good(records, ttft_limit, tpot_limit)
    return len(good) / duration if duration > 0 else 0.0


def token_goodput(records: Sequence[RequestRecord], ttft_limit: float, tpot_limit: float) -> float:
    """Output tokens per second of the requests that met both objectives (same duration as request_goodput)."""
    if not records:
        return 0.0
    duration = benchmark_duration(records)
    good = _good(records, ttft_limit, tpot_limit)
    return sum(max(r.output_tokens, len(r.chunk_times)) for r in good) / duration if duration > 0 else 0.0


@dataclass(frozen=True)
class BenchmarkSummary:
    """What `vllm bench serve` prints: counts, rates and p50/p90/p99 latencies (seconds)."""
    num_requests: int
    num_ok: int
    num_failed: int
    num_rejected: int            # 429 Too Many Requests
    duration: float
    output_tokens: int
    request_throughput: float    # ok requests / s
    output_throughput: float     # output tokens / s
    goodput: float               # requests / s meeting both objectives
    token_goodput: float         # output tokens / s of those requests
    ttft_limit: float
    tpot_limit: float
    ttft: dict[int, float]
    tpot: dict[int, float]
    itl: dict[int, float]
    e2e: dict[int, float]
    mean_ttft: float

    def row(self) -> str:
        ms = lambda d: "/".join(f"{1e3 * d[p]:.0f}" for p in (50, 90, 99))     # noqa: E731
        return (f"{self.num_ok}/{self.num_requests} ok ({self.num_rejected} x 429) in {self.duration:.2f} s: "
                f"{self.output_throughput:.1f} tok/s, {self.request_throughput:.2f} req/s, goodput "
                f"{self.goodput:.2f} req/s; TTFT p50/90/99 {ms(self.ttft)} ms, TPOT {ms(self.tpot)} ms, "
                f"ITL {ms(self.itl)} ms")


def summarize_records(records: Sequence[RequestRecord], *, ttft_limit: float = 1.0,
                      tpot_limit: float = 0.1) -> BenchmarkSummary:
    """Summarize a benchmark run; latency percentiles over ok requests (NaN when none succeeded)."""
    duration = benchmark_duration(records)
    ok = [record_metrics(r) for r in records if r.ok]
    nan = float("nan")
    pct = lambda xs: ({p: percentile(xs, p) for p in (50, 90, 99)} if xs else {50: nan, 90: nan, 99: nan})  # noqa: E731
    tokens = sum(m.num_output_tokens for m in ok)
    rate = lambda x: x / duration if duration > 0 else 0.0      # noqa: E731
    return BenchmarkSummary(
        num_requests=len(records), num_ok=len(ok), num_failed=len(records) - len(ok),
        num_rejected=sum(r.status == 429 for r in records), duration=duration, output_tokens=tokens,
        request_throughput=rate(len(ok)), output_throughput=rate(tokens),
        goodput=request_goodput(records, ttft_limit, tpot_limit),
        token_goodput=token_goodput(records, ttft_limit, tpot_limit), ttft_limit=ttft_limit, tpot_limit=tpot_limit,
        ttft=pct([m.ttft for m in ok]), tpot=pct([m.tpot for m in ok]), itl=pct([x for m in ok for x in m.itls]),
        e2e=pct([m.e2e for m in ok]), mean_ttft=sum(m.ttft for m in ok) / len(ok) if ok else nan)
