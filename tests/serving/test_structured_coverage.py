"""Which JSON Schema keywords each structured-outputs backend takes: every keyword below is sent as a chat request's
`response_format` to a server per backend; each answer is a 200 (the backend takes it; a finished document is
checked with jsonschema) or a 400 whose message names the keyword, never anything else. The table this builds is
the one in docs/serving.md ("JSON Schema coverage"), which the test asserts row for row."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest
from serving_fixtures import structured_servers

from minigpt.serving.structured_outputs import BACKENDS

I, S = {"type": "integer"}, {"type": "string", "maxLength": 4}
# keyword -> (an example schema using it, a regex of what its refusal must name)
KEYWORDS: dict[str, tuple[dict, str]] = {
    "format": ({"type": "string", "format": "date"}, "format"),
    "oneOf": ({"oneOf": [I, {"type": "boolean"}]}, "oneOf"),
    "allOf": ({"allOf": [{"type": "object", "properties": {"a": I}, "required": ["a"]},
                         {"type": "object", "properties": {"b": I}}]}, "allOf"),
    "additionalProperties: true": ({"type": "object", "properties": {"a": I}, "additionalProperties": True},
                                   "additionalProperties"),
    "additionalProperties: schema": ({"type": "object", "properties": {"a": I}, "additionalProperties": I},
                                     "additionalProperties"),
    "patternProperties": ({"type": "object", "patternProperties": {"^x": I}}, "patternProperties"),
    "uniqueItems": ({"type": "array", "items": I, "uniqueItems": True}, "uniqueItems"),
    "multipleOf": ({"type": "integer", "multipleOf": 5}, "multipleOf"),
    "fractional minimum/maximum": ({"type": "number", "minimum": 0.5, "maximum": 2.5}, "minimum"),
    "exclusiveMinimum/exclusiveMaximum": ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
                                          "exclusive"),
    "prefixItems": ({"type": "array", "prefixItems": [I, S]}, "prefixItems"),
    "dependentRequired": ({"type": "object", "properties": {"a": I, "b": I}, "dependentRequired": {"a": ["b"]}},
                          "dependentRequired"),
    "if/then/else": ({"type": "object", "properties": {"a": I}, "if": {"properties": {"a": {"const": 1}}},
                      "then": {"required": ["a"]}, "else": {}}, "'(if|then|else)'|\"(if|then|else)\""),
    "not": ({"not": {"type": "string"}}, "not"),
    "anyOf": ({"anyOf": [I, S]}, "anyOf"),
    "enum / const": ({"enum": ["a", 1, None]}, "enum"),
    "pattern": ({"type": "string", "pattern": "^[a-z]{2}$"}, "pattern"),
    "$ref / $defs": ({"$defs": {"n": I}, "type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}, "$ref"),
}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "JSON please."}], "max_tokens": 12,
        "temperature": 1.0, "seed": 3}
DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


@pytest.fixture(scope="module")
def servers(tokenizer):
    with structured_servers(tokenizer) as found:
        yield found


def outcome(server: tuple, keyword: str) -> str:
    """"yes" (200, a finished document valid) or "400" (its message names the keyword); fails on anything else."""
    schema, named = KEYWORDS[keyword]
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    r = httpx.post(server[0] + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code in (200, 400), f"{keyword}: expected 200 or 400, got {r.status_code} {r.text}"
    if r.status_code == 400:
        error = r.json()["error"]
        assert error["param"] == "response_format" and re.search(named, error["message"]), f"{keyword}: {error}"
        return "400"
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), schema,
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)     # formats checked
    return "yes"


def documented_table() -> dict[str, tuple[str, ...]]:
    """docs/serving.md's coverage table: keyword -> (example, one outcome per backend)."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) == 2 + len(BACKENDS):
            rows[cells[0].strip("`")] = (cells[1].strip("`"), *cells[2:])
    return rows


def test_the_documented_coverage_table_is_what_each_backend_does(servers):
    found = {k: (json.dumps(schema, separators=(",", ":")), *(outcome(servers[b], k) for b in BACKENDS))
             for k, (schema, _) in KEYWORDS.items()}
    table = "\n".join(f"| `{k}` | `{ex}` | " + " | ".join(res) + " |" for k, (ex, *res) in found.items())
    print("\n| keyword | example | " + " | ".join(f"`{b}`" for b in BACKENDS) + " |\n" + table)
    assert documented_table() == found, f"docs/serving.md's coverage table should read:\n{table}"


def test_the_default_backend_takes_every_keyword_the_course_takes(servers):
    """The library is the default because it refuses less: nothing the course's compiler takes is lost."""
    lost = [k for k in KEYWORDS
            if outcome(servers["course"], k) == "yes" and outcome(servers["llguidance"], k) != "yes"]
    assert not lost, f"llguidance refuses what the course's compiler takes: {lost}"
