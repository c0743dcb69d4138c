"""minigpt.structured.grammar and json_schema: the compiled grammar accepts exactly the compact documents a schema
accepts (checked with the `jsonschema` validator on held-out documents), unsupported keywords are named errors, and
the next-token masks equal XGrammar's along seeded random paths on the course tokenizer, except in strings with
minLength/maxLength, where XGrammar 0.2.8 allows no escape and does allow a raw tab (which json.loads rejects: RFC
8259 requires control characters escaped): `test_xgrammars_bounded_strings_differ_where_json_says_so` pins that."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import numpy as np
import pytest
import torch
import xgrammar

from minigpt.structured.evaluation import xgrammar_json_options, xgrammar_tokenizer_info
from minigpt.structured.grammar import CharSet, Grammar
from minigpt.structured.json_schema import (compile_json_schema, integer_range_pattern, json_object_grammar,
                                            number_range_pattern, whole_string_pattern)
from minigpt.structured.token_masks import mask_by_scan, mask_by_trie
from minigpt.tokenizer import load_tokenizer

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "email": {"type": "string", "pattern": "[a-z]+@[a-z]+\\.(com|org)"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    "admin": {"type": "boolean"},
    "score": {"type": ["number", "null"]}}, "required": ["name", "age"]}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
    "required": ["value"]}}, "$ref": "#/$defs/node"}
CHOICE = {"anyOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                     "required": ["kind", "r"]},
                    {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
                     "required": ["kind", "side"]}]}


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


DOCUMENTS = {
    "person": (PERSON, [
        {"name": "Ada", "age": 36}, {"name": "Bo", "age": 0, "admin": True}, {"name": "x", "age": 130, "score": None},
        {"name": "Lin", "age": 7, "email": "lin@mail.org", "tags": ["a", "c"], "admin": False, "score": -1.5e3},
        {"name": "", "age": 3}, {"name": "Ada", "age": 131}, {"name": "Ada", "age": -1}, {"age": 4},
        {"name": "Ada", "age": 36, "extra": 1}, {"name": "Ada", "age": 36, "tags": []},
        {"name": "Ada", "age": 36, "tags": ["a", "b", "c", "a"]}, {"name": "Ada", "age": 36, "tags": ["d"]},
        {"name": "Ada", "age": 36, "email": "ada@mail.net"}, {"name": "toolongname", "age": 1},
        {"name": "Ada", "age": 2.5}, {"name": "q\"uote", "age": 1}]),
    "tree": (TREE, [{"value": 1}, {"value": -4, "children": [{"value": 2}, {"value": 3, "children": []}]},
                    {"value": 1, "children": [{"value": 1}, {"value": 2}, {"value": 3}]}, {"children": []},
                    {"value": "1"}]),
    "choice": (CHOICE, [{"kind": "circle", "r": 2.0}, {"kind": "square", "side": 3}, {"kind": "square", "r": 1},
                        {"kind": "circle", "side": 2}, {"kind": "triangle", "r": 1}]),
    "bounded": ({"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
                                                  "k": {"type": "integer", "exclusiveMinimum": 0},
                                                  "any": {}}, "required": ["p", "k"]},
                [{"p": 0.5, "k": 1}, {"p": 1.0, "k": 99999}, {"p": 0, "k": 3, "any": [1, {"a": None}]},
                 {"p": 1.5, "k": 1}, {"p": -0.25, "k": 1}, {"p": 0.5, "k": 0}, {"p": 0.5, "k": -3}]),
}


@pytest.mark.parametrize("name", DOCUMENTS)
def test_the_grammar_accepts_what_the_schema_accepts(name):
    schema, documents = DOCUMENTS[name]
    grammar = compile_json_schema(schema)
    validator = jsonschema.Draft202012Validator({**schema, **({"additionalProperties": False} if name == "person" else {})})
    for doc in documents:
        assert grammar.matches(compact(doc)) == validator.is_valid(doc), compact(doc)


def test_only_the_compact_form_in_the_schemas_order_is_accepted():
    grammar = compile_json_schema(PERSON)
    assert grammar.matches('{"name":"Ada","age":36}')
    assert not grammar.matches('{"name": "Ada", "age": 36}')          # whitespace
    assert not grammar.matches('{"age":36,"name":"Ada"}')             # order
    assert grammar.matches('{"name":"\\u00e9\\n","age":1}')           # escapes count as one character each


@pytest.mark.parametrize("low, high", [(0, 0), (0, 9), (0, 130), (7, 7), (13, 2031), (-15, 4), (-300, -20), (99, 100),
                                       (1000, 1000), (5, 59), (120, 989)])
def test_integer_ranges_match_exactly_the_integers_in_them(low, high):
    pattern = re.compile(integer_range_pattern(low, high))
    for n in range(min(low, -1) - 30, max(high, 1) + 30):
        assert bool(pattern.fullmatch(str(n))) == (low <= n <= high), (low, high, n)
    assert not pattern.fullmatch("-0") and not pattern.fullmatch("007")


@pytest.mark.parametrize("low, high", [(0, None), (1, None), (37, None), (None, 0), (None, -12), (None, 250), (-5, None)])
def test_one_sided_integer_ranges(low, high):
    pattern = re.compile(integer_range_pattern(low, high))
    for n in [*range(-400, 400), 10 ** 6, -10 ** 6, 10 ** 12]:
        assert bool(pattern.fullmatch(str(n))) == ((low is None or n >= low) and (high is None or n <= high)), n


@pytest.mark.parametrize("low, high", [(0, 1), (-3, 7), (-20, -4), (0, None), (None, 0), (5, None), (None, -5), (2, 2)])
def test_bounded_numbers_match_exactly_the_decimals_in_them(low, high):
    """Whole-number bounds on `number`: every decimal -?int(.digits)? in [low, high] matches, nothing else does
    (seeded random decimals, compared as Decimals, so 7.000 is 7 and 7.001 is not)."""
    from decimal import Decimal
    pattern = re.compile(number_range_pattern(low, high))
    rng = random.Random(low or 0)
    for _ in range(4000):
        fraction = rng.choice(["", ".0", ".000", f".{rng.randint(0, 999)}", f".00{rng.randint(1, 9)}"])
        text = rng.choice(["", "-"]) + str(rng.randint(0, 60)) + fraction
        if text.startswith("-") and Decimal(text) == 0:
            continue                                     # -0 and -0.0: equal to 0, not written by a sane model
        inside = (low is None or Decimal(text) >= low) and (high is None or Decimal(text) <= high)
        assert bool(pattern.fullmatch(text)) == inside, text
    assert not pattern.fullmatch("1e0") and not pattern.fullmatch("01")


@pytest.mark.parametrize("pattern, compiled", [
    (r"^\d{4}-\d{2}-\d{2}$", r"\d{4}-\d{2}-\d{2}"),
    (r"^(a|b)c$", r"(a|b)c"),
    (r"^[|x]+$", r"[|x]+"),                          # a "|" in a class is a character
    (r"^a|b$", r"a|b"),                              # "starts with a, or ends with b": whole strings a or b
    (r"^a\|b$", r"a\|b"),
    (r"^ab\$", r"ab\$"),                            # an escaped "$" is no anchor
    (r"[0-9]+", r"[0-9]+"),
])
def test_patterns_match_whole_strings_never_more_than_the_schema(pattern, compiled):
    """A JSON Schema pattern is searched anywhere in the string; the grammar matches `compiled` against the whole
    string: every string it admits, the schema admits (equal where the pattern is anchored at both ends)."""
    assert whole_string_pattern(pattern) == compiled
    for text in ["2024-01-02", "ac", "bc", "||x", "a|b", "abc", "x2024-01-02", "a", "b", "ab$", "xab$", "7"]:
        if re.fullmatch(compiled, text):
            assert re.search(pattern, text), text
    assert compile_json_schema({"type": "string", "pattern": pattern}).matches('"2024-01-02"') == \
        bool(re.fullmatch(compiled, "2024-01-02"))


def test_unconstrained_values_and_json_object_mode():
    anything = compile_json_schema({})
    for doc in ['[1,"a",true,null,{"x":[]}]', "3.5e2", '"\\u00e9"', "{}"]:
        assert anything.matches(doc), doc
    objects = json_object_grammar()
    for doc, ok in [("{}", True), ('{"a":[1,{"b":null}],"c":"x"}', True), ("[]", False), ("1", False),
                    ('{"a":}', False), ('{"a":1,}', False), ('{"a" :1}', False)]:
        assert objects.matches(doc) == ok, doc
    assert compile_json_schema({"type": "object", "properties": {"x": True}}).matches('{"x":[null]}')


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "format": "email"}, "format"),
    ({"type": "object", "patternProperties": {}}, "patternProperties"),
    ({"type": "integer", "minimum": 3.5}, "keyword 'minimum' must be a whole number"),
    ({"type": "number", "minimum": 0.5, "maximum": 2}, "keyword 'minimum' must be a whole number"),
    ({"type": "number", "exclusiveMinimum": 0}, "is not supported on type 'number'"),
    ({"type": "integer", "minimum": 3, "maximum": 2}, "no integer lies in [3, 2]"),
    ({"type": "object", "additionalProperties": True}, "additionalProperties"),
    ({"oneOf": [{"type": "null"}]}, "oneOf"),
    ({"$ref": "#/definitions/x"}, "#/definitions/x"),
    ({"type": "string", "pattern": "(?<=a)b"}, "keyword 'pattern'"),                  # interegular has no look-behind
])
def test_unsupported_keywords_are_named(schema, keyword):
    with pytest.raises(ValueError, match=re.escape(keyword)):
        compile_json_schema(schema)


def test_a_left_recursive_rule_is_refused():
    g = Grammar("list")
    g.rule("list", ["list", ",", "item"], ["item"])
    g.rule("item", [CharSet.of("ab")])
    with pytest.raises(ValueError, match="left-recursive"):
        g.check()


def _bits(words: torch.Tensor, size: int) -> np.ndarray:
    return ((words.reshape(-1, 1) >> torch.arange(32)) & 1).flatten()[:size].bool().numpy()


def _xgrammar(schema, vocab):
    """XGrammar's matcher for `schema` (compact JSON, strict) on the course tokenizer, and a bitmask buffer."""
    info = xgrammar_tokenizer_info(load_tokenizer())
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(schema), **xgrammar_json_options())
    return xgrammar.GrammarMatcher(compiled), xgrammar.allocate_token_bitmask(1, len(vocab))


