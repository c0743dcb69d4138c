"""Faults do not spread (lab 08): a request's bad numbers or its failing step end that request alone, on both
engines; a non-streaming client that leaves is noticed and its slot and KV blocks freed within a second.
About 6 s on a 2-core machine."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from serving_fixtures import tiny_model

import minigpt.engine.runner
import minigpt.serving.naive
from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.naive import NaiveEngine
from minigpt.serving.replicas import read_metrics

CMPL = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
POISON_SEED = 666


@pytest.fixture(scope="module", params=["continuous", "naive"])
def server(request, tokenizer):
    if request.param == "naive":
        engine = NaiveEngine(tiny_model(3), tokenizer=tokenizer, model_name="tiny")
    else:
        engine = LLMEngine(tiny_model(3), EngineConfig(num_blocks=64, block_size=8), tokenizer=tokenizer,
                           model_name="tiny")
    aengine = AsyncLLMEngine(engine, num_threads=1)
    with serve_in_thread(create_app(aengine, max_queue=16, disconnect_poll_s=0.1)) as url:
        yield url, aengine
    assert not aengine.is_running


@pytest.fixture
def poisoned_sampling(monkeypatch):
    """Sampling raises for the requests seeded POISON_SEED (a stand-in for any failure of one request's work)."""
    real = minigpt.engine.runner.sample_next

    def flaky(logits, params, generator=None):
        if params.seed == POISON_SEED:
            raise RuntimeError("injected sampling failure")
        return real(logits, params, generator)
    monkeypatch.setattr(minigpt.engine.runner, "sample_next", flaky)
    monkeypatch.setattr(minigpt.serving.naive, "sample_next", flaky)


async def _together(url: str, aengine: AsyncLLMEngine, requests: list[tuple[str, dict]]) -> list[tuple[int, str]]:
    """Send the requests while the engine is paused, so that they share steps; (status, body text) of each."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        aengine.pause()
        try:
            tasks = [asyncio.ensure_future(client.post(path, json=body)) for path, body in requests]
            for _ in range(200):
                if read_metrics(url)["minigpt_server_requests_in_flight"] == len(requests):
                    break
                await asyncio.sleep(0.02)
        finally:
            aengine.resume()
        return [(r.status_code, r.text) for r in await asyncio.gather(*tasks)]


def _stream_text(body: str) -> tuple[str, list[dict]]:
    events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")), chunks


def _alone(url: str) -> dict:
    return {"cmpl": httpx.post(url + "/v1/completions", json=CMPL, timeout=30).json()["choices"][0]["text"],
            "chat": httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=30).json()["choices"][0]}


@pytest.mark.parametrize("extreme", [{"temperature": 1e-300}, {"temperature": 5e-324}, {"top_p": 5e-324},
                                     {"temperature": 1e-38, "top_p": 1e-46}])
def test_tiny_temperature_or_top_p_is_its_limit_and_hurts_nobody(server, extreme):
    url, aengine = server
    alone = _alone(url)
    got = asyncio.run(_together(url, aengine, [
        ("/v1/completions", {**CMPL, "temperature": 1.0, **extreme, "seed": 5}),
        ("/v1/completions", {**CMPL, "stream": True}),
        ("/v1/chat/completions", CHAT)]))
    assert [s for s, _ in got] == [200, 200, 200], got
    tiny = json.loads(got[0][1])["choices"][0]
    if "temperature" in extreme:                          # temperature -> 0 is greedy
        assert tiny["text"] == alone["cmpl"]
    assert _stream_text(got[1][1])[0] == alone["cmpl"]
    assert json.loads(got[2][1])["choices"][0] == alone["chat"]
    assert aengine.stats().num_blocks_used == 0 and aengine.num_step_errors == 0


def test_a_failing_request_fails_alone(server, poisoned_sampling):
    url, aengine = server
    alone = _alone(url)
    bad = {**CMPL, "temperature": 1.0, "seed": POISON_SEED}
    got = asyncio.run(_together(url, aengine, [
        ("/v1/completions", bad),
        ("/v1/completions", {**CMPL, "stream": True}),
        ("/v1/completions", {**bad, "stream": True}),
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", CMPL)]))
    assert [s for s, _ in got] == [500, 200, 200, 200, 200], got
    assert json.loads(got[0][1])["error"]["code"] == "engine_error"
    assert "injected sampling failure" in json.loads(got[0][1])["error"]["message"]
    text, chunks = _stream_text(got[2][1])
    assert chunks[-1]["error"]["code"] == "engine_error", "a failed stream ends with an error event, then [DONE]"
    assert not any(c["finish_reason"] not in (None, "stop", "length") for ch in chunks for c in ch.get("choices", []))
    assert _stream_text(got[1][1])[0] == alone["cmpl"]
    assert json.loads(got[3][1])["choices"][0] == alone["chat"]
    assert json.loads(got[4][1])["choices"][0]["text"] == alone["cmpl"]
    assert aengine.stats().num_blocks_used == 0 and aengine.is_running and aengine.num_step_errors == 0


def test_non_streaming_disconnect_frees_its_slot_and_blocks_within_a_second(server):
    url, aengine = server
    aengine.pause(after_steps=3)                  # the request is running (holding blocks) when the client leaves
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json={**CMPL, "max_tokens": 100}, timeout=httpx.Timeout(10, read=0.5))
        left = time.monotonic()
        while time.monotonic() - left < 5:
            m = read_metrics(url)
            if m["minigpt_server_requests_in_flight"] == 0 and m["minigpt_kv_blocks_used"] == 0 \
                    and m["minigpt_requests_running"] == 0:
                break
            time.sleep(0.02)
        freed_after = time.monotonic() - left
    finally:
        aengine.resume()
    assert freed_after < 1.0, f"slot and blocks freed {freed_after:.2f} s after the client left (want < 1 s): {m}"
