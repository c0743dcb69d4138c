"""Lab 10 checks: the solution notebook's answers pass, also through the judge's wire (the automaton, vocabulary and
trie travel by value, the counting automaton and the model stay in the judge); the stub, the package's reference
handed in (itself or a thin wrapper) and each plausible wrong implementation fail with a message that names the
exercise and the mistake."""

from __future__ import annotations

import pytest

from autograder import lab10
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.structured import token_masks
from minigpt.structured.json_schema import object_rules
from tests.labs.judged_pair import judged
from tests.labs.notebook_solutions import solution_cells

PREAMBLE = """
import json
import torch
from minigpt.cache.contiguous import KVCache
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.token_cache import ContextCache
from minigpt.structured import token_masks as tm
from minigpt.tokenizer import load_tokenizer
enc = load_tokenizer()
vocab = tm.Vocabulary.from_tokenizer(enc)
trie = tm.TokenTrie(vocab)
"""
CELLS = {"ex1_code": ("mask_by_scan", lab10.check_mask_by_scan), "ex2_code": ("mask_by_trie", lab10.check_mask_by_trie),
         "ex3_code": ("object_rules", lab10.check_object_rules), "ex4_code": ("generate_json", lab10.check_generate_json),
         "ex5_code": ("jump_forward_json", lab10.check_jump_forward)}


def solution(cell: str, replace: dict[str, str] | None = None):
    name, _ = CELLS[cell]
    return solution_cells("10_structured_generation", cell, preamble=PREAMBLE, replace=replace)[name]


@pytest.mark.parametrize("cell", CELLS)
def test_the_solution_passes(cell: str) -> None:
    CELLS[cell][1](solution(cell))


def test_the_solution_passes_through_the_judge() -> None:
    """The checks as the judge runs them: the learner's functions are Remotes, the automaton, vocabulary and trie go
    to them by value, the counting automaton and the models are served from the judge."""
    with judged(scan=solution("ex1_code"), walk=solution("ex2_code"), rules=solution("ex3_code"),
                jump=solution("ex5_code")) as learner:
        lab10.check_mask_by_scan(learner.scan)
        lab10.check_mask_by_trie(learner.walk)
        lab10.check_object_rules(learner.rules)
        lab10.check_jump_forward(learner.jump)


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("cell", CELLS)
def test_the_stub_fails(cell: str) -> None:
    with pytest.raises(AssertionError, match="not implemented"):
        CELLS[cell][1](stub)


@pytest.mark.parametrize("check, reference", [(lab10.check_mask_by_scan, token_masks.mask_by_scan),
                                              (lab10.check_mask_by_trie, token_masks.mask_by_trie),
                                              (lab10.check_object_rules, object_rules)])
def test_the_reference_is_refused(check, reference) -> None:
    with pytest.raises(ReferenceHandedIn):
        check(reference)


def test_a_wrapper_around_the_reference_decoder_is_refused() -> None:
    namespace: dict = {}
    exec("from minigpt.structured import constrained\n"
         "from minigpt.structured.json_schema import compile_json_schema\n"
         "from minigpt.structured.token_masks import TokenTrie, Vocabulary\n"
         "from minigpt.tokenizer import load_tokenizer\n"
         "trie = TokenTrie(Vocabulary.from_tokenizer(load_tokenizer()))\n"
         "def generate_json(model, prompt, schema, n):\n"
         "    return constrained.generate_constrained(model, prompt, compile_json_schema(schema), trie,\n"
         "                                            max_new_tokens=n).tokens\n", namespace)
    with pytest.raises(AssertionError, match="calls the course's reference"):
        lab10.check_generate_json(namespace["generate_json"])


