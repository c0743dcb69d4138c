"""minigpt.structured: a regex's token masks three ways (scan, trie, precomputed index) are the same mask, the same
as XGrammar's (a maintained engine, on the course's tokenizer) along seeded random paths, and a superset of
llguidance's: where the grammar forces the next bytes, llguidance allows only their canonical tokenization (its
`no_forcing` option, documented as "Normally, when a sequence of bytes is forced by grammar, it is tokenized
canonically and forced as tokens"), where this mask allows any tokenization of them."""

from __future__ import annotations

import random

import llguidance
import numpy as np
import xgrammar
import pytest
import torch

from minigpt.structured.evaluation import llguidance_tokenizer, xgrammar_tokenizer_info
from minigpt.structured.regex_automaton import RegexAutomaton
from minigpt.structured.token_masks import MaskIndex, mask_by_scan, mask_by_trie
from minigpt.tokenizer import load_tokenizer

PATTERNS = [r"[0-9]{1,3}(\.[0-9]+)?", r"(true|false|null)", r"def [a-z_]+\((x|y)?\):", r'"[a-z ]{0,12}"',
            r"(ab|a)*c", r"[A-Z][a-z]+( [A-Z][a-z]+)*"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_three_ways_give_one_mask_at_every_live_state(pattern, vocab, trie):
    dfa = RegexAutomaton.compile(pattern)
    index = MaskIndex(dfa, trie)
    for state in dfa.live_states:
        scan = mask_by_scan(dfa, state, vocab)
        assert torch.equal(scan, mask_by_trie(dfa, state, trie))
        assert torch.equal(scan, index.mask(state))
        assert bool(scan[vocab.eos_id]) == dfa.accepting(state)


@pytest.mark.parametrize("pattern", PATTERNS[:3])
def test_an_allowed_token_keeps_the_automaton_live_and_a_refused_one_does_not(pattern, vocab, trie):
    dfa = RegexAutomaton.compile(pattern)
    mask = mask_by_trie(dfa, dfa.start, trie)
    for token, text in enumerate(vocab.texts):
        if text is not None:
            assert bool(mask[token]) == dfa.live(dfa.walk(dfa.start, text)), (pattern, text)


def test_fullmatch_agrees_with_python_re():
    import re

    dfa = RegexAutomaton.compile(PATTERNS[0])
    for text in ["1", "12", "123", "1234", "1.5", "1.", ".5", "12.345", "", "a"]:
        assert dfa.fullmatch(text) == bool(re.fullmatch(PATTERNS[0], text)), text


def test_an_unsupported_construct_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot compile"):
        RegexAutomaton.compile(r"(?<=a)b")


def _paths(pattern, vocab, trie, oracle_mask, consume, reset, paths=4, steps=12):
    """Seeded random walks through the language: at each step (our mask, the oracle's), then one allowed token."""
    dfa = RegexAutomaton.compile(pattern)
    rng = random.Random(pattern)
    for _path in range(paths):
        reset()
        state = dfa.start
        for _step in range(steps):
            ours = mask_by_trie(dfa, state, trie).numpy()
            yield ours, oracle_mask()
            choices = [t for t in np.nonzero(ours)[0].tolist() if t != vocab.eos_id]
            if not choices:
                break
            token = rng.choice(choices)
            assert consume(token)
            state = dfa.walk(state, vocab.texts[token])


def _bits(words: torch.Tensor, size: int) -> np.ndarray:
    """A packed bitmask (32-bit words, token i at bit i % 32 of word i // 32) as (size,) bool."""
    return ((words.reshape(-1, 1) >> torch.arange(32)) & 1).flatten()[:size].bool().numpy()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_masks_equal_xgrammars_along_random_paths(pattern, vocab, trie):
    info = xgrammar_tokenizer_info(load_tokenizer())
    matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_regex(pattern))
    bitmask = xgrammar.allocate_token_bitmask(1, len(vocab))

    def oracle():
        matcher.fill_next_token_bitmask(bitmask)
        return _bits(bitmask[0], len(vocab))
    has_text = np.array([t is not None for t in vocab.texts])
    for ours, theirs in _paths(pattern, vocab, trie, oracle, matcher.accept_token, matcher.reset):
        assert np.array_equal(ours[has_text], theirs[has_text]), (pattern, np.nonzero(ours != theirs)[0][:8])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_llguidances_masks_are_within_ours_along_random_paths(pattern, vocab, trie):
    matcher = llguidance.LLMatcher(llguidance_tokenizer(load_tokenizer()),
                                   llguidance.LLMatcher.grammar_from_regex(pattern))

    def oracle():
        packed = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(packed, bitorder="little")[:len(vocab)].astype(bool)
    for ours, theirs in _paths(pattern, vocab, trie, oracle, matcher.consume_token, matcher.reset):
        assert not (theirs & ~ours).any(), (pattern, np.nonzero(theirs & ~ours)[0][:8])