UNBOUNDED_NAME = {**PERSON, "properties": {**PERSON["properties"], "name": {"type": "string"}}}
AGAINST_XGRAMMAR = {"person": UNBOUNDED_NAME, "tree": TREE, "choice": CHOICE}


@pytest.mark.parametrize("name", AGAINST_XGRAMMAR)
def test_the_masks_equal_xgrammars_along_random_paths(name, vocab, trie):
    schema = AGAINST_XGRAMMAR[name]
    matcher, bitmask = _xgrammar(schema, vocab)
    grammar = compile_json_schema(schema)
    has_text = np.array([t is not None for t in vocab.texts])
    rng = random.Random(name)
    for _path in range(2):                  # a step inside a string walks most of the trie: ~0.1 s each
        matcher.reset()
        state = grammar.start_state()
        for _step in range(28):
            ours = mask_by_trie(grammar, state, trie).numpy()
            matcher.fill_next_token_bitmask(bitmask)
            theirs = _bits(bitmask[0], len(vocab))
            differ = np.nonzero((ours != theirs) & has_text)[0]
            assert not len(differ), (name, [(vocab.texts[t], bool(ours[t])) for t in differ[:6]])
            choices = [t for t in np.nonzero(ours)[0].tolist() if t != vocab.eos_id]
            if not choices:
                break
            token = rng.choice(choices)
            assert matcher.accept_token(token)
            state = grammar.walk(state, vocab.texts[token])


