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

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.sampling import SamplingParams

__all__ = ["ngram_propose", "PromptLookupDrafter", "PromptLookupModel"]


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


class PromptLookupModel(GPT):
    """Prompt lookup behind the model protocol: a "draft model" whose forward is an n-gram search, not layers.

    A speculative loop written for a draft model (tokens, positions, kv_caches -> logits) drafts with it
    unchanged. It keeps the tokens it was fed in its one-layer cache (the token id stored as the key, exact in
    float32), so the loop's own rollback of the draft cache is what it forgets. The logits of the
    last position are log of a one-hot vector (0 at the proposal, -inf elsewhere): the next token of
    `ngram_propose(context, 1)`, or the context's last token again when nothing matches (a guess that costs
    one verify position). Other positions get zeros (a loop reads only the last). Its q is exactly one-hot,
    so under sampling a drafted t is accepted with probability p(t), as for `PromptLookupDrafter`.
    """

    def __init__(self, vocab_size: int, max_seq_len: int = 4096, max_n: int = 3, min_n: int = 1) -> None:
        nn.Module.__init__(self)
        self.config = ModelConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, d_model=2, n_layers=1, n_heads=1,
                                  n_kv_heads=1, d_ff=2)
        self.tok_emb = nn.Embedding(1, 1)            # only for .device and .dtype (float32: ids stay exact)
        self.max_n, self.min_n = max_n, min_n

    def forward(self, tokens: Tensor, positions: Tensor | None = None, kv_caches: Any = None) -> Tensor:
        """tokens (1, T) -> logits (1, T, V); with `kv_caches` the search runs over everything cached so far."""
        B, T = tokens.shape
        if B != 1:
            raise ValueError(f"PromptLookupModel drafts one sequence at a time, got a batch of {B}")
        if kv_caches is not None:
            if positions is None:
                raise ValueError("pass `positions` with `kv_caches`")
            ids = tokens.to(self.dtype).reshape(1, T, 1, 1).expand(1, T, 1, 2)
            keys, _ = kv_caches[0].update(ids, ids)
            context = keys[0, :, 0, 0].long().tolist()
        else:
            context = tokens[0].tolist()
        proposal = ngram_propose(context, 1, self.max_n, self.min_n) or context[-1:]
        logits = torch.zeros(1, T, self.config.vocab_size, device=tokens.device)
        logits[0, -1] = float("-inf")
        logits[0, -1, proposal[0]] = 0.0
        return logits
