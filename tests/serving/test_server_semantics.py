"""OpenAI semantics of the lab 08 server, one behaviour per test: seeds, n, best_of, logprobs, list prompts, chat
content parts and roles, explicit nulls, 404 model_not_found, 405 with Allow, unsupported features and lax types
refused. One in-thread server over a tiny seeded model for the module (about 10 s on a 2-core machine)."""

from __future__ import annotations

import math

import httpx
import openai
import pytest
from serving_fixtures import tiny_model

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread

CMPL = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8}
FINISH_REASONS = {"stop", "length"}


@pytest.fixture(scope="module")
def server(tokenizer):
    engine = LLMEngine(tiny_model(2), EngineConfig(num_blocks=64, block_size=8), tokenizer=tokenizer,
                       model_name="tiny", adapter_names=("tiny-lora",))
    aengine = AsyncLLMEngine(engine, num_threads=1)
    with serve_in_thread(create_app(aengine, max_queue=8)) as url:
        yield url, engine
    assert not aengine.is_running


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server[0] + path, json=body, timeout=30)


def ok(server, path: str, body: dict) -> dict:
    r = post(server, path, body)
    assert r.status_code == 200, f"{body} -> {r.status_code} {r.text}"
    data = r.json()
    assert all(c["finish_reason"] in FINISH_REASONS for c in data["choices"]), data
    return data


def texts(data: dict) -> list[str]:
    return [c["text"] for c in sorted(data["choices"], key=lambda c: c["index"])]


def test_without_a_seed_sampling_differs_between_calls(server):
    body = {**CMPL, "temperature": 1.0, "max_tokens": 12}
    got = {texts(ok(server, "/v1/completions", body))[0] for _ in range(3)}
    assert len(got) > 1, f"three unseeded samples at temperature 1 were all {got}: no seed must mean a fresh seed"


def test_with_a_seed_sampling_repeats(server):
    body = {**CMPL, "temperature": 1.0, "max_tokens": 12, "seed": 1234}
    a, b = (texts(ok(server, "/v1/completions", body)) for _ in range(2))
    assert a == b


def test_n_choices_are_the_seeds_in_turn(server):
    body = {**CMPL, "temperature": 1.0, "seed": 7}
    many = ok(server, "/v1/completions", {**body, "n": 3})
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    alone = [texts(ok(server, "/v1/completions", {**body, "seed": 7 + i}))[0] for i in range(3)]
    assert texts(many) == alone
    assert many["usage"]["completion_tokens"] == sum(
        ok(server, "/v1/completions", {**body, "seed": 7 + i})["usage"]["completion_tokens"] for i in range(3))


def test_n_choices_stream_by_index(server):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=30)
    kwargs = dict(model="tiny", prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=3, n=2)
    full = client.completions.create(**kwargs)
    parts = ["", ""]
    finished = [None, None]
    for chunk in client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            parts[c.index] += c.text
            finished[c.index] = c.finish_reason or finished[c.index]
    assert parts == [c.text for c in full.choices] and set(finished) <= FINISH_REASONS
    chat = client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=6, n=2, seed=5)
    assert [c.index for c in chat.choices] == [0, 1]


def test_best_of_returns_the_most_likely_candidate(server):
    body = {**CMPL, "temperature": 1.0, "seed": 11}
    candidates = ok(server, "/v1/completions", {**body, "n": 3, "logprobs": 0})["choices"]
    best = max(candidates, key=lambda c: sum(c["logprobs"]["token_logprobs"]))
    got = ok(server, "/v1/completions", {**body, "best_of": 3})
    assert len(got["choices"]) == 1 and got["choices"][0]["logprobs"] is None
    assert got["choices"][0]["text"] == best["text"]


def test_completion_logprobs_legacy_format(server):
    data = ok(server, "/v1/completions", {**CMPL, "temperature": 0, "logprobs": 2})
    lp = data["choices"][0]["logprobs"]
    n = data["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert all(v <= 0 for v in lp["token_logprobs"])
    assert all(len(top) <= 2 for top in lp["top_logprobs"])
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert math.isclose(value, max(top.values()), abs_tol=1e-5), "greedy picks the most likely token"
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert "".join(lp["tokens"]) == data["choices"][0]["text"]
    plain = ok(server, "/v1/completions", {**CMPL, "temperature": 0})
    assert plain["choices"][0]["logprobs"] is None and texts(plain) == texts(data)


def test_chat_logprobs_with_the_openai_client(server):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5)
               for t in content)
    assert bytes(b for t in content for b in t.bytes).decode(errors="replace").startswith(
        reply.choices[0].message.content)
    streamed = [c.choices[0].logprobs for c in client.chat.completions.create(
        model="tiny", messages=CHAT["messages"], max_tokens=6, temperature=0, logprobs=True, stream=True)
        if c.choices and c.choices[0].logprobs]
    assert [t.logprob for lp in streamed for t in lp.content] == pytest.approx([t.logprob for t in content], abs=1e-5)


