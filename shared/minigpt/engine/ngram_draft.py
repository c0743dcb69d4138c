"""Prompt-lookup (n-gram) drafting (lab 06): propose the tokens that followed the last n tokens earlier on.

No draft model: if the last n tokens of the context occurred before, the tokens that came after that
occurrence are a good guess for what comes next. Strong when the answer repeats the prompt (editing
code, quoting a document, renaming a variable), useless on free text. Drafting costs a search, not a
forward pass, so even a low acceptance rate pays.

The proposal is deterministic given the context, so its q is one-hot: t is accepted with probability
p(t), and a rejection resamples from p with t removed (renormalised): still exactly the target's
distribution.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.sampling import SamplingParams

__all__ = ["ngram_propose", "PromptLookupDrafter"]


def ngram_propose(context: Sequence[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Up to k tokens copied from after the most recent earlier occurrence of the context's last n tokens.

    Tries n = max_n, max_n - 1, ..., min_n and uses the first n that has an earlier occurrence (one that
    starts before the suffix itself); [] when none has, or when k == 0.
    """
    if k < 0 or min_n < 1 or max_n < min_n:
        raise ValueError(f"ngram_propose needs k >= 0 and 1 <= min_n <= max_n, got k={k}, min_n={min_n}, max_n={max_n}")
    context = list(context)
    L = len(context)
    if k == 0:
        return []
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = context[L - n:]
        for start in range(L - n - 1, -1, -1):          # most recent first, never the suffix itself
            if context[start:start + n] == suffix:
                return context[start + n:start + n + k]
    return []


class PromptLookupDrafter:
    """A `Drafter` (see minigpt.engine.speculative) that proposes with `propose` (default: ngram_propose)."""

    def __init__(self, vocab_size: int, max_n: int = 3, min_n: int = 1, propose=None) -> None:
        self.vocab_size = vocab_size
        self.max_n, self.min_n = max_n, min_n
        self._propose = propose or ngram_propose

    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> tuple[list[int], Tensor]:
        tokens = [int(t) for t in self._propose(context, k, self.max_n, self.min_n)][:k]
        q = F.one_hot(torch.tensor(tokens, dtype=torch.long), self.vocab_size).float().reshape(len(tokens), self.vocab_size)
        return tokens, q

    def rollback(self, length: int) -> None:
        pass                                     # nothing cached
