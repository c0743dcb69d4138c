"""presence_penalty, frequency_penalty and logit_bias on the lab 08 server: applied (not silently ignored), bounded
(NaN, inf, out-of-range values and token ids outside the vocabulary are a 400), and published that way in
/openapi.json. One in-thread server over a tiny seeded model."""

from __future__ import annotations

import re

import httpx
import pytest
from serving_fixtures import tiny_model

from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread

CMPL = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
VOCAB = 4096


@pytest.fixture(scope="module")
def server(tokenizer):
    engine = LLMEngine(tiny_model(7), EngineConfig(num_blocks=64, block_size=8), tokenizer=tokenizer, model_name="tiny")
    with serve_in_thread(create_app(AsyncLLMEngine(engine, num_threads=1), max_queue=8)) as url:
        yield url


def complete(server, **extra) -> httpx.Response:
    return httpx.post(server + "/v1/completions", json={**CMPL, **extra}, timeout=60)


def tokens(server, **extra) -> list[int]:
    r = complete(server, logprobs=0, **extra)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_logit_bias_forces_and_forbids_tokens(server, tokenizer):
    (the,) = tokenizer.encode(" the")
    forced = tokens(server, logit_bias={str(the): 100})
    assert set(forced) == {" the"}, forced
    greedy = tokens(server)
    banned = tokens(server, logit_bias={str(tokenizer.encode(greedy[0])[0]): -100})
    assert banned[0] != greedy[0], "a -100 bias still let the greedy token through"


def test_frequency_penalty_stops_a_greedy_loop(server, tokenizer):
    (the,) = tokenizer.encode(" the")
    loop = tokens(server, logit_bias={str(the): 5}, max_tokens=24)
    penalized = tokens(server, logit_bias={str(the): 5}, max_tokens=24, frequency_penalty=2.0)
    assert penalized.count(" the") < loop.count(" the"), (loop, penalized)


def test_presence_penalty_changes_greedy_output(server):
    assert tokens(server, presence_penalty=2.0, max_tokens=24) != tokens(server, presence_penalty=-2.0, max_tokens=24)


@pytest.mark.parametrize("extra, param", [
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"1": 101}}, "logit_bias"), ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {str(VOCAB): 1}}, "logit_bias"), ({"logit_bias": {"-1": 1}}, "logit_bias"),
])
def test_out_of_range_values_are_a_400(server, extra, param):
    r = complete(server, **extra)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith(param), r.text


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinite_penalties_are_a_400(server, value):
    body = '{"model": "tiny", "prompt": "Hi", "max_tokens": 2, "presence_penalty": %s}' % value
    r = httpx.post(server + "/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text


def test_the_published_schema_bounds_them(server):
    schema = httpx.get(server + "/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]
    props = schema["properties"]
    for name in ("presence_penalty", "frequency_penalty"):
        number = props[name]["anyOf"][0]
        assert (number["minimum"], number["maximum"]) == (-2, 2), number
    bias = props["logit_bias"]["anyOf"][0]
    assert bias["additionalProperties"]["minimum"] == -100 and bias["additionalProperties"]["maximum"] == 100
    pattern = re.compile(bias["propertyNames"]["pattern"])
    assert pattern.match("0") and pattern.match(str(VOCAB - 1)) and not pattern.match(str(VOCAB))
    assert not pattern.match("01") and not pattern.match("-1")
