"""LangChain against the lab 08 server, as an agent framework drives it: `ChatOpenAI.with_structured_output` (a
pydantic model, sent as response_format json_schema) returns an instance of the model, and `bind_tools` (tools as pydantic
models) with a named tool or tool_choice "required" returns OpenAI tool calls that LangChain parses into `AIMessage.tool_calls`. One
in-thread server over a tiny seeded model; no network (LangSmith tracing off)."""

from __future__ import annotations

import dataclasses

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from serving_fixtures import TINY_SERVING, tiny_model

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread


class Cat(BaseModel):
    """A cat (strings bounded: a tiny model writes a string until max_tokens otherwise)."""
    name: str = Field(max_length=10)
    lives: int = Field(ge=0, le=9)
    indoor: bool


class get_weather(BaseModel):
    """The weather in a city for the next few days."""
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


class add(BaseModel):
    """Add two integers."""
    a: int = Field(ge=-99, le=99)
    b: int = Field(ge=-99, le=99)


@pytest.fixture(scope="module")
def chat(tokenizer, monkeypatch_module):
    monkeypatch_module.setenv("LANGSMITH_TRACING", "false")
    monkeypatch_module.setenv("LANGCHAIN_TRACING_V2", "false")
    model = tiny_model(5, dataclasses.replace(TINY_SERVING, max_seq_len=512))    # the tools paragraph is long
    engine = LLMEngine(model, EngineConfig(num_blocks=160, block_size=8), tokenizer=tokenizer, model_name="tiny")
    app = create_app(AsyncLLMEngine(engine, num_threads=1), max_queue=8)
    with serve_in_thread(app) as url:
        yield ChatOpenAI(base_url=url + "/v1", api_key="unused", model="tiny", temperature=1.0, seed=3,
                         max_tokens=80, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_with_structured_output_returns_the_model(chat):
    cat = chat.with_structured_output(Cat).invoke("Describe a cat.")
    assert isinstance(cat, Cat) and 0 <= cat.lives <= 9 and len(cat.name) <= 10


def test_with_structured_output_json_mode_and_raw(chat):
    out = chat.with_structured_output(Cat, method="json_schema", include_raw=True).invoke("A cat, please.")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Cat)
    assert out["raw"].response_metadata["finish_reason"] == "stop"


@pytest.mark.parametrize("tool_choice", ["get_weather", "required"])
def test_bind_tools_returns_tool_calls(chat, tool_choice):
    message = chat.bind_tools([get_weather, add], tool_choice=tool_choice).invoke("What is the weather in Oslo?")
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call["id"].startswith("call_") and call["name"] in ("get_weather", "add")
    if tool_choice == "get_weather":
        assert call["name"] == "get_weather"
    schema = {"get_weather": get_weather, "add": add}[call["name"]]
    schema(**call["args"])                       # the arguments validate against the tool's own model


def test_bind_tools_streams_a_tool_call(chat):
    chunks = list(chat.bind_tools([add], tool_choice="add").stream("Add two numbers."))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert len(merged.tool_calls) == 1 and merged.tool_calls[0]["name"] == "add"
    add(**merged.tool_calls[0]["args"])
