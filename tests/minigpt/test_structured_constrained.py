"""minigpt.structured.constrained: with the mask, every generated prefix stays in the language and a finished
answer is a whole sentence of it; without it, the same loop is the model's own greedy decode."""

from __future__ import annotations

import pytest

from minigpt.checkpoint import load_model
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.structured.constrained import generate_constrained
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.regex_automaton import RegexAutomaton
from minigpt.structured.token_masks import TokenTrie, Vocabulary
from minigpt.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "properties": {"port": {"type": "integer", "minimum": 1, "maximum": 65535},
                                           "debug": {"type": "boolean"}}, "required": ["port"]}


@pytest.fixture(scope="module")
def setup():
    enc = load_tokenizer()
    return load_model("draft"), enc, TokenTrie(Vocabulary.from_tokenizer(enc))


@pytest.mark.parametrize("automaton", [RegexAutomaton.compile(r"(0|[1-9][0-9]{0,3})\.[0-9]{2}"),
                                       compile_json_schema(SCHEMA)], ids=["regex", "json schema"])
def test_constrained_text_stays_in_the_language(setup, automaton):
    model, enc, trie = setup
    out = generate_constrained(model, enc.encode("value = "), automaton, trie, max_new_tokens=24)
    start = automaton.start_state()
    assert automaton.walk(start, out.text) is not None
    assert out.complete == (out.stopped == "end") or out.stopped == "length"
    if out.stopped == "end":
        assert automaton.accepting(automaton.walk(start, out.text))
    assert out.mask_seconds > 0 and out.model_seconds > 0


def test_unconstrained_is_the_models_greedy_decode(setup):
    model, enc, trie = setup
    prompt = enc.encode("def main():\n    ")
    out = generate_constrained(model, prompt, RegexAutomaton.compile("[a-z]+"), trie, max_new_tokens=12,
                               constrain=False)
    assert out.tokens == generate_kv_cache(model, prompt, 12, stop_token_ids=()).tokens[:len(out.tokens)]
    assert out.mask_seconds == 0


def test_the_cached_masks_decode_the_same_tokens(setup):
    from minigpt.structured.token_cache import ContextCache

    model, enc, trie = setup
    grammar = compile_json_schema(SCHEMA)
    prompt = enc.encode("settings = ")
    plain = generate_constrained(model, prompt, grammar, trie, max_new_tokens=16)
    cached = generate_constrained(model, prompt, grammar, trie, max_new_tokens=16,
                                  masks=ContextCache(grammar, trie).mask)
    assert cached.tokens == plain.tokens and cached.complete == plain.complete


def test_the_forced_text_of_an_object_is_its_first_key():
    grammar = compile_json_schema(SCHEMA)
    assert grammar.forced_text(grammar.start_state()) == '{"port":'
    assert grammar.forced_text(grammar.walk(grammar.start_state(), '{"port":8')) == ""      # a digit, "," or "}"


def test_jump_forward_gives_the_same_tokens_in_fewer_passes(setup):
    model, enc, trie = setup
    grammar = compile_json_schema(SCHEMA)
    prompt = enc.encode("settings = ")
    kw = dict(max_new_tokens=16, forced=enc.encode)
    one_a_pass = generate_constrained(model, prompt, grammar, trie, **kw)
    jumped = generate_constrained(model, prompt, grammar, trie, jump_forward=True, **kw)
    assert jumped.tokens == one_a_pass.tokens and jumped.forced_tokens == one_a_pass.forced_tokens > 0
    assert jumped.forward_passes == one_a_pass.forward_passes - jumped.forced_tokens
    assert jumped.tokens[:len(enc.encode('{"port":'))] == enc.encode('{"port":')     # the canonical tokens
