"""minigpt.structured.json_schema exact or refusing (issue 58): no keyword is dropped (enum beside type, siblings of
anyOf and $ref), maxLength counts code points, every grammar it returns can be finished with the course tokenizer's
tokens (escaped pattern characters, non-ASCII characters, pruned dead branches), what no document can satisfy is a
ValueError naming why, a per-type keyword in a type list constrains its type only, and jump-forward reads forced
non-ASCII text whole."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from minigpt.structured.constrained import generate_constrained
from minigpt.structured.grammar import CharSet, Grammar, literal
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import mask_by_trie
from minigpt.tokenizer import load_tokenizer


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def agrees_with_jsonschema(schema, documents) -> None:
    """The grammar accepts a compact document exactly where `jsonschema` (Draft 2020-12) does."""
    grammar = compile_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for doc in documents:
        assert grammar.matches(compact(doc)) == validator.is_valid(doc), \
            f"{compact(schema)}: the grammar says {grammar.matches(compact(doc))} on {compact(doc)}, jsonschema not"


def finish(grammar, trie, seed: int = 0, steps: int = 64) -> str:
    """Decode with the mask alone (the end token as soon as it is allowed, else a token that makes the text a whole
    document, else a seeded random allowed one): the text, or an AssertionError where the mask allows nothing before
    the grammar accepts (a dead end)."""
    rng, vocab = random.Random(seed), trie.vocab
    state, text = grammar.start_state(), ""
    for _ in range(steps):
        mask = mask_by_trie(grammar, state, trie)
        if mask[vocab.eos_id]:
            return text
        choices = mask.nonzero().flatten().tolist()
        assert choices, f"dead end after {text!r}: no token is allowed and the grammar does not accept"
        closing = [t for t in choices if grammar.accepting(grammar.walk(state, vocab.texts[t]))]
        token = rng.choice(closing or choices)
        text += vocab.texts[token]
        state = grammar.walk(state, vocab.texts[token])
    raise AssertionError(f"not finished in {steps} tokens: {text!r}")


def assert_the_masks_allow(grammar, trie, text: str) -> None:
    """Every token of `text` as the course tokenizer writes it is allowed in turn, and then the end token."""
    vocab, state = trie.vocab, grammar.start_state()
    for token in load_tokenizer().encode(text):
        assert mask_by_trie(grammar, state, trie)[token], f"{vocab.texts[token]!r} refused in {text!r}"
        state = grammar.walk(state, vocab.texts[token])
    assert mask_by_trie(grammar, state, trie)[vocab.eos_id], f"the end token refused after {text!r}"


# 1. Looser than the schema

@pytest.mark.parametrize("schema, documents", [
    ({"type": "integer", "enum": [1, 2, "4"]}, [1, 2, "4", 3]),
    ({"type": "string", "enum": ["a", None]}, ["a", None, "b"]),                     # OpenAPI's nullable, written wrong
    ({"type": "string", "maxLength": 2, "enum": ["ab", "abc"]}, ["ab", "abc"]),
    ({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"],
      "enum": [{"k": 1}, {"k": "x"}]}, [{"k": 1}, {"k": "x"}, {"k": 2}]),
])
def test_enum_and_const_keep_only_the_values_their_siblings_accept(schema, documents):
    agrees_with_jsonschema(schema, documents)


@pytest.mark.parametrize("schema", [{"type": "integer", "enum": ["4", None]}, {"enum": []},
                                    {"type": "string", "const": 3}])
def test_an_enum_no_value_survives_is_refused(schema):
    with pytest.raises(ValueError, match="'enum'|'const'"):
        compile_json_schema(schema)


@pytest.mark.parametrize("schema, documents", [
    ({"maxLength": 3, "anyOf": [{"type": "string"}, {"type": "integer"}]}, ["abc", "abcd", 12345]),
    ({"maximum": 10, "anyOf": [{"type": "integer"}, {"type": "null"}]}, [10, 11, None]),
    ({"type": "integer", "anyOf": [{"minimum": 5}, {"maximum": -5}]}, [5, 0, -5, "x"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "additionalProperties": False, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
     [{"a": 1}, {"b": 2}, {}, {"a": 1, "b": 2}]),
    ({"type": "string", "anyOf": [{"type": ["string", "null"], "minLength": 2}, {"type": "integer"}]},
     ["ab", "a", None, 3]),
])
def test_keywords_beside_anyof_apply_to_every_branch(schema, documents):
    agrees_with_jsonschema(schema, documents)


@pytest.mark.parametrize("schema, documents", [
    ({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2}, ["ab", "abc", 1]),
    ({"$defs": {"n": {"type": "integer", "minimum": 0}}, "$ref": "#/$defs/n", "maximum": 3}, [0, 3, 4, -1]),
    ({"$defs": {"n": {"type": "integer"}}, "type": "object", "additionalProperties": False,
      "properties": {"x": {"$ref": "#/$defs/n", "enum": [1, "1"]}}, "required": ["x"]},
     [{"x": 1}, {"x": "1"}, {"x": 3}]),
])
def test_keywords_beside_ref_apply_too(schema, documents):
    agrees_with_jsonschema(schema, documents)


@pytest.mark.parametrize("schema, keyword", [
    ({"properties": {"a": {"type": "string"}}, "anyOf": [{"type": "object", "properties": {"b": {}}}]}, "properties"),
    ({"$defs": {"o": {"type": "array", "items": {"type": "string"}}}, "$ref": "#/$defs/o", "items": {}}, "items"),
    ({"pattern": "a+", "anyOf": [{"type": "string", "pattern": "b+"}]}, "pattern"),
])
def test_a_sibling_the_compiler_cannot_merge_is_named(schema, keyword):
    with pytest.raises(ValueError, match=re.escape(f"keyword {keyword!r}")):
        compile_json_schema(schema)


def test_max_length_counts_code_points_not_escapes():
    """😀 is one code point (len 1 in Python, 1 to JSON Schema) spelled as two UTF-16 escapes, a surrogate pair."""
    pair = '"\\ud83d\\ude00"'
    assert json.loads(pair) == "😀" and len(json.loads(pair)) == 1
    assert compile_json_schema({"type": "string", "maxLength": 1}).matches(pair)
    assert not compile_json_schema({"type": "string", "minLength": 2}).matches(pair)
    assert compile_json_schema({"type": "string", "maxLength": 1}).matches('"😀"')
    assert not compile_json_schema({"type": "string"}).matches('"\\ud83d"')          # a lone surrogate: no character


# 2. Grammars no output can finish

@pytest.mark.parametrize("pattern, text", [(r"^C:\\[a-z]+$", "C:\\win"), (r'^"[a-z]+"$', '"ab"'),
                                           (r"^[a-z]+\n[a-z]+$", "ab\ncd"), (r"^a.b$", 'a"b')])
def test_a_patterns_characters_json_must_escape_are_read_escaped(pattern, text, trie):
    assert re.fullmatch(pattern.strip("^$"), text)
    grammar = compile_json_schema({"type": "string", "pattern": pattern})
    assert grammar.matches(json.dumps(text)), json.dumps(text)
    assert_the_masks_allow(grammar, trie, json.dumps(text))


@pytest.mark.parametrize("schema, document", [
    ({"const": "café"}, "café"),
    ({"enum": ["naïve", "😀"]}, "😀"),
    ({"type": "object", "properties": {"größe": {"type": "integer"}}, "required": ["größe"]}, {"größe": 1}),
    ({"type": "string", "pattern": "^[éè]+$"}, "é"),
])
def test_non_ascii_characters_can_be_written_with_the_course_tokens(schema, document, trie):
    """The course tokenizer has no token for any non-ASCII character: the grammar takes their \\u escapes too, raw
    stays accepted, and a decoder led by the mask alone finishes (it used to find no token after "caf)."""
    grammar = compile_json_schema(schema)
    assert not any(t and any(ord(c) > 127 for c in t) for t in trie.vocab.texts)
    assert grammar.matches(compact(document)) and grammar.matches(json.dumps(document, separators=(",", ":")))
    for seed in range(3):
        text = finish(grammar, trie, seed)
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)), text


