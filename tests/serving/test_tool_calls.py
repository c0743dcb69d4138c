"""Tool calls on the lab 08 server (minigpt.serving.tool_calls): a named function, "required", "auto" and "none",
whole and streamed as OpenAI streams them, through the official openai client; the chat template shows tools and
calls given back. One in-thread server per structured-outputs backend (llguidance, the default, and the course's
compiler) over a tiny seeded model: its arguments are nonsense of the right shape."""

from __future__ import annotations

import dataclasses
import json
from contextlib import ExitStack

import httpx
import openai
import pytest
from serving_fixtures import TINY_SERVING, tiny_model

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.chat_template import render_chat
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.structured_outputs import BACKENDS

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                    "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}}
NOOP = {"type": "function", "function": {"name": "noop"}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def servers(tokenizer):
    """backend -> url: a server per structured-outputs backend (every test below runs on both)."""
    with ExitStack() as stack:
        found = {}
        for backend in BACKENDS:
            model = tiny_model(6, dataclasses.replace(TINY_SERVING, max_seq_len=512))   # the tools paragraph is long
            engine = LLMEngine(model, EngineConfig(num_blocks=128, block_size=8), tokenizer=tokenizer,
                               model_name="tiny")
            app = create_app(AsyncLLMEngine(engine, num_threads=1), max_queue=8, structured_outputs_backend=backend)
            found[backend] = stack.enter_context(serve_in_thread(app))
        yield found


@pytest.fixture(scope="module", params=BACKENDS)
def server(request, servers):
    return servers[request.param]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=60)


def create(client, **kwargs):
    return client.chat.completions.create(**{"model": "tiny", "messages": MESSAGES, "tools": [WEATHER, NOOP],
                                             "max_tokens": 60, "temperature": 1.0, "seed": 3, **kwargs})


def check_weather_arguments(arguments: str) -> None:
    args = json.loads(arguments)
    assert args.keys() == {"city", "unit"} and len(args["city"]) <= 10 and args["unit"] in ("C", "F"), args


def test_a_named_function_is_called_with_arguments_of_its_schema(client):
    choice = create(client, tool_choice=NAMED).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    check_weather_arguments(call.function.arguments)


def test_required_calls_one_of_the_tools(client):
    for seed in range(3):
        choice = create(client, tool_choice="required", seed=seed).choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
        call = choice.message.tool_calls[0]
        assert call.function.name in ("get_weather", "noop"), call
        if call.function.name == "get_weather":
            check_weather_arguments(call.function.arguments)
        else:
            assert json.loads(call.function.arguments) == {}, call


def test_auto_is_text_or_one_call(client, tokenizer):
    for seed in range(3):
        message = create(client, tool_choice="auto", seed=seed, max_tokens=30).choices[0].message
        assert (message.tool_calls is None and isinstance(message.content, str)) or \
               (message.content is None and len(message.tool_calls) == 1), message
    (brace,) = tokenizer.encode("{")
    choice = create(client, seed=0, logit_bias={str(brace): 100}).choices[0]       # auto is the default with tools
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name in ("get_weather", "noop")
    text = create(client, seed=0, logit_bias={str(brace): -100}, max_tokens=8).choices[0]
    assert text.message.tool_calls is None and not text.message.content.startswith("{"), text


def test_none_answers_in_text(client):
    message = create(client, tool_choice="none", max_tokens=8).choices[0].message
    assert message.tool_calls is None and isinstance(message.content, str)


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_a_streamed_call_is_the_same_call(client, tool_choice):
    whole = create(client, tool_choice=tool_choice).choices[0]
    chunks = [c for c in create(client, tool_choice=tool_choice, stream=True) if c.choices]
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant" and not deltas[0].tool_calls, "the first delta names the role"
    header = deltas[1].tool_calls[0]
    assert (header.index, header.type, header.function.arguments) == (0, "function", "")
    assert header.id.startswith("call_") and header.function.name == whole.message.tool_calls[0].function.name
    arguments = "".join(tc.function.arguments or "" for d in deltas[2:] for tc in d.tool_calls or [])
    assert arguments == whole.message.tool_calls[0].function.arguments
    assert all(not d.content for d in deltas), "a call streams no content"
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_a_cut_call_ends_with_length(client):
    choice = create(client, tool_choice=NAMED, max_tokens=3).choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls[0].function.arguments.startswith("{")


@pytest.mark.parametrize("backend, parameters, keyword", [
    ("llguidance", {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, "uniqueItems"),
    ("course", {"type": "object", "patternProperties": {}}, "patternProperties"),
])
@pytest.mark.parametrize("tool_choice", ["required", "auto", {"type": "function", "function": {"name": "bad"}}])
def test_tool_parameters_that_cannot_be_compiled_are_a_400(servers, backend, parameters, keyword, tool_choice):
    url = servers[backend]
    bad = {"type": "function", "function": {"name": "bad", "parameters": parameters}}
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "tools": [bad, NOOP],
                                                        "tool_choice": tool_choice}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "'bad'" in r.json()["error"]["message"] and keyword in r.json()["error"]["message"], r.text


def test_a_conversation_with_calls_given_back_is_accepted(client):
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    reply = create(client, messages=messages, tool_choice="none", max_tokens=4).choices[0]
    assert reply.finish_reason in ("stop", "length")


def test_the_plain_template_shows_tools_and_calls():
    text = render_chat([*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "rain"}], tools=[WEATHER])
    assert text.startswith("Tools (") and "- get_weather: The weather in a city. Arguments: {" in text, text
    assert 'Assistant: {"name":"get_weather","arguments":{"city":"Oslo"}}\n\nTool: rain\n\nAssistant:' in text, text
    assert render_chat(MESSAGES) == "User: What is the weather in Paris?\n\nAssistant:", "no tools: unchanged"
