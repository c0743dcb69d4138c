"""Why a grammar's mask can cost almost nothing: most tokens are decided by the innermost rule alone (lab 10).

XGrammar's observation (Dong et al., 2024): at a pushdown automaton's position, a token is either decided by the
rule being matched (it stays inside the rule: accepted; or it fails inside it: rejected), whatever the stack below,
or it runs past the rule's end and needs the stack (uncertain). The first kind is computed once per rule position and
cached; only the uncertain ones are checked against the whole stack at each step.

Here a stack's rule position is its symbols up to its first END marker (`grammar.Grammar._close`), or up to its
`frames`-th: the segment. A deeper segment sees more of the context (fewer uncertain tokens) and is shared by fewer
stacks (more segments to cache).

    cache = ContextCache(grammar, trie)
    mask = cache.mask(state)            # equal to mask_by_trie(grammar, state, trie), from the cache where it can
    cache.stats                         # segments cached, hits, tokens decided by the segment, tokens checked

For each segment the cache holds two (V,) masks made by one trie walk of the segment alone: `accepted` (a token read
whole inside the segment, or ending exactly where it ends) and `uncertain` (a token that reaches the segment's end
with characters left). At a step the mask is the union of the stacks' accepted tokens plus the uncertain ones that
the whole state reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from minigpt.structured.grammar import END, Grammar, State
from minigpt.structured.token_masks import TokenTrie

__all__ = ["ContextCache", "CacheStats"]


class _Stop:
    """Where a segment ends on its stack: no character is read there, and closure leaves it on top."""

    def __contains__(self, ch: str) -> bool:
        return False

    def __repr__(self) -> str:
        return "STOP"


STOP = _Stop()


@dataclass
class CacheStats:
    segments: int = 0                 # distinct rule positions cached
    hits: int = 0                     # a stack whose segment was cached already
    misses: int = 0
    masks: int = 0                    # masks asked for
    decided: int = 0                  # tokens settled by the cache, summed over masks
    checked: int = 0                  # uncertain tokens walked against the whole state, summed over masks
    per_segment_uncertain: list[int] = field(default_factory=list)

    @property
    def checked_share(self) -> float:
        """Of the tokens a mask had to settle, the share that needed the stack (the rest came from the cache)."""
        return self.checked / max(1, self.decided + self.checked)


class ContextCache:
    def __init__(self, grammar: Grammar, trie: TokenTrie, *, frames: int = 3) -> None:
        """`frames`: how many rule ends a segment spans (1: the innermost rule; 2: it and its caller's rest...)."""
        self.grammar, self.trie, self.frames = grammar, trie, frames
        self.entries: dict[tuple, tuple[Tensor, Tensor]] = {}
        self.stats = CacheStats()
        self._order_tokens()

    def _order_tokens(self) -> None:
        """Tokens in the trie's depth-first order, so that a node's subtree is one range [lo[n], hi[n])."""
        children, ends = self.trie.children, self.trie.ends
        order: list[int] = []
        self.lo, self.hi = [0] * len(children), [0] * len(children)
        stack = [(0, False)]
        while stack:
            node, done = stack.pop()
            if done:
                self.hi[node] = len(order)
                continue
            self.lo[node] = len(order)
            order.extend(ends[node])
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(list(children[node].values())))
        self.order = torch.tensor(order, dtype=torch.long)

    def _segment(self, stack: tuple) -> tuple:
        """The stack up to its `frames`-th END, that END replaced by STOP (the whole stack where it has fewer)."""
        seen = 0
        for i, symbol in enumerate(stack):
            if symbol is END:
                seen += 1
                if seen == self.frames:
                    return stack[:i] + (STOP,)
        return stack

    def _walk_segment(self, segment: tuple) -> tuple[Tensor, Tensor]:
        """(accepted, uncertain) (V,) masks of a segment, from one depth-first walk of the trie."""
        g, trie = self.grammar, self.trie
        accepted = torch.zeros(len(trie.vocab), dtype=torch.bool)
        uncertain_ranges: list[tuple[int, int]] = []
        start = g._close([segment])
        todo = [(0, start)]
        while todo:
            node, state = todo.pop()
            if any(s and s[0] is STOP for s in state):     # the segment can end here: what follows needs the stack
                uncertain_ranges.append((self.lo[node] + len(trie.ends[node]), self.hi[node]))
            for ch, child in trie.children[node].items():
                nxt = g.advance(state, ch)
                if nxt is not None:
                    accepted[trie.ends[child]] = True
                    todo.append((child, nxt))
        uncertain = torch.zeros(len(trie.vocab), dtype=torch.bool)
        for lo, hi in uncertain_ranges:
            uncertain[self.order[lo:hi]] = True
        uncertain &= ~accepted
        self.stats.per_segment_uncertain.append(int(uncertain.sum()))
        return accepted, uncertain

    def mask(self, state: State) -> Tensor:
        """(V,) bool: the tokens `state` can read, as `mask_by_trie` gives it."""
        vocab = self.trie.vocab
        accepted = torch.zeros(len(vocab), dtype=torch.bool)
        uncertain = torch.zeros(len(vocab), dtype=torch.bool)
        for stack in state:
            if not stack:
                continue
            key = self._segment(stack)
            if key in self.entries:
                self.stats.hits += 1
            else:
                self.stats.misses += 1
                self.entries[key] = self._walk_segment(key)
                self.stats.segments = len(self.entries)
            a, u = self.entries[key]
            accepted |= a
            uncertain |= u
        uncertain &= ~accepted
        todo = torch.nonzero(uncertain).flatten().tolist()
        for token in todo:
            if self.grammar.walk(state, vocab.texts[token]) is not None:
                accepted[token] = True
        self.stats.masks += 1
        self.stats.checked += len(todo)
        self.stats.decided += len(vocab) - len(todo)
        if vocab.eos_id is not None:
            accepted[vocab.eos_id] = self.grammar.accepting(state)
        return accepted

    @property
    def nbytes(self) -> int:
        """What the cache holds: two bool masks per segment."""
        return sum(a.nbytes + u.nbytes for a, u in self.entries.values())