def test_a_start_rule_that_derives_nothing_is_refused():
    forever = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
               "$ref": "#/$defs/n"}
    with pytest.raises(ValueError, match="derives no finite string"):
        compile_json_schema(forever)
    g = Grammar("root")
    g.rule("root", ["[", "root", "]"])
    with pytest.raises(ValueError, match="derives no finite string"):
        g.check()


def test_a_branch_that_derives_nothing_is_pruned(trie):
    schema = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
              "anyOf": [{"$ref": "#/$defs/n"}, {"type": "integer"}]}
    grammar = compile_json_schema(schema)
    brace = trie.vocab.texts.index("{")
    assert not mask_by_trie(grammar, grammar.start_state(), trie)[brace], "the mask lets the decoder into a dead end"
    assert grammar.matches("12") and not grammar.matches('{"c":')
    g = Grammar("root")
    g.rule("root", ["item"], [CharSet.of(""), "item"])
    g.rule("item", ["x"])
    g.prune()
    assert g.rules["root"] == [("item",)]


# 3. A false refusal

def test_a_type_lists_keywords_constrain_their_own_type_only():
    agrees_with_jsonschema({"type": ["string", "null"], "maxLength": 3}, [None, "abc", "abcd", 1])
    agrees_with_jsonschema({"type": ["integer", "array"], "minimum": 2, "items": {"type": "integer"}, "maxItems": 1},
                           [2, 1, [0], [0, 1], None])
    with pytest.raises(ValueError, match="'exclusiveMinimum' is not supported on type 'number'"):
        compile_json_schema({"type": ["number", "null"], "exclusiveMinimum": 0})      # applies, unsupported: refused


# 4. Jump-forward over non-ASCII forced text

@pytest.mark.parametrize("jump_forward", [False, True])
@pytest.mark.parametrize("cached", [False, True])
def test_forced_non_ascii_text_is_read_whole(tiny_course_lm, trie, jump_forward, cached):
    """`{"café":` is forced: its é is two byte-piece tokens, neither a character alone; the loop reads the forced
    text, not the pieces' texts (it used to leave the grammar there: garbled text, or a crash with cached masks)."""
    enc = load_tokenizer()
    g = Grammar("root")
    g.rule("root", [*literal('{"café":'), "digit", "}"])
    g.rule("digit", [CharSet.of("12")])
    g.check()
    out = generate_constrained(tiny_course_lm, enc.encode("x = "), g, trie, max_new_tokens=16, forced=enc.encode,
                               jump_forward=jump_forward, masks=ContextCache(g, trie).mask if cached else None)
    assert out.text in ('{"café":1}', '{"café":2}') and out.complete and out.stopped == "end", out
    assert enc.decode(out.tokens) == out.text
    short = generate_constrained(tiny_course_lm, enc.encode("x = "), g, trie, max_new_tokens=4, forced=enc.encode,
                                 jump_forward=jump_forward)
    assert enc.decode(short.tokens) == short.text and not short.complete, short       # cut at a whole character
