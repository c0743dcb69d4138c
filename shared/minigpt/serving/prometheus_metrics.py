"""The server's /metrics (lab 08): Prometheus text format through prometheus-client, one registry per app.

Names (all prefixed `minigpt_`), read by the lab's live dashboard and the load generator:

    gauges (read from the engine at scrape time)
      minigpt_requests_running            sequences in the running batch
      minigpt_requests_waiting            requests queued in the engine (admitted, not running)
      minigpt_server_requests_in_flight   requests the server holds (each has an admission slot)
      minigpt_kv_blocks_used / minigpt_kv_blocks_total / minigpt_kv_cache_usage_ratio
      minigpt_prefix_cache_hit_rate       prompt tokens found in the prefix cache / prompt tokens looked up
      minigpt_prefix_cache_queried_tokens_total, minigpt_prefix_cache_hit_tokens_total   (counters) its two terms
      minigpt_batch_size                  sequences in the last step;  minigpt_batch_tokens: tokens in it
      minigpt_preemptions_total           (counter) sequences preempted so far
      minigpt_engine_steps_total          (counter) model steps so far
    counters
      minigpt_requests_total{outcome}     stop | length | abort (finished in the engine),
                                          invalid (400) | rejected (429) (refused by the server)
      minigpt_prompt_tokens_total, minigpt_generation_tokens_total
    histograms (seconds)
      minigpt_time_to_first_token_seconds, minigpt_inter_token_latency_seconds, minigpt_e2e_request_latency_seconds
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.outputs import RequestOutput

__all__ = ["ServingMetrics", "OUTCOMES", "CONTENT_TYPE"]

OUTCOMES = ("stop", "length", "abort", "invalid", "rejected")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
                   3.0, 5.0, 7.5, 10.0, 20.0, 40.0)


class _EngineCollector(Collector):
    """Gauges computed from the engine's latest stats snapshot at each scrape."""

    def __init__(self, engine: AsyncLLMEngine, in_flight: Callable[[], int]) -> None:
        self.engine, self.in_flight = engine, in_flight

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.engine.stats()
        for name, doc, value in [
            ("minigpt_requests_running", "Sequences in the running batch", s.num_running),
            ("minigpt_requests_waiting", "Requests queued in the engine, not running yet", s.num_waiting),
            ("minigpt_server_requests_in_flight", "Requests the server holds (admission slots taken)", self.in_flight()),
            ("minigpt_kv_blocks_used", "KV cache blocks in use", s.num_blocks_used),
            ("minigpt_kv_blocks_total", "KV cache blocks in the pool", s.num_blocks),
            ("minigpt_kv_cache_usage_ratio", "Fraction of KV blocks in use", s.kv_usage),
            ("minigpt_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / looked up", s.prefix_cache_hit_rate),
            ("minigpt_batch_size", "Sequences in the last model step", s.last_batch_size),
            ("minigpt_batch_tokens", "Tokens in the last model step", s.last_batched_tokens),
        ]:
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily("minigpt_preemptions", "Sequences preempted (recomputation)", value=s.num_preemptions)
        yield CounterMetricFamily("minigpt_engine_steps", "Model steps", value=s.num_steps)
        yield CounterMetricFamily("minigpt_prefix_cache_queried_tokens", "Tokens looked up in the prefix cache on admission",
                                  value=s.prefix_cache_queried_tokens)
        yield CounterMetricFamily("minigpt_prefix_cache_hit_tokens", "Tokens found in the prefix cache on admission",
                                  value=s.prefix_cache_hit_tokens)


class ServingMetrics:
    """Per-app metrics: observes the engine's outputs (in the engine thread) and the server's refusals."""

    def __init__(self, engine: AsyncLLMEngine, in_flight: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("minigpt_requests", "Requests by outcome", ["outcome"], registry=self.registry)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)                  # every outcome present from the start, at 0
        self.prompt_tokens = Counter("minigpt_prompt_tokens", "Prompt tokens of finished requests", registry=self.registry)
        self.generation_tokens = Counter("minigpt_generation_tokens", "Generated tokens", registry=self.registry)
        self.ttft = Histogram("minigpt_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS,
                              registry=self.registry)
        self.itl = Histogram("minigpt_inter_token_latency_seconds", "Time between two tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("minigpt_e2e_request_latency_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS,
                             registry=self.registry)
        self.registry.register(_EngineCollector(engine, in_flight))
        engine.add_observer(self.observe)

    def observe(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            if out.new_token_ids:
                self.generation_tokens.inc(len(out.new_token_ids))
                if out.itl is not None:
                    self.itl.observe(out.itl)
                elif out.num_output_tokens == len(out.new_token_ids) and out.ttft is not None:
                    self.ttft.observe(out.ttft)
            if out.finished:
                self.requests.labels(out.finish_reason or "abort").inc()
                self.prompt_tokens.inc(out.num_prompt_tokens)
                if out.token_time is not None and out.first_token_time is not None:
                    self.e2e.observe(out.token_time - out.arrival_time)

    def refused(self, outcome: str) -> None:
        """A request the server answered with an error: "invalid" (400) or "rejected" (429)."""
        self.requests.labels(outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
