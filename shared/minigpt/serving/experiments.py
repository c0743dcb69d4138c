"""Lab 08's two load tests, as functions the notebook and scripts/measure_lab08_serving.py call.

* `compare_engines`: the same server with `--engine naive` (one request at a time, lab 01's cached
  generation) and `--engine continuous` (the engine), side by side, driven by the load generator at
  a set of Poisson request rates, rate by rate naive then engine on the same seeded prompts (fresh
  prompts per rate): output tokens/s, p99 TTFT, goodput per rate.
* `sustained_goodput`: one engine server fed a steady, seeded Poisson stream at each rate for long enough to
  reach steady state; goodput counted over the requests SENT in the steady window (from the send of the first
  request after a warm-up share of the stream to the send of the last), divided by the window's length: what a replica delivers under that load indefinitely, the figure
  to size a fleet on (a short burst measures mostly how fast an idle server empties its queue).
* `compare_routing`: two engine replicas (child processes) behind the router, once per policy (fresh
  replicas each time, so every policy starts with cold prefix caches), on a shared-system-prompt
  workload: prefix-cache hit rate (from the replicas' /metrics) and mean TTFT.
* `serve_trace` (lab 13): a Mooncake-format trace replayed at its timestamps against a fresh server per prefix cache
  (lab 02's hash, lab 13's radix): the server's prefix-cache hit rate over the replay and the client's TTFT,
  inter-token latency and goodput.

The defaults are the notebook's small runs (in-process servers, about 15-20 s each on 2 cores);
scripts/measure_lab08_serving.py runs bigger ones with child processes (processes=True).

A rate is *sustained* when every request of the run was served (no 429, no error, none cut by the
time bound); `highest_common_rate` is the highest rate both engines sustain.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator, Sequence

from minigpt.serving.client_metrics import BenchmarkSummary, RequestRecord, summarize_records
from minigpt.serving.load_generator import benchmark, corpus_prompts, shared_prefix_prompts

__all__ = ["RatePoint", "EngineComparison", "compare_engines", "SustainedPoint", "steady_window_rates", "sustained_goodput", "RoutingPoint",
           "compare_routing", "TraceServed", "serve_trace"]


@dataclass(frozen=True)
class RatePoint:
    """One run at one offered rate (requests/s; inf = all at once)."""
    engine: str
    rate: float
    summary: BenchmarkSummary

    @property
    def output_throughput(self) -> float:
        return self.summary.output_throughput

    @property
    def p99_ttft(self) -> float:
        return self.summary.ttft[99]

    @property
    def sustained(self) -> bool:
        return self.summary.num_ok == self.summary.num_requests

    def row(self) -> str:
        rate = "all at once" if math.isinf(self.rate) else f"{self.rate:g} req/s"
        return f"{self.engine:>10} @ {rate:>11}: {self.summary.row()}"


@dataclass(frozen=True)
class EngineComparison:
    points: list[RatePoint] = field(default_factory=list)

    def series(self) -> dict[str, list[RatePoint]]:
        out: dict[str, list[RatePoint]] = {}
        for p in self.points:
            out.setdefault(p.engine, []).append(p)
        return out

    def highest_common_rate(self, a: str = "naive", b: str = "continuous") -> float | None:
        """The highest offered rate that both engines sustained (every request served), or None."""
        s = self.series()
        ok = lambda name: {p.rate for p in s.get(name, []) if p.sustained}      # noqa: E731
        common = ok(a) & ok(b)
        return max(common) if common else None

    def at(self, engine: str, rate: float) -> RatePoint:
        return next(p for p in self.points if p.engine == engine and p.rate == rate)

    def speedup(self, rate: float | None = None) -> float:
        """continuous / naive output tokens/s at `rate` (default: the highest rate both sustain)."""
        rate = self.highest_common_rate() if rate is None else rate
        if rate is None:
            raise ValueError("no rate was sustained by both engines")
        return self.at("continuous", rate).output_throughput / self.at("naive", rate).output_throughput

    def table(self) -> str:
        return "\n".join(p.row() for p in self.points)


def compare_engines(rates: Sequence[float] = (4.0, math.inf), *, checkpoint: str = "target",
                    num_requests: int = 8, prompt_tokens: int = 32, max_tokens: int = 16, seed: int = 0,
                    threads: int = 1, max_duration: float = 60.0, engine_args: Sequence[str] = (),
                    ttft_limit: float = 1.0, tpot_limit: float = 0.1, processes: bool = False) -> EngineComparison:
    """Naive serving against the engine at each rate. Both servers run side by side (child processes with `threads`
    torch threads and `engine_args` for the continuous one, or with processes=False in this process: fast to start,
    shared GIL, default engine settings); rate by rate, naive then engine get the same workload, so slow drifts in
    the machine's load hit both alike. Each rate has its own prompts (no prefix-cache hits from an earlier rate)."""
    from minigpt.serving.launch import serve_subprocess
    from minigpt.serving.replicas import thread_replicas

    engines = ("naive", "continuous")
    workloads = [corpus_prompts(num_requests, prompt_tokens=prompt_tokens, seed=seed + 1000 * k)
                 for k in range(len(rates))]

    def server(engine: str) -> ContextManager[str]:
        if not processes:
            return _only(thread_replicas(1, checkpoint, engine=engine, max_queue=num_requests + 8))
        return serve_subprocess(["--checkpoint", checkpoint, "--engine", engine, "--threads", str(threads),
                                 "--max-queue", str(num_requests + 8),
                                 *(engine_args if engine == "continuous" else ())])

    points: list[RatePoint] = []
    with contextlib.ExitStack() as stack:
        urls = {engine: stack.enter_context(server(engine)) for engine in engines}
        for url in urls.values():          # first forward passes are slow; the warm-up prompt shares no prefix
            benchmark(url, ["warm-up"], max_tokens=2, max_duration=max_duration)
        for rate, workload in zip(rates, workloads):
            for engine in engines:
                records = benchmark(urls[engine], workload, rate=rate, max_tokens=max_tokens, seed=seed,
                                    max_duration=max_duration)
                points.append(RatePoint(engine, rate, summarize_records(records, ttft_limit=ttft_limit,
                                                                        tpot_limit=tpot_limit)))
    return EngineComparison(points)