def test_xgrammars_bounded_strings_differ_where_json_says_so(vocab, trie):
    schema = {"type": "string", "minLength": 1, "maxLength": 8}
    matcher, bitmask = _xgrammar(schema, vocab)
    enc = load_tokenizer()
    assert matcher.accept_token(enc.encode('"')[0])
    matcher.fill_next_token_bitmask(bitmask)
    theirs = _bits(bitmask[0], len(vocab))
    grammar = compile_json_schema(schema)
    ours = mask_by_trie(grammar, grammar.walk(grammar.start_state(), '"'), trie).numpy()
    tab, backslash = enc.encode("\t")[0], enc.encode("\\")[0]
    assert theirs[tab] and not ours[tab]                       # a raw tab: XGrammar allows it, JSON does not
    with pytest.raises(json.JSONDecodeError, match="control character"):
        json.loads('"a\tb"')
    assert ours[backslash] and not theirs[backslash]           # an escape: valid JSON, XGrammar refuses it here
    assert grammar.matches('"\\u00e9"') and json.loads('"\\u00e9"') == "\u00e9"


def test_scan_and_trie_agree_on_a_grammar(vocab, trie):
    grammar = compile_json_schema(PERSON)
    state = grammar.walk(grammar.start_state(), '{"name":"A')
    assert torch.equal(mask_by_scan(grammar, state, vocab), mask_by_trie(grammar, state, trie))
