"""Engine replicas (lab 08): several `python -m minigpt.serving` servers as separate processes, and their metrics.

Each replica is its own process (its own engine, KV pool and prefix cache, its own Python and
torch threads), started with `minigpt.serving.launch.serve_subprocess` and stopped when the block
ends, as a data-parallel deployment does on one machine per replica.

    with engine_replicas(2, ["--checkpoint", "draft"]) as urls:
        with serve_in_thread(create_router_app(urls, policy="prefix")) as router: ...

`thread_replicas` starts them in this process instead (fast, for notebooks and tests; shared GIL).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from minigpt.serving.load_generator import check_loopback

__all__ = ["engine_replicas", "thread_replicas", "read_metrics", "prefix_cache_counters", "prefix_hit_rate"]


@contextlib.contextmanager
def engine_replicas(n: int = 2, args: Sequence[str] = ("--checkpoint", "draft"), *, threads: int = 1,
                    timeout: float = 180.0) -> Iterator[list[str]]:
    """Start n replicas (`python -m minigpt.serving *args --threads threads`) at once; yield their base URLs;
    stop every one on exit (also when a start fails)."""
    from minigpt.serving.launch import serve_subprocess

    if n < 1:
        raise ValueError(f"need at least one replica, got {n}")
    with contextlib.ExitStack() as stack:
        managers = [serve_subprocess([*args, "--threads", str(threads)], timeout=timeout) for _ in range(n)]
        with ThreadPoolExecutor(max_workers=n) as pool:       # the children load their models concurrently
            futures = [pool.submit(m.__enter__) for m in managers]
            urls, errors = [], []
            for m, f in zip(managers, futures):
                try:
                    urls.append(f.result())
                    stack.push(m)                             # started: its __exit__ stops it
                except BaseException as err:                  # noqa: BLE001 - re-raised below, after cleanup
                    errors.append(err)
        if errors:
            raise errors[0]
        yield urls


@contextlib.contextmanager
def thread_replicas(n: int = 2, checkpoint: str = "draft", *, engine: str = "continuous",
                    config: object | None = None, max_queue: int = 64) -> Iterator[list[str]]:
    """n replicas in THIS process, each with its own model, engine thread and uvicorn thread: a second to start
    instead of several, for notebooks; they share one Python (GIL) and torch's threads, so timings are rougher
    than with `engine_replicas`. engine: "continuous" (LLMEngine with `config`) or "naive" (NaiveEngine)."""
    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import EngineConfig, LLMEngine
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.naive import NaiveEngine

    if engine not in ("continuous", "naive"):
        raise ValueError(f"engine must be 'continuous' or 'naive', got {engine!r}")
    with contextlib.ExitStack() as stack:
        urls = []
        for _ in range(n):
            core = (NaiveEngine.from_checkpoint(checkpoint) if engine == "naive"
                    else LLMEngine.from_checkpoint(checkpoint, config or EngineConfig()))
            urls.append(stack.enter_context(serve_in_thread(create_app(AsyncLLMEngine(core), max_queue=max_queue))))
        yield urls


def read_metrics(base_url: str) -> dict[str, float]:
    """GET /metrics of a server on loopback, as {sample name (with labels, if any): value}."""
    text = httpx.get(check_loopback(base_url) + "/metrics", timeout=10.0, trust_env=False).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


def prefix_cache_counters(base_url: str) -> tuple[float, float]:
    """(prompt tokens looked up in, found in) a server's prefix cache since it started: its
    `minigpt_prefix_cache_queried_tokens_total` and `minigpt_prefix_cache_hit_tokens_total`."""
    m = read_metrics(base_url)
    return m.get("minigpt_prefix_cache_queried_tokens_total", 0.0), m.get("minigpt_prefix_cache_hit_tokens_total", 0.0)


def prefix_hit_rate(replica_urls: Sequence[str]) -> float:
    """Prefix-cache hit rate over replicas: tokens found / tokens looked up, summed over them (`prefix_cache_counters`)."""
    counters = [prefix_cache_counters(url) for url in replica_urls]
    queried, hits = sum(q for q, _ in counters), sum(h for _, h in counters)
    return hits / queried if queried else 0.0