@dataclass(frozen=True)
class SustainedPoint:
    """One steady Poisson stream at `rate` req/s; goodput and throughput over the requests sent in the steady window."""
    rate: float
    goodput: float                 # requests sent in the window that met both SLOs, per second of window
    request_throughput: float      # requests sent in the window that were served at all, per second of window
    window_s: float
    sent_in_window: int
    summary: BenchmarkSummary      # the whole stream (warm-up and tail included)

    def row(self) -> str:
        arrived = (self.sent_in_window - 1) / self.window_s
        return (f"{self.rate:g} req/s offered for {self.summary.num_requests} requests: in a {self.window_s:.1f} s "
                f"steady window {self.sent_in_window} requests arrived ({arrived:.2f} req/s; Poisson), served "
                f"{self.request_throughput:.2f} req/s, goodput {self.goodput:.2f} req/s; p99 TTFT "
                f"{1e3 * self.summary.ttft[99]:.0f} ms, p50 TPOT {1e3 * self.summary.tpot[50]:.0f} ms")


def steady_window_rates(records: Sequence[RequestRecord], *, warmup_share: float = 0.25, ttft_limit: float = 1.0,
                        tpot_limit: float = 0.1) -> tuple[float, float, float, int]:
    """(goodput, served rate, window seconds, requests in the window) of one steady stream.

    The first `warmup_share` of the records by send time are the warm-up; the window runs from the next send to
    the last. Its n requests arrived at (n - 1) / window per second; goodput is that rate times the share of them
    that met TTFT <= ttft_limit and TPOT <= tpot_limit (failed ones never count), served rate the share that was
    served at all."""
    if not 0 <= warmup_share < 1:
        raise ValueError(f"warmup_share must be in [0, 1), got {warmup_share}")
    by_send = sorted(records, key=lambda r: r.send_time)
    window = by_send[int(warmup_share * len(by_send)):]
    length = window[-1].send_time - window[0].send_time if len(window) >= 2 else 0.0
    if length <= 0:
        raise ValueError(f"{len(records)} records give no steady window (need two sends after the warm-up, "
                         "at different times): send more requests")
    arrivals = (len(window) - 1) / length
    good = sum(1 for r in window if r.ok and r.ttft <= ttft_limit and r.tpot <= tpot_limit)
    served = sum(1 for r in window if r.ok)
    return arrivals * good / len(window), arrivals * served / len(window), length, len(window)


