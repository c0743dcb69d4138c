"""The OpenAI-compatible server with the official openai client (lab 08): completions and chat, streamed and not."""

from __future__ import annotations

import openai
import pytest
from serving_fixtures import tiny_model

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread


@pytest.fixture(scope="module")
def server(tokenizer):
    engine = LLMEngine(tiny_model(0), EngineConfig(num_blocks=64, block_size=8), tokenizer=tokenizer, model_name="tiny")
    aengine = AsyncLLMEngine(engine, num_threads=1)
    with serve_in_thread(create_app(aengine, max_queue=8)) as url:
        yield url, engine
    assert not aengine.is_running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_completion_streamed_equals_not_streamed(client):
    full = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0)
    assert full.usage.completion_tokens == 12 and full.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_chat_streamed_equals_not_streamed(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content


def test_models_and_all_blocks_free(client, server):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert server[1].stats().num_blocks_used == 0
