"""minigpt.structured.json_schema against llguidance, on generated schemas and documents: wherever both compile a
schema, the course grammar accepts a compact document exactly where llguidance's JSON-schema matcher (compact
separators, no whitespace, over the course tokenizer, fed one byte token at a time) ends in an accepting state;
every document the course accepts is valid to `jsonschema` (Draft 2020-12; the only check where llguidance refuses
the schema);
where the course refuses it, the ValueError names a keyword the schema uses (or says no finite document exists).

The schemas (hypothesis, derandomized) combine what the course compiles: every type, type lists with per-type
keywords, string bounds and anchored patterns (JSON Schema searches an unanchored pattern, the course matches it
whole: a difference the course documents), integer and whole-number bounds, enum/const beside a type, objects
(`additionalProperties: false`, keys with a quote or a non-ASCII character), arrays, anyOf with sibling keywords,
and $ref with sibling keywords. The documents are drawn near the schema (its properties in order, its enum values,
strings over an alphabet with a quote, a backslash, a newline, é and 😀) and among small JSON values at large,
written as compact JSON with non-ASCII characters raw. Left out, where the two engines differ on purpose: numbers
with exponents or -0, floats equal to integers, and non-canonical spellings (\\u escapes of printable characters).
"""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minigpt.structured.evaluation import llguidance_json_options, llguidance_tokenizer
from minigpt.structured.json_schema import compile_json_schema
from minigpt.tokenizer import load_tokenizer

KEYS = ["a", "b", "é", 'q"']
ALPHABET = 'ab"\\é😀\n '
PATTERNS = {r"^[a-z]+$": ["ab", "", "a1"], r"^a\\b$": ["a\\b", "ab"], r'^"?[ab]*$': ['"ab', "ab", 'a"'],
            r"^[é😀a]{1,2}$": ["é", "😀a", "", "ééé"], r"^(ab|c)*$": ["abc", "ac", ""], r"^[0-9]{2}$": ["12", "1"],
            r"^a.b$": ['a"b', "a\nb", "a\\b", "ab"]}
TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]
SETTINGS = settings(derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# Schemas

small_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(ALPHABET, max_size=3),
                         st.sampled_from([0.5, -2.25]))
bound = st.integers(-4, 4)
strings = st.one_of(
    st.fixed_dictionaries({"type": st.just("string")}, optional={"minLength": st.integers(0, 2),
                                                                 "maxLength": st.integers(0, 3)}),
    st.fixed_dictionaries({"type": st.just("string"), "pattern": st.sampled_from(sorted(PATTERNS))}))
integers = st.fixed_dictionaries({"type": st.just("integer")}, optional={
    "minimum": bound, "maximum": bound, "exclusiveMinimum": bound, "exclusiveMaximum": bound})
numbers = st.fixed_dictionaries({"type": st.just("number")}, optional={"minimum": bound, "maximum": bound})
enums = st.one_of(
    st.fixed_dictionaries({"enum": st.lists(small_values, min_size=1, max_size=4, unique_by=compact)},
                          optional={"type": st.sampled_from(TYPES[:5]), "maxLength": st.integers(0, 2)}),
    st.fixed_dictionaries({"const": small_values}, optional={"type": st.sampled_from(TYPES[:5])}))
type_lists = st.fixed_dictionaries(
    {"type": st.lists(st.sampled_from(TYPES[:5]), min_size=2, max_size=3, unique=True)},
    optional={"maxLength": st.integers(0, 3), "minimum": bound, "maximum": bound})
leaves = st.one_of(strings, integers, numbers, st.just({"type": "boolean"}), st.just({"type": "null"}), enums,
                   type_lists, st.just({}))


def compound(children: st.SearchStrategy) -> st.SearchStrategy:
    objects = st.lists(st.tuples(st.sampled_from(KEYS), children), max_size=3, unique_by=lambda kv: kv[0]).flatmap(
        lambda members: st.fixed_dictionaries({
            "type": st.just("object"), "properties": st.just(dict(members)), "additionalProperties": st.just(False),
            "required": st.lists(st.sampled_from([k for k, _ in members] or ["a"]), max_size=len(members),
                                 unique=True).map(lambda r: [k for k in r if k in dict(members)])}))
    arrays = st.fixed_dictionaries({"type": st.just("array"), "items": children},
                                   optional={"minItems": st.integers(0, 2), "maxItems": st.integers(0, 3)})
    any_of = st.fixed_dictionaries({"anyOf": st.lists(children, min_size=1, max_size=3)}, optional={
        "maxLength": st.integers(0, 3), "maximum": bound, "type": st.sampled_from(["string", "integer", "null"])})
    return st.one_of(objects, arrays, any_of)