def sustained_goodput(rates: Sequence[float] = (1.0, 2.0, 3.0), *, checkpoint: str = "target",
                      duration_s: float = 12.0, warmup_share: float = 0.25, prompt_tokens: int = 32,
                      max_tokens: int = 16, seed: int = 0, ttft_limit: float = 1.0, tpot_limit: float = 0.1,
                      max_duration: float = 90.0,
                      on_point: Callable[[SustainedPoint], None] | None = None) -> list[SustainedPoint]:
    """One engine server (in this process), a seeded Poisson stream of ceil(rate * duration_s) requests at each
    rate, fresh prompts per rate. The first `warmup_share` of the requests (by send time) fill the server; the
    window runs from the next send to the last send. Goodput = requests sent in the window that met
    TTFT <= ttft_limit and TPOT <= tpot_limit, per second: the window's arrival rate (n - 1 gaps over its length)
    times the share of its n requests that met both (each followed to its end, however late). `on_point` is
    called with each rate's point as soon as it is measured (a notebook prints it: each rate takes seconds)."""
    from minigpt.serving.replicas import thread_replicas

    points = []
    with _only(thread_replicas(1, checkpoint, max_queue=4 * int(max(rates) * duration_s) + 8)) as url:
        benchmark(url, ["warm-up"], max_tokens=2, max_duration=max_duration)
        for k, rate in enumerate(rates):
            n = math.ceil(rate * duration_s)
            prompts = corpus_prompts(n, prompt_tokens=prompt_tokens, seed=seed + 2000 + 1000 * k)
            records = benchmark(url, prompts, rate=rate, max_tokens=max_tokens, seed=seed, max_duration=max_duration)
            goodput, served, length, sent = steady_window_rates(records, warmup_share=warmup_share,
                                                                ttft_limit=ttft_limit, tpot_limit=tpot_limit)
            points.append(SustainedPoint(rate, goodput, served, length, sent,
                                         summarize_records(records, ttft_limit=ttft_limit, tpot_limit=tpot_limit)))
            if on_point is not None:
                on_point(points[-1])
    return points


@contextlib.contextmanager
def _only(replicas: ContextManager[list[str]]) -> Iterator[str]:
    with replicas as urls:
        yield urls[0]


@dataclass(frozen=True)
class RoutingPoint:
    policy: str
    prefix_hit_rate: float           # cached / looked-up prompt tokens, over both replicas
    requests_per_replica: list[int]
    summary: BenchmarkSummary

    @property
    def mean_ttft(self) -> float:
        return self.summary.mean_ttft

    def row(self) -> str:
        return (f"{self.policy:>11}: prefix-cache hit rate {self.prefix_hit_rate:.1%}, mean TTFT "
                f"{1e3 * self.mean_ttft:.0f} ms, p99 TTFT {1e3 * self.summary.ttft[99]:.0f} ms, requests per replica "
                f"{self.requests_per_replica}, {self.summary.num_ok}/{self.summary.num_requests} ok")