WRONG = [
    ("ex1_code", {"allowed[vocab.eos_id] = dfa.accepting(state)": "allowed[vocab.eos_id] = True"}, "end-of-text"),
    ("ex1_code", {"allowed[vocab.eos_id] = dfa.accepting(state)": "pass"}, "end-of-text"),
    ("ex1_code", {"dfa.walk(state, text) is not None": "dfa.walk(state, text[:1]) is not None"}, "only its first character"),
    ("ex1_code", {"dfa.walk(state, text) is not None": "dfa.accepting(dfa.walk(state, text))"}, "may end in any live state"),
    ("ex1_code", {"if text is not None and dfa.walk": "if dfa.walk"}, "raised|no text"),
    # the trie walk stops at the first accepting state: tokens running past it are lost
    ("ex2_code", {"stack.append((child, nxt))": "stack.append((child, nxt)) if not dfa.accepting(nxt) else None"},
     "run on past an accepting one|missing"),
    # only one character deep: tokens that span several transitions are lost
    ("ex2_code", {"stack.append((child, nxt))": "pass"}, "transitions|missing"),
    ("ex2_code", {"allowed[trie.vocab.eos_id] = dfa.accepting(state)": "allowed[trie.vocab.eos_id] = True"}, "end-of-text"),
    # a scan dressed as a trie walk: the right masks, every token's text read
    ("ex2_code", {"    allowed = torch.zeros(len(trie.vocab), dtype=torch.bool)\n    stack = [(0, state)]":
                  "    allowed = torch.tensor([t is not None and dfa.walk(state, t) is not None for t in trie.vocab.texts])\n"
                  "    stack = []"}, "characters"),
    ("ex3_code", {"([] if required else [[first[i + 1]]])": "[[first[i + 1]]]"}, "required member may not be left out"),
    ("ex3_code", {"([] if required else [[first[i + 1]]])": "[]", "([] if required else [[rest[i + 1]]])": "[]"},
     "may be left out"),
    ("ex3_code", {'rules = {name: [["{", first[0], "}"]],': 'rules = {name: [["{", first[0], "}"], ["{", *\'"extra":1\', "}"]],'},
     "additionalProperties"),
    ("ex3_code", {'[[","] + member + [rest[i + 1]]]': '[member + [rest[i + 1]]]'}, "must accept|must refuse"),
    ("ex3_code", {"rules[rest[i]] = [[\",\"] + member + [rest[i + 1]]] + ([] if required else [[rest[i + 1]]])":
                  "rules[rest[i]] = [[\",\"] + member + [rest[i + 1]]] + [[rest[i + 1]]]"}, "required member"),
    ("ex4_code", {'token = int(logits.masked_fill(~allowed, float("-inf")).argmax())': "token = int(logits.argmax())"},
     "does not allow|raised"),
    ("ex4_code", {"state = grammar.walk(state, vocab.texts[token])": "pass"}, "generated"),
    # refused tokens masked to a finite -1e4: they win on a model whose logits all lie near -1e5 (issue 57)
    ("ex4_code", {'token = int(logits.masked_fill(~allowed, float("-inf")).argmax())':
                  "token = int(logits.masked_fill(~allowed, -1e4).argmax())"}, "far below -1e4"),
    ("ex5_code", {'token = int(logits.masked_fill(~allowed, float("-inf")).argmax())':
                  "token = int(logits.masked_fill(~allowed, -1e4).argmax())"}, "far below -1e4"),
    ("ex4_code", {"if token == vocab.eos_id:\n            break": "if token == vocab.eos_id:\n            out.append(token)\n            break"},
     "without returning it"),
    ("ex4_code", {"allowed = masks.mask(state)": "allowed = masks.mask(state).clone()\n        allowed[vocab.eos_id] = True"},
     "not finished|allowed only where the grammar accepts"),
    ("ex4_code", {"if token == vocab.eos_id:\n            break": "if token == vocab.eos_id:\n            continue"},
     "generated|raised"),
    ("ex5_code", {"forced = enc.encode(grammar.forced_text(state))[:max_new_tokens - len(out)]": "forced = []"},
     "generated"),
    # the forced text tokenized a character at a time instead of as the tokenizer encodes it
    ("ex5_code", {"forced = enc.encode(grammar.forced_text(state))[:max_new_tokens - len(out)]":
                  "forced = [enc.encode(c)[0] for c in grammar.forced_text(state)][:max_new_tokens - len(out)]"},
     "generated"),
]


@pytest.mark.parametrize("cell, edit, match", WRONG, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(WRONG)])
def test_a_plausible_wrong_version_is_rejected(cell: str, edit: dict[str, str], match: str) -> None:
    with pytest.raises(AssertionError, match=match) as caught:
        CELLS[cell][1](solution(cell, replace=edit))
    assert caught.value.args[0].startswith("Exercise "), caught.value


@pytest.mark.parametrize("cell", ["ex1_code", "ex2_code"])
def test_a_mask_not_walked_through_the_given_automaton_is_rejected(cell: str) -> None:
    """The right masks from an automaton of its own, compiled from the pattern (or any other source the judge does
    not see): the automaton the judge holds reads nothing, and that gives it away."""
    own = solution(cell)
    namespace = {"own": own, "RegexAutomaton": __import__("minigpt.structured.regex_automaton",
                                                          fromlist=["RegexAutomaton"]).RegexAutomaton}
    exec("def elsewhere(dfa, state, data):\n"
         "    return own(RegexAutomaton.compile(dfa.automaton.pattern if hasattr(dfa, 'automaton') else dfa.pattern),"
         " state, data)\n", namespace)
    with pytest.raises(AssertionError, match="read 0 characters"):
        CELLS[cell][1](namespace["elsewhere"])


def test_forced_tokens_in_passes_of_their_own_are_rejected() -> None:
    """The right tokens, one forward pass each (forced decoding without the jump): the passes give it away."""
    one_pass_each = solution("ex5_code", replace={
        "            pending += forced\n":
        "            for t in forced:\n"
        "                model(torch.tensor([pending]), positions=cache.next_positions(len(pending)), kv_caches=cache)\n"
        "                pending = [t]\n"})
    with pytest.raises(AssertionError, match="forward passes fed .*you ran one pass per token"):
        lab10.check_jump_forward(one_pass_each)


@pytest.mark.parametrize("check, right, wrong, match", [
    (lab10.check_q1_index_bytes, 17 * 16032, 17 * 128256, "one bit per token"),
    (lab10.check_q2_tokenizations, 288, 1, "canonical tokenization alone"),
    (lab10.check_q3_hidden_batch, 1000, 250, "share them"),
    # each diagnosis its own (issue 59, L10-4, L10-8): bits, an int32 a token, a floor of 999.9999999999999
    (lab10.check_q1_index_bytes, 17 * 16032, 17 * 128256, "in bits"),
    (lab10.check_q1_index_bytes, 17 * 16032, 17 * 128256 * 4, "int32"),
    (lab10.check_q3_hidden_batch, 1000, 999, "floating point"),
])
def test_interview_questions(check, right, wrong, match) -> None:
    check(right)
    with pytest.raises(AssertionError, match=match):
        check(wrong)