bodies = st.recursive(leaves, compound, max_leaves=5)
with_refs = st.tuples(bodies, st.fixed_dictionaries({}, optional={"maxLength": st.integers(0, 3), "maximum": bound,
                                                                  "type": st.sampled_from(TYPES[:5])})).map(
    lambda pair: {"$defs": {"d": pair[0]}, "$ref": "#/$defs/d", **pair[1]})
schemas = st.one_of(bodies, bodies, with_refs)


# Documents

def near(schema, defs) -> st.SearchStrategy:
    """Values shaped like `schema`'s (valid or nearly: the constraints are not enforced), or small values at large."""
    if not isinstance(schema, dict) or not schema:
        return small_values
    if "$ref" in schema:
        return near(defs[schema["$ref"].split("/")[-1]], defs)
    if "enum" in schema or "const" in schema:
        return st.one_of(st.sampled_from(schema.get("enum") or [schema.get("const")]), small_values)
    if "anyOf" in schema:
        return st.one_of(*[near(b, defs) for b in schema["anyOf"]])
    kinds = schema["type"] if isinstance(schema.get("type"), list) else [schema.get("type")]
    out = []
    for kind in kinds:
        if kind == "string":
            out.append(st.sampled_from(PATTERNS[schema["pattern"]]) if "pattern" in schema
                       else st.text(ALPHABET, max_size=4))
        elif kind in ("integer", "number"):
            out.append(st.integers(-6, 6) if kind == "integer" else st.one_of(st.integers(-6, 6),
                                                                               st.sampled_from([0.5, -3.75, 4.5])))
        elif kind == "object":
            props = schema.get("properties", {})
            members = [st.one_of(st.tuples(st.just(k), near(v, defs)), st.none()) for k, v in props.items()]
            extra = st.one_of(st.none(), st.none(), st.just(("extra", 1)))
            out.append(st.tuples(*members, extra).map(lambda kvs: dict(kv for kv in kvs if kv is not None)))
        elif kind == "array":
            out.append(st.lists(near(schema["items"], defs), max_size=4))
        else:
            out.append(st.sampled_from([True, False] if kind == "boolean" else [None]))
    return st.one_of(*out, small_values)


# The engines

@pytest.fixture(scope="module")
def llg():
    """llguidance's verdict on a schema: a function text -> accepted, or None where it refuses the schema."""
    enc = load_tokenizer()
    tokenizer = llguidance_tokenizer(enc)
    byte_tokens = [enc.encode_single_token(bytes([b])) for b in range(256)]

    def compile_schema(schema):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, llguidance_json_options())
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            return None

        def accepts(text: str) -> bool:
            run = matcher.deep_copy()                         # a fresh one: an error state outlives reset()
            return run.consume_tokens([byte_tokens[b] for b in text.encode()]) and run.is_accepting()
        return accepts
    return compile_schema


def keywords_of(schema) -> set[str]:
    """Every keyword used anywhere in `schema`."""
    if isinstance(schema, list):
        return set().union(*map(keywords_of, schema)) if schema else set()
    if not isinstance(schema, dict):
        return set()
    inside = [v for k, v in schema.items() if k not in ("enum", "const", "properties")]
    inside += list(schema.get("properties", {}).values())
    return set(schema) | keywords_of(inside)


@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_the_course_grammar_agrees_with_llguidance(data, llg):
    schema = data.draw(schemas, label="schema")
    try:
        grammar = compile_json_schema(schema)
    except ValueError as err:
        named = re.search(r"keywords? '([^']+)'", str(err))
        assert named and named[1] in keywords_of(schema) or "derives no finite string" in str(err), \
            f"{compact(schema)}: {err} names no keyword the schema uses"
        return
    documents = data.draw(st.lists(near(schema, schema.get("$defs", {})), min_size=6, max_size=6), label="documents")
    theirs = llg(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for doc in documents:
        text = compact(doc)
        ours = grammar.matches(text)
        if theirs is not None:
            assert ours == theirs(text), f"{compact(schema)}: on {text} the course says {ours}, llguidance {not ours}"
        if ours:                                   # and, llguidance or not, never looser than the schema
            assert validator.is_valid(doc), f"{compact(schema)}: the course accepts {text}, jsonschema does not"
