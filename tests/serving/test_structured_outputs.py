"""Structured outputs on the lab 08 server: response_format json_object / json_schema on chat and completions,
streamed and not, with the official openai client's `parse`; grammars compiled once per schema; a schema that cannot
be compiled is a 400 naming the problem. One in-thread server per backend (llguidance, the default, and the course's
compiler) over a tiny seeded model (its values are nonsense: the shape is what the grammar guarantees); every
behaviour is tested on both, what each refuses apart (the keyword coverage: test_structured_coverage.py)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel, Field
from serving_fixtures import structured_servers

from minigpt.serving.structured_outputs import BACKENDS, MAX_REPEAT

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Describe a cat in JSON."}], "max_tokens": 60,
        "temperature": 1.0, "seed": 1}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


class Cat(BaseModel):
    """A tiny model writes strings until max_tokens unless they are bounded."""
    name: str = Field(max_length=10)
    lives: int = Field(ge=0, le=9)
    indoor: bool


@pytest.fixture(scope="module")
def servers(tokenizer):
    """backend -> (url, app): one server per structured-outputs backend."""
    with structured_servers(tokenizer) as found:
        yield found


@pytest.fixture(params=BACKENDS)
def server(request, servers):
    return servers[request.param]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server[0] + path, json=body, timeout=60)


def ok(server, path: str, body: dict) -> dict:
    r = post(server, path, body)
    assert r.status_code == 200, f"{body} -> {r.status_code} {r.text}"
    return r.json()


def json_schema(schema: dict, name: str = "person") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_json_object_is_a_json_object(server):
    data = ok(server, "/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}, "max_tokens": 100})
    choice = data["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict), choice
    else:
        assert choice["finish_reason"] == "length" and choice["message"]["content"].startswith("{"), choice


def test_json_schema_chat_follows_the_schema_in_every_choice(server):
    data = ok(server, "/v1/chat/completions", {**CHAT, "response_format": json_schema(PERSON), "n": 3})
    for choice in data["choices"]:
        assert choice["finish_reason"] == "stop", choice
        doc = json.loads(choice["message"]["content"])
        assert doc.keys() == {"name", "age"} and len(doc["name"]) <= 8 and 0 <= doc["age"] <= 120, doc


def test_json_schema_on_completions_too(server):
    body = {"model": "tiny", "prompt": ["A person:", "Another:"], "max_tokens": 60, "temperature": 1.0, "seed": 2,
            "response_format": json_schema(PERSON)}
    for choice in ok(server, "/v1/completions", body)["choices"]:
        assert choice["finish_reason"] == "stop" and json.loads(choice["text"]).keys() == {"name", "age"}, choice


def test_max_tokens_cuts_with_length(server):
    data = ok(server, "/v1/chat/completions", {**CHAT, "response_format": json_schema(PERSON), "max_tokens": 3})
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"].startswith('{"'), choice


def test_a_streamed_document_is_the_same_document(server):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=60)
    kwargs = dict(model="tiny", messages=CHAT["messages"], max_tokens=60, temperature=1.0, seed=9,
                  response_format=json_schema(PERSON))
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True)
                       if c.choices)
    assert streamed == whole and json.loads(whole).keys() == {"name", "age"}


def test_openai_parse_returns_the_pydantic_model(server):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=60)
    completion = client.chat.completions.parse(model="tiny", messages=CHAT["messages"], response_format=Cat,
                                               max_tokens=80, temperature=0.8, seed=4)
    cat = completion.choices[0].message.parsed
    assert isinstance(cat, Cat), completion.choices[0].message


@pytest.mark.parametrize("backend, schema, words", [
    ("course", {"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}, "format"),
    ("course", {"type": "string", "maxLength": MAX_REPEAT + 1}, "maxLength"),
    ("course", {"type": "integer", "maximum": 10**40}, "maximum"),
    ("course", {"$ref": "#/$defs/missing"}, "$ref"),
    ("llguidance", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ("llguidance", {"$ref": "#/$defs/missing"}, "missing"),
    ("llguidance", {"type": "string", "pattern": "(unclosed"}, "regex"),
])
def test_a_schema_that_cannot_be_compiled_is_a_400_naming_it(servers, backend, schema, words):
    r = post(servers[backend], "/v1/chat/completions", {**CHAT, "response_format": json_schema(schema)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format" and words in error["message"], error


def test_grammars_are_compiled_once_per_schema(server):
    structured = server[1].state.server.structured
    schema = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}
    before = structured.num_compiled
    for seed in range(3):
        ok(server, "/v1/chat/completions", {**CHAT, "seed": seed, "response_format": json_schema(schema)})
    assert structured.num_compiled == before + 1, "the same schema was compiled again"


def test_the_library_takes_what_only_the_course_budget_refuses(servers):
    """The size budget guards the course's compiler (a rule per count, a pattern per digit); llguidance is lazy."""
    for schema in ({"type": "string", "maxLength": MAX_REPEAT + 1}, {"type": "integer", "maximum": 10**40}):
        body = {**CHAT, "max_tokens": 4, "response_format": json_schema(schema)}
        ok(servers["llguidance"], "/v1/chat/completions", body)


def test_a_text_format_changes_nothing(server):
    a = ok(server, "/v1/chat/completions", {**CHAT, "max_tokens": 8})
    b = ok(server, "/v1/chat/completions", {**CHAT, "max_tokens": 8, "response_format": {"type": "text"}})
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
