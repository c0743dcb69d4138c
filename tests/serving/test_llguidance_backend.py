"""The llguidance backend behind the engine's unchanged `LogitsProcessor`: its masks allow exactly a document's
tokens, the end token only where the document is complete, each sequence walks its own copy of the compiled matcher,
and objects that list `properties` are closed unless the schema opens them."""

from __future__ import annotations

import json

import pytest
import torch

from minigpt.engine.logits_processing import GrammarConstraint, LogitsProcessor
from minigpt.sampling import SamplingParams
from minigpt.serving.llguidance_backend import closed_objects, compile_grammar, json_schema_grammar, \
    llguidance_tokenizer_of

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def person(tokenizer) -> GrammarConstraint:
    return compile_grammar(json_schema_grammar(PERSON), llguidance_tokenizer_of(tokenizer))


def test_the_processor_masks_to_the_document_then_the_end_token(person, tokenizer):
    processor = LogitsProcessor(SamplingParams(constraint=person))
    tokens = tokenizer.encode('{"name":"Ada","age":36}')
    logits = torch.zeros(tokenizer.n_vocab)
    for k, token in enumerate(tokens):
        row = processor(logits, tokens[:k])
        assert row[token] == 0, f"token {k} ({tokenizer.decode([token])!r}) of a valid document was masked"
        assert row[tokenizer.eot_token] == float("-inf"), f"the end token was allowed after {k} tokens"
    allowed = torch.isfinite(processor(logits, tokens)).nonzero().flatten().tolist()
    assert allowed == [tokenizer.eot_token], f"after the whole document only the end token, got {allowed[:10]}"


def test_a_refused_token_leaves_the_grammar(person, tokenizer):
    processor = LogitsProcessor(SamplingParams(constraint=person))
    with pytest.raises(ValueError, match="left the grammar"):
        processor(torch.zeros(tokenizer.n_vocab), tokenizer.encode('{"nope'))


def test_each_sequence_walks_its_own_copy(person, tokenizer):
    a, b = person.grammar.start_state(), person.grammar.start_state()
    for token in tokenizer.encode('{"name":'):
        a = person.grammar.walk(a, person.texts[token])
    assert not torch.equal(person.mask(a), person.mask(b)), "two sequences share one matcher"
    assert torch.equal(person.mask(b), person.mask(person.grammar.start_state()))


def test_a_padded_model_vocabulary_masks_the_padding(person, tokenizer):
    row = LogitsProcessor(SamplingParams(constraint=person))(torch.zeros(tokenizer.n_vocab + 64), [])
    assert torch.isinf(row[tokenizer.n_vocab:]).all()


def test_listed_properties_are_closed_unless_opened():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}},
              "$defs": {"d": {"properties": {"x": {}}, "additionalProperties": True}},
              "allOf": [{"properties": {"b": {}}}], "const": {"properties": {"c": {}}}}
    before = json.dumps(schema)
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["d"]["additionalProperties"] is True, "an explicit additionalProperties was overwritten"
    assert "additionalProperties" not in closed["allOf"][0], "an allOf member was closed (no document would fit)"
    assert closed["const"] == schema["const"], "a const value was treated as a schema"
    assert json.dumps(schema) == before, "the client's schema itself was changed"


def test_a_refused_schema_names_the_keyword(tokenizer):
    with pytest.raises(ValueError, match="uniqueItems"):
        compile_grammar(json_schema_grammar({"type": "array", "uniqueItems": True}), llguidance_tokenizer_of(tokenizer))


def test_a_client_cannot_set_llguidance_options():
    """`x-guidance` in a client's schema (`lenient: true` would skip the keywords llguidance cannot enforce) is
    refused, naming it; the server sets the options itself."""
    from minigpt.serving.llguidance_backend import lark_json

    schema = {"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}}
    for build in (json_schema_grammar, lark_json):
        with pytest.raises(ValueError, match="x-guidance"):
            build(schema)
