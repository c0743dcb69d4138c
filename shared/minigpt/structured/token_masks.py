"""Which tokens may come next: the mask a constrained decoder applies to the logits (lab 10).

The automaton is a regex's DFA (`RegexAutomaton`) or a grammar's pushdown recognizer (`grammar.Grammar`, whose state
is a set of stacks); the index is for the DFA only (a pushdown automaton has no finite set of states to index).
A token is allowed from automaton state s when the automaton can read all of the token's text from s and stay live
(some string of the language still begins with what has been generated); the end-of-text token is allowed where s
accepts. Three ways to the same (V,) bool mask, from the slowest per step to the fastest:

* `mask_by_scan`: walk every token's text from s, V walks a step;
* `mask_by_trie`: walk a trie of the tokens' texts once, depth first, dropping a whole subtree where the automaton
  dies: a prefix shared by many tokens is read once, and most subtrees die at their first character;
* `MaskIndex`: every live state's mask computed once, at compile time (Outlines' index), one lookup a step.

Tokens whose bytes are not a whole UTF-8 string on their own (a piece of a multi-byte character) have no text here
and are never allowed: a character-level automaton cannot read half a character.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from minigpt.structured.regex_automaton import RegexAutomaton

Automaton = Any        # a RegexAutomaton or a grammar.Grammar: start_state(), step(state, ch), walk(state, text),
                       # accepting(state)

__all__ = ["Vocabulary", "TokenTrie", "MaskIndex", "mask_by_scan", "mask_by_trie"]


@dataclass(frozen=True)
class Vocabulary:
    texts: tuple[str | None, ...]                # token id -> its text; None: a special token or half a character
    eos_id: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "Vocabulary":
        """Each token's text from a tiktoken Encoding (its bytes, decoded alone); `<|endoftext|>` is the end token."""
        special = {tokenizer.encode_single_token(s) for s in tokenizer.special_tokens_set}
        texts = []
        for i in range(tokenizer.n_vocab):
            if i in special:
                texts.append(None)
                continue
            try:
                texts.append(tokenizer.decode_single_token_bytes(i).decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        eos = min(special) if special else None
        return cls(tuple(texts), eos)

    def __len__(self) -> int:
        return len(self.texts)


def _end_token(mask: Tensor, dfa: Automaton, state: Any, vocab: Vocabulary) -> Tensor:
    if vocab.eos_id is not None:
        mask[vocab.eos_id] = dfa.accepting(state)
    return mask


def mask_by_scan(dfa: Automaton, state: Any, vocab: Vocabulary) -> Tensor:
    """(V,) bool: walk each token's text from `state`."""
    allowed = [text is not None and dfa.walk(state, text) is not None for text in vocab.texts]
    return _end_token(torch.tensor(allowed, dtype=torch.bool), dfa, state, vocab)


@dataclass
class TokenTrie:
    """The tokens' texts as a trie: node 0 is the root, children[n] = {character: child}, ends[n] = the token ids
    whose text ends at n (a text is the path from the root)."""
    vocab: Vocabulary
    children: list[dict[str, int]] = field(default_factory=lambda: [{}])
    ends: list[list[int]] = field(default_factory=lambda: [[]])

    def __post_init__(self) -> None:
        for token, text in enumerate(self.vocab.texts):
            if text:
                self._insert(text, token)

    def _insert(self, text: str, token: int) -> None:
        node = 0
        for ch in text:
            if ch not in self.children[node]:
                self.children.append({})
                self.ends.append([])
                self.children[node][ch] = len(self.children) - 1
            node = self.children[node][ch]
        self.ends[node].append(token)

    def __len__(self) -> int:
        return len(self.children)


def mask_by_trie(dfa: Automaton, state: Any, trie: TokenTrie) -> Tensor:
    """(V,) bool: depth first through the trie carrying the automaton's state; a dead state prunes its subtree."""
    mask = torch.zeros(len(trie.vocab), dtype=torch.bool)
    stack = [(0, state)]
    while stack:
        node, s = stack.pop()
        for ch, child in trie.children[node].items():
            nxt = dfa.step(s, ch)
            if nxt is not None:
                mask[trie.ends[child]] = True
                stack.append((child, nxt))
    return _end_token(mask, dfa, state, trie.vocab)


class MaskIndex:
    """Every live state's mask, made once: `index.mask(state)` is a lookup, `index.nbytes` what the index holds."""

    def __init__(self, dfa: RegexAutomaton, trie: TokenTrie) -> None:
        self.dfa = dfa
        self.rows = {s: i for i, s in enumerate(sorted(dfa.live_states))}
        self.masks = torch.stack([mask_by_trie(dfa, s, trie) for s in self.rows]) if self.rows else \
            torch.zeros(0, len(trie.vocab), dtype=torch.bool)

    def mask(self, state: int) -> Tensor:
        return self.masks[self.rows[state]]

    @property
    def nbytes(self) -> int:
        return self.masks.nbytes