def compare_routing(policies: Sequence[str] = ("round_robin", "prefix"), *, num_replicas: int = 2,
                    checkpoint: str = "target", num_prefixes: int = 6, questions_per_prefix: int = 4,
                    prefix_tokens: int = 128, question_tokens: int = 8, max_tokens: int = 2, rate: float = math.inf,
                    block_size: int = 16, prefix_blocks: int = 4, seed: int = 0, threads: int = 1,
                    max_duration: float = 60.0, processes: bool = False) -> list[RoutingPoint]:
    """Each policy in front of `num_replicas` fresh engine replicas (child processes, or with processes=False
    `thread_replicas` in this process), on the same shared-prefix workload."""
    import httpx

    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.engine import EngineConfig
    from minigpt.serving.replicas import engine_replicas, prefix_hit_rate, thread_replicas
    from minigpt.serving.router import create_router_app

    workload = shared_prefix_prompts(num_prefixes, questions_per_prefix, prefix_tokens=prefix_tokens,
                                     question_tokens=question_tokens, seed=seed)
    out = []
    for policy in policies:
        args = ["--checkpoint", checkpoint, "--block-size", str(block_size),
                "--max-queue", str(len(workload.prompts) + 8)]
        replicas = (engine_replicas(num_replicas, args, threads=threads) if processes else
                    thread_replicas(num_replicas, checkpoint, config=EngineConfig(block_size=block_size),
                                    max_queue=len(workload.prompts) + 8))
        with replicas as urls:
            for url in urls:                  # first forward passes are slow; a short prompt shares no prefix
                benchmark(url, ["warm-up"], max_tokens=2, max_duration=max_duration)
            app = create_router_app(urls, policy=policy, block_size=block_size, prefix_blocks=prefix_blocks)
            with serve_in_thread(app) as router:
                records = benchmark(router, workload, rate=rate, max_tokens=max_tokens, seed=seed,
                                    max_duration=max_duration)
                stats = httpx.get(router + "/stats", trust_env=False).json()["replicas"]
            hit = prefix_hit_rate(urls)
        out.append(RoutingPoint(policy, hit, [stats[u]["requests"] for u in urls], summarize_records(records)))
    return out


@dataclass(frozen=True)
class TraceServed:
    """A trace replayed against one server: the client's summary (TTFT, inter-token latency, goodput) and the
    server's own prefix-cache counters over the replay (prompt tokens looked up and found)."""
    cache: str
    summary: BenchmarkSummary
    queried_tokens: float
    hit_tokens: float

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def serve_trace(records: Sequence, prompts: Sequence[Sequence[int]], *,
                caches: Sequence[str] = ("hash", "radix", "radix+host"), checkpoint: str = "target",
                speed: float = 1.0, threads: int = 1, block_size: int = 16, num_blocks: int = 256,
                host_tier_blocks: int = 256, max_duration: float = 300.0, ttft_limit: float = 1.0,
                tpot_limit: float = 0.1, processes: bool = False) -> list[TraceServed]:
    """Replay a trace (`minigpt.serving.trace`: records and their token prompts) at its timestamps (divided by
    `speed`) against the course's server with each prefix cache ("hash", "radix", or "radix+host": the radix tree
    with a host tier of `host_tier_blocks`), one fresh server at a time (a child process on `threads` threads, or
    with processes=False `thread_replicas` in this process), and read the server's prefix-cache counters (/metrics)
    before and after the replay."""
    from minigpt.serving.engine import EngineConfig
    from minigpt.serving.replicas import engine_replicas, prefix_cache_counters, thread_replicas
    from minigpt.serving.trace import replay_over_http

    out = []
    for cache in caches:
        kind, host = ("radix", host_tier_blocks) if cache == "radix+host" else (cache, 0)
        args = ["--checkpoint", checkpoint, "--prefix-cache", kind, "--block-size", str(block_size),
                "--num-blocks", str(num_blocks), "--max-queue", str(len(records) + 8),
                *(["--host-tier-blocks", str(host)] if host else [])]
        server = (engine_replicas(1, args, threads=threads) if processes else
                  thread_replicas(1, checkpoint, config=EngineConfig(block_size=block_size, num_blocks=num_blocks,
                                                                     prefix_cache=kind, host_tier_blocks=host),
                                  max_queue=len(records) + 8))
        with server as (url,):
            benchmark(url, ["warm-up"], max_tokens=2, max_duration=max_duration)
            queried0, hits0 = prefix_cache_counters(url)
            served = replay_over_http(url, records, prompts, speed=speed, max_duration=max_duration)
            queried1, hits1 = prefix_cache_counters(url)
        out.append(TraceServed(cache, summarize_records(served, ttft_limit=ttft_limit, tpot_limit=tpot_limit),
                               queried1 - queried0, hits1 - hits0))
    return out
