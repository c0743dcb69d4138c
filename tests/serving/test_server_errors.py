"""Bad input gets 400 with an OpenAI-style error body, a full queue 429 + Retry-After; /metrics parses;
nothing a client sends leaks a block or stops the engine thread."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serving_fixtures import tiny_model
from prometheus_client.parser import text_string_to_metric_families

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread

OK = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
OK_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tokenizer):
    engine = LLMEngine(tiny_model(1), EngineConfig(num_blocks=32, block_size=8), tokenizer=tokenizer,
                       model_name="tiny", adapter_names=("tiny-lora-a",))
    aengine = AsyncLLMEngine(engine, num_threads=1)
    with serve_in_thread(create_app(aengine, max_queue=2, retry_after_s=3)) as url:
        yield url, aengine
    assert not aengine.is_running


CASES = [
    ("/v1/completions", b"{not json", None),
    ("/v1/completions", b"[1, 2]", None),
    ("/v1/completions", b"", None),
    ("/v1/completions", {"model": "tiny"}, "prompt"),
    ("/v1/completions", {**OK, "prompt": "word " * 200}, "prompt"),
    ("/v1/completions", {**OK, "max_tokens": 10_000}, "prompt"),
    ("/v1/completions", {**OK, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {**OK, "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {**OK, "temperature": -0.5}, "temperature"),
    ("/v1/completions", {**OK, "temperature": 3}, "temperature"),
    ("/v1/completions", {**OK, "top_p": 0}, "top_p"),
    ("/v1/completions", {**OK, "top_p": 1.5}, "top_p"),
    ("/v1/completions", {**OK, "top_k": 0}, "top_k"),
    ("/v1/completions", {**OK, "n": 17}, "n"),
    ("/v1/completions", {**OK, "n": 3, "best_of": 2}, None),
    ("/v1/completions", {**OK, "best_of": 2, "stream": True}, None),
    ("/v1/completions", {**OK, "prompt": []}, "prompt"),
    ("/v1/completions", {**OK, "prompt": ""}, "prompt"),
    ("/v1/completions", {**OK, "prompt": ["a", ""]}, "prompt"),
    ("/v1/completions", {**OK, "prompt": [5000]}, "prompt"),
    ("/v1/completions", {**OK, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/completions", {**OK, "prompt": [1.5, True]}, "prompt"),
    ("/v1/completions", {**OK, "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {**OK, "logprobs": 6}, "logprobs"),
    ("/v1/completions", {**OK, "echo": True}, "echo"),
    ("/v1/completions", {**OK, "suffix": "x"}, "suffix"),
    ("/v1/completions", {**OK, "seed": -1}, "seed"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"role": "tool", "content": "42"}]}, "messages.0.tool_call_id"),
    ("/v1/chat/completions", {**OK_CHAT, "max_completion_tokens": 500}, "prompt"),
    ("/v1/chat/completions", {**OK_CHAT, "top_logprobs": 2}, None),
    ("/v1/chat/completions", {**OK_CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
]


@pytest.mark.parametrize("path, body, param", CASES)
def test_bad_requests_get_400_with_an_openai_error_body(server, path, body, param):
    url, aengine = server
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert aengine.stats().num_blocks_used == 0 and aengine.is_running


def test_openai_client_raises_bad_request(server):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=0)


def test_adapter_names_are_served_models(server):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny", "tiny-lora-a"]


def test_full_queue_gets_429_with_retry_after(server):
    url, aengine = server
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
    import asyncio

    async def scenario():
        aengine.pause()
        try:
            held = [asyncio.ensure_future(client.completions.create(model="tiny", prompt="a b c", max_tokens=3))
                    for _ in range(2)]
            async with httpx.AsyncClient(base_url=url, timeout=10) as raw:
                for _ in range(100):
                    if "minigpt_server_requests_in_flight 2.0" in (await raw.get("/metrics")).text:
                        break
                    await asyncio.sleep(0.02)
                r = await raw.post("/v1/completions", json=OK)
            with pytest.raises(openai.RateLimitError):
                await client.completions.create(model="tiny", prompt="x", max_tokens=2)
        finally:
            aengine.resume()
        done = await asyncio.gather(*held)
        return r, done
    r, done = asyncio.run(scenario())
    assert r.status_code == 429 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert all(d.choices[0].finish_reason in ("stop", "length") for d in done)
    assert httpx.post(url + "/v1/completions", json=OK, timeout=10).status_code == 200


def test_health_and_metrics_parse(server):
    url, _ = server
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)}
    for name in ("minigpt_requests_running", "minigpt_requests_waiting", "minigpt_kv_blocks_used",
                 "minigpt_kv_blocks_total", "minigpt_kv_cache_usage_ratio", "minigpt_prefix_cache_hit_rate",
                 "minigpt_prefix_cache_hit_tokens", "minigpt_prefix_cache_queried_tokens", "minigpt_requests",
                 "minigpt_time_to_first_token_seconds", "minigpt_inter_token_latency_seconds",
                 "minigpt_e2e_request_latency_seconds", "minigpt_generation_tokens", "minigpt_batch_size"):
        assert name in families, name
    assert families["minigpt_kv_blocks_total"].samples[0].value == 32
    outcomes = {s.labels["outcome"] for s in families["minigpt_requests"].samples if s.name.endswith("_total")}
    assert outcomes == {"stop", "length", "abort", "invalid", "rejected"}


def test_disconnect_while_queued_frees_the_slot_and_the_request(server):
    """A streaming client that leaves before its request ever ran (engine paused): its admission slot is given
    back and the request leaves the engine's queue (aborted)."""
    import time
    url, aengine = server

    def metric(name: str) -> float:
        fams = text_string_to_metric_families(httpx.get(url + "/metrics").text)
        return next(s.value for f in fams for s in f.samples if s.name == name)
    aborted = metric_with(url, "abort")
    aengine.pause()
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**OK, "stream": True}, timeout=10) as r:
            assert r.status_code == 200
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (metric("minigpt_server_requests_in_flight") or
                                               metric("minigpt_requests_waiting")):
            time.sleep(0.02)
        assert metric("minigpt_server_requests_in_flight") == 0 and metric("minigpt_requests_waiting") == 0
        assert metric_with(url, "abort") == aborted + 1
    finally:
        aengine.resume()


def metric_with(url: str, outcome: str) -> float:
    fams = text_string_to_metric_families(httpx.get(url + "/metrics").text)
    return next(s.value for f in fams for s in f.samples
                if s.name == "minigpt_requests_total" and s.labels.get("outcome") == outcome)
