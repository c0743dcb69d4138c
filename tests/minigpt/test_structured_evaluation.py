"""minigpt.structured.evaluation: the held-out schema suite compiles, its example documents are accepted by the
compiled grammar and by `jsonschema` alike, anchors are dropped only where that keeps a pattern's meaning, and the
valid rates of a tiny model's documents are measured in the same loop constrained or not, every constrained document
that ended being schema-valid."""

from __future__ import annotations

import json

import jsonschema
import pytest

from minigpt.structured.evaluation import load_suite, valid_rates
from minigpt.structured.json_schema import compile_json_schema
from minigpt.tokenizer import load_tokenizer

SUITE = load_suite()


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_the_suite_has_the_kinds_of_schema_agents_send():
    assert len(SUITE) >= 16 and len({e.name for e in SUITE}) == len(SUITE)
    text = json.dumps([e.schema for e in SUITE])
    for keyword in ('"enum"', '"pattern"', '"anyOf"', '"$ref"', '"minItems"', '"maxItems"', '"null"', '"boolean"',
                    '"minimum"', '"maximum"', '"additionalProperties": false'):
        assert keyword in text, f"no schema of the suite uses {keyword}"
    assert all(e.prompt.strip() for e in SUITE)


@pytest.mark.parametrize("entry", SUITE, ids=[e.name for e in SUITE])
def test_every_schema_compiles_and_its_example_is_valid_for_both(entry):
    grammar = compile_json_schema(entry.schema)
    jsonschema.Draft202012Validator.check_schema(entry.schema)
    assert jsonschema.Draft202012Validator(entry.schema).is_valid(entry.example), "jsonschema refuses the example"
    assert grammar.matches(compact(entry.example)), f"the grammar refuses {compact(entry.example)}"


def test_constrained_documents_that_end_are_schema_valid(tiny_course_lm, trie):
    entry = next(e for e in SUITE if e.name == "settings")
    rates = valid_rates(tiny_course_lm, load_tokenizer(), [entry], constrained=True, max_new_tokens=80,
                        seeds=[None, 0, 1], trie=trie)
    ended = [r for r in rates.runs if r.stopped == "end"]
    assert len(rates.runs) == 3 and ended, [r.text for r in rates.runs]
    assert all(r.parses and r.valid for r in ended), [r.text for r in ended if not r.valid]
    total = rates.total()
    assert total.runs == 3 and total.valid >= len(ended) / 3 and sum(total.stopped.values()) == 3
    assert "| settings | 3 |" in rates.table() and "| **total** | 3 |" in rates.table()


def test_unconstrained_rates_are_measured_in_the_same_loop(tiny_course_lm, trie):
    entry = next(e for e in SUITE if e.name == "settings")
    rates = valid_rates(tiny_course_lm, load_tokenizer(), [entry], constrained=False, max_new_tokens=8, seeds=[None],
                        trie=trie)
    (run,) = rates.runs
    assert not rates.constrained and run.tokens > 0 and run.valid == (run.parses and run.valid)
    assert run.parses == _parses(run.text)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
