"""The token-mask engines the `structured` part times side by side, each behind one small interface:

    engine.reset()           # back to the grammar's start
    engine.mask()            # the next-token mask at the current position, in the engine's own form (timed)
    engine.advance(token)    # take one token; raises if the engine refuses it (not timed)
    engine.allowed()         # the last mask as a (V,) bool array (not timed: to compare engines)

Course engines (`CourseEngine`) keep the automaton's state and call a mask function on it: `ContextCache.mask`,
`mask_by_trie`, `mask_by_scan` (a JSON schema's grammar), `MaskIndex.mask` (a regex's DFA); their mask is a (V,) bool
tensor. `XGrammarEngine` fills XGrammar's packed int32 bitmask (`GrammarMatcher.fill_next_token_bitmask`),
`LLGuidanceEngine` llguidance's (`llguidance.numpy.fill_next_token_bitmask`): each writes its own buffer, made once.
`ConstraintEngine` is the course server's default backend as the engine calls it (`minigpt.serving.
llguidance_backend`): llguidance's bits unpacked into a (V,) bool tensor, the form the engine's logits processor
applies, a state a copy of the compiled matcher.

The `compile_*` functions are what "compile" means for each, the thing timed per schema: the course's
`compile_json_schema` plus the `ContextCache` built on it (its warm-up, the cache filling, comes at the first masks
and is timed apart), XGrammar's `GrammarCompiler.compile_json_schema`, llguidance's grammar init (`LLMatcher` built
from `grammar_from_json_schema`, which itself only writes the request down), and the server's `compile_grammar`
(`json_schema_grammar`, its matcher and its first mask, as a request's compile runs before it joins the batch).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np
import torch

from minigpt.serving.llguidance_backend import compile_grammar, json_schema_grammar
from minigpt.structured.evaluation import llguidance_json_options, xgrammar_json_options
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.regex_automaton import RegexAutomaton
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import MaskIndex, TokenTrie

__all__ = ["CourseEngine", "XGrammarEngine", "LLGuidanceEngine", "ConstraintEngine", "compile_course_json",
           "compile_course_regex", "compile_xgrammar_json", "compile_xgrammar_regex", "compile_llguidance_json",
           "compile_llguidance_regex", "compile_server_json", "unpack_bits"]


def unpack_bits(words: np.ndarray, size: int) -> np.ndarray:
    """A packed int32 bitmask (token i at bit i % 32 of word i // 32) as (size,) bool."""
    return np.unpackbits(np.ascontiguousarray(words, dtype=np.int32).view(np.uint8), bitorder="little")[:size] \
        .astype(bool)


class CourseEngine:
    """A course automaton (`Grammar` or `RegexAutomaton`) and a mask function of its state."""

    def __init__(self, automaton: Any, masks: Callable[[Any], torch.Tensor], trie: TokenTrie) -> None:
        self.automaton, self.masks, self.texts = automaton, masks, trie.vocab.texts
        self.reset()

    def reset(self) -> None:
        self.state, self.last = self.automaton.start_state(), None

    def mask(self) -> torch.Tensor:
        self.last = self.masks(self.state)
        return self.last

    def advance(self, token: int) -> None:
        text = self.texts[token]
        nxt = self.automaton.walk(self.state, text) if text is not None else None
        if nxt is None:
            raise RuntimeError(f"the course's automaton refuses token {token} ({text!r})")
        self.state = nxt

    def allowed(self) -> np.ndarray:
        return self.last.numpy()


class XGrammarEngine:
    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar

        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self.size = vocab_size

    def reset(self) -> None:
        self.matcher.reset()

    def mask(self) -> torch.Tensor:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        return self.bitmask

    def advance(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"XGrammar refuses token {token}")

    def allowed(self) -> np.ndarray:
        return unpack_bits(self.bitmask[0].numpy(), self.size)


class LLGuidanceEngine:
    def __init__(self, matcher: Any, vocab_size: int) -> None:
        import llguidance.numpy

        self.matcher, self.size = matcher, vocab_size
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, vocab_size)
        self._fill = llguidance.numpy.fill_next_token_bitmask

    def reset(self) -> None:
        self.matcher.reset()

    def mask(self) -> np.ndarray:
        self._fill(self.matcher, self.bitmask)
        return self.bitmask

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"llguidance refuses token {token}: {self.matcher.get_error()}")

    def allowed(self) -> np.ndarray:
        return unpack_bits(self.bitmask[0], self.size)


class ConstraintEngine:
    """A `GrammarConstraint` of the server's llguidance backend: states are matchers, masks (V,) bool tensors."""

    def __init__(self, constraint: Any) -> None:
        self.constraint = constraint
        self.reset()

    def reset(self) -> None:
        self.state, self.last = self.constraint.grammar.start_state(), None

    def mask(self) -> torch.Tensor:
        self.last = self.constraint.mask(self.state)
        return self.last

    def advance(self, token: int) -> None:
        if self.constraint.grammar.walk(self.state, self.constraint.texts[token]) is None:
            raise RuntimeError(f"the server's llguidance backend refuses token {token}")

    def allowed(self) -> np.ndarray:
        return self.last.numpy()


def compile_course_json(schema: dict[str, Any], trie: TokenTrie) -> CourseEngine:
    grammar = compile_json_schema(schema)
    return CourseEngine(grammar, ContextCache(grammar, trie).mask, trie)


def compile_course_regex(pattern: str, trie: TokenTrie) -> CourseEngine:
    """The regex's DFA and its `MaskIndex` (every live state's mask, made here)."""
    dfa = RegexAutomaton.compile(pattern)
    return CourseEngine(dfa, MaskIndex(dfa, trie).mask, trie)


def compile_xgrammar_json(compiler: Any, schema: dict[str, Any], vocab_size: int) -> XGrammarEngine:
    return XGrammarEngine(compiler.compile_json_schema(json.dumps(schema), **xgrammar_json_options()), vocab_size)


def compile_xgrammar_regex(compiler: Any, pattern: str, vocab_size: int) -> XGrammarEngine:
    return XGrammarEngine(compiler.compile_regex(pattern), vocab_size)


def compile_llguidance_json(tokenizer: Any, schema: dict[str, Any], vocab_size: int) -> LLGuidanceEngine:
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=llguidance_json_options())
    return _llguidance(llguidance.LLMatcher(tokenizer, grammar), vocab_size)


def compile_llguidance_regex(tokenizer: Any, pattern: str, vocab_size: int) -> LLGuidanceEngine:
    import llguidance

    return _llguidance(llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_regex(pattern)), vocab_size)


def compile_server_json(tokenizer: Any, schema: dict[str, Any]) -> ConstraintEngine:
    """What the course server does with a `response_format` schema by default (`tokenizer`:
    `llguidance_tokenizer_of`)."""
    return ConstraintEngine(compile_grammar(json_schema_grammar(schema), tokenizer))


def _llguidance(matcher: Any, vocab_size: int) -> LLGuidanceEngine:
    if matcher.is_error():
        raise ValueError(f"llguidance cannot compile the grammar: {matcher.get_error()}")
    return LLGuidanceEngine(matcher, vocab_size)
