"""Soak test (lab 08's Reliability section): a few thousand mixed requests against one in-thread server.

Streaming and not, completions and chat, streams cancelled mid-way, malformed JSON, bad parameters, over-long
prompts, and more concurrency than the admission queue holds (some 429s). A tiny seeded random model keeps it
fast. Afterwards every KV block is free, nothing runs or waits, the engine thread never failed, the /metrics
counters agree with what the client saw, and the server still answers.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter

import httpx
import pytest
from serving_fixtures import tiny_model

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.replicas import read_metrics

pytestmark = pytest.mark.timeout(240)      # bounded: about 12 s on a quiet 2-core machine

NUM_REQUESTS = 3000
CONCURRENCY = 24
MAX_QUEUE = 22
SEED = 2024
MALFORMED = [b"{", b"not json", b"", b"[]", b"null", b'{"model": "tiny", "prompt": "x", "max_tokens": 2',
             b"\xff\xfe\x00", b'{"model": "tiny"}', b'{"prompt": "hi"}']


def _request(rng: random.Random, i: int) -> tuple[str, str, bytes | dict]:
    """(kind, path, body) for request i."""
    r = rng.random()
    words = " ".join(rng.choice(["cache", "block", "token", "the", "of", "é", "🙂", "def", "(", "\n"])
                     for _ in range(rng.randint(1, 12)))
    sampling = {"temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randint(0, 99), "max_tokens": rng.randint(1, 4)}
    chat = rng.random() < 0.3
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = ({"model": "tiny", "messages": [{"role": "user", "content": words}]} if chat
            else {"model": "tiny", "prompt": words if rng.random() < 0.7 else [rng.randint(0, 4095) for _ in range(5)]})
    if r < 0.12:
        return "malformed", path, rng.choice(MALFORMED)
    if r < 0.24:
        bad = rng.choice([{"temperature": -1}, {"top_p": 0}, {"max_tokens": 0}, {"max_tokens": 10**6}, {"n": 17},
                          {"model": "unknown"}, {"top_k": -3}, {"stop": [""]}, {"temperature": "hot"}])
        return "bad_params", path, {**body, **sampling, **bad}
    if r < 0.35:
        return "overlong", "/v1/completions", {"model": "tiny", "prompt": [7] * rng.randint(129, 400), "max_tokens": 4}
    if r < 0.65:
        return "complete", path, {**body, **sampling}
    if r < 0.85:
        return "stream", path, {**body, **sampling, "stream": True, "stream_options": {"include_usage": rng.random() < .5}}
    return "cancel", path, {**body, **sampling, "max_tokens": 60, "stream": True}     # fits: prompt <= 60 tokens


async def _drive(url: str) -> tuple[Counter, Counter, float]:
    rng = random.Random(SEED)
    plan = [_request(rng, i) for i in range(NUM_REQUESTS)]
    kinds, outcomes = Counter(k for k, _, _ in plan), Counter()
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY + 4, max_keepalive_connections=CONCURRENCY + 4)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        async def one(kind: str, path: str, body: bytes | dict) -> None:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers = {"content-type": "application/json"}
            async with gate:
                if kind not in ("stream", "cancel"):
                    r = await client.post(path, content=content, headers=headers)
                    outcomes["done" if r.status_code == 200 else r.status_code] += 1
                    return
                async with client.stream("POST", path, content=content, headers=headers) as r:
                    if r.status_code != 200:
                        await r.aread()
                        outcomes[r.status_code] += 1
                        return
                    last = None
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            last = line
                            if kind == "cancel":
                                break            # leaving the block closes the connection mid-stream
                    outcomes["cancelled" if kind == "cancel" and last != "data: [DONE]" else "done"] += 1
                    if kind == "stream":
                        assert last == "data: [DONE]"
        t0 = time.perf_counter()
        await asyncio.gather(*(one(*p) for p in plan))
        return kinds, outcomes, time.perf_counter() - t0


def test_soak_mixed_requests(tokenizer):
    engine = LLMEngine(tiny_model(3), EngineConfig(num_blocks=96, block_size=8, max_num_seqs=16,
                                                   max_num_batched_tokens=128), tokenizer=tokenizer, model_name="tiny")
    aengine = AsyncLLMEngine(engine, num_threads=1)
    with serve_in_thread(create_app(aengine, max_queue=MAX_QUEUE, retry_after_s=1)) as url:
        kinds, outcomes, seconds = asyncio.run(_drive(url))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:          # aborts of the last disconnects may still be in flight
            m = read_metrics(url)
            if m["minigpt_server_requests_in_flight"] == 0 and m["minigpt_requests_running"] == 0:
                break
            time.sleep(0.05)
        print(f"\nsoak: {NUM_REQUESTS} requests in {seconds:.1f} s; kinds {dict(kinds)}; client outcomes "
              f"{dict(outcomes)}; server counters { {k: v for k, v in m.items() if k.startswith('minigpt_requests_total')} }")
        assert sum(outcomes.values()) == NUM_REQUESTS
        assert set(outcomes) <= {"done", "cancelled", 400, 404, 429}, outcomes
        refused = outcomes[400] + outcomes[404]               # 404: an unknown model (model_not_found)
        assert refused == kinds["malformed"] + kinds["bad_params"] + kinds["overlong"]
        assert m['minigpt_requests_total{outcome="invalid"}'] == refused
        assert m['minigpt_requests_total{outcome="rejected"}'] == outcomes[429]
        finished = m['minigpt_requests_total{outcome="stop"}'] + m['minigpt_requests_total{outcome="length"}']
        aborted = m['minigpt_requests_total{outcome="abort"}']
        assert finished + aborted == outcomes["done"] + outcomes["cancelled"]
        assert aborted <= outcomes["cancelled"] and finished >= outcomes["done"]
        assert m["minigpt_kv_blocks_used"] == 0 and m["minigpt_requests_waiting"] == 0
        assert m["minigpt_server_requests_in_flight"] == 0 and aengine.num_step_errors == 0
        assert engine.scheduler.sequences == {} and aengine.num_streams == 0
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "still there?", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert not aengine.is_running