def test_prompt_lists_of_strings_and_of_token_ids(server, tokenizer):
    prompts = ["Once upon a time", "The cat"]
    one = [texts(ok(server, "/v1/completions", {**CMPL, "prompt": p, "temperature": 0}))[0] for p in prompts]
    both = ok(server, "/v1/completions", {**CMPL, "prompt": prompts, "temperature": 0, "n": 2})
    assert texts(both) == [one[0], one[0], one[1], one[1]]
    ids = [tokenizer.encode(p) for p in prompts]
    assert texts(ok(server, "/v1/completions", {**CMPL, "prompt": ids, "temperature": 0})) == one
    assert texts(ok(server, "/v1/completions", {**CMPL, "prompt": ids[0], "temperature": 0})) == one[:1]
    assert both["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1])


def test_chat_content_parts_and_roles(server):
    plain = ok(server, "/v1/chat/completions", {**CHAT, "temperature": 0})
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    got = ok(server, "/v1/chat/completions", {**CHAT, "temperature": 0,
                                              "messages": [{"role": "user", "content": parts}]})
    assert got["choices"][0]["message"] == plain["choices"][0]["message"]
    system = ok(server, "/v1/chat/completions", {**CHAT, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."}, *CHAT["messages"]]})
    developer = ok(server, "/v1/chat/completions", {**CHAT, "temperature": 0, "messages": [
        {"role": "developer", "content": "Be brief."}, *CHAT["messages"]]})
    assert developer["choices"][0]["message"] == system["choices"][0]["message"]
    ok(server, "/v1/chat/completions", {**CHAT, "messages": [
        *CHAT["messages"], {"role": "assistant", "content": None},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"}, {"role": "user", "content": "And?"}]})


def test_explicit_nulls_mean_the_defaults(server):
    nulls = dict.fromkeys(["temperature", "top_p", "top_k", "n", "seed", "stop", "stream", "stream_options",
                           "logprobs", "best_of", "echo", "suffix", "user"])
    data = ok(server, "/v1/completions", {**CMPL, **nulls, "max_tokens": None})
    assert data["usage"]["completion_tokens"] <= 16 and len(data["choices"]) == 1
    chat_nulls = dict.fromkeys(["temperature", "top_p", "n", "seed", "stop", "stream", "logprobs", "top_logprobs",
                                "tools", "tool_choice", "response_format", "max_completion_tokens", "max_tokens"])
    ok(server, "/v1/chat/completions", {**CHAT, **chat_nulls})


def test_unknown_model_is_404_model_not_found(server):
    for path, body in (("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)):
        r = post(server, path, {**body, "model": "gpt-4"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    r = httpx.get(server[0] + "/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0)
    assert client.models.retrieve("tiny-lora").parent == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)


def test_wrong_method_is_405_with_allow(server):
    r = httpx.get(server[0] + "/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["message"]
    r = httpx.delete(server[0] + "/v1/models")
    assert r.status_code == 405 and r.headers["allow"] == "GET"


TOOL_F = {"type": "function", "function": {"name": "f", "parameters": {}}}


@pytest.mark.parametrize("extra, words", [
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"tool_choice": "required"}, "tools"),
    ({"tools": [TOOL_F], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "'g'"),
    ({"tools": [TOOL_F, TOOL_F]}, "unique"),
    ({"tools": [TOOL_F], "response_format": {"type": "json_object"}}, "response_format"),
])
def test_unsupported_features_are_refused(server, extra, words):
    r = post(server, "/v1/chat/completions", {**CHAT, **extra})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    ok(server, "/v1/chat/completions", {**CHAT, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none"})


@pytest.mark.parametrize("field, value", [("stream", "yes"), ("temperature", "0.5"), ("n", "2"), ("max_tokens", True),
                                          ("seed", 1.5), ("logprobs", "1")])
def test_lax_types_are_refused(server, field, value):
    """Strings and booleans for numbers are refused; a whole number written 2.0 is JSON Schema's integer 2."""
    r = post(server, "/v1/completions", {**CMPL, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_whole_numbers_written_with_a_fraction_are_integers(server):
    a = ok(server, "/v1/completions", {**CMPL, "max_tokens": 3.0, "seed": 5.0, "n": 1.0, "temperature": 1.0})
    b = ok(server, "/v1/completions", {**CMPL, "max_tokens": 3, "seed": 5, "n": 1, "temperature": 1.0})
    assert texts(a) == texts(b) and a["usage"]["completion_tokens"] <= 3
