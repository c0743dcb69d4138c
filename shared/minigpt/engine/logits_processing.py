"""Per-sequence logits processing (serving): what one request changes in its row of logits before sampling.

    processor = LogitsProcessor.for_params(sampling)          # None when the request changes nothing
    row = processor(logits[row], seq.output_tokens)           # (V,) -> a new (V,); the raw row is left as it was
    token = sample_next(row[None], sampling, generator)

In this order, as OpenAI defines them:

1. `logit_bias`: logits[j] += bias[j];
2. `presence_penalty` p and `frequency_penalty` f: logits[j] -= count[j] * f + (count[j] > 0) * p, counts over the
   tokens this choice generated so far (each of n choices has its own processor, so its own counts);
3. the grammar (`GrammarConstraint`): every token the grammar refuses from its state -> -inf; the end-of-text token
   is allowed only where the grammar accepts (what `ContextCache.mask` computes).

The processor reads the tokens generated since its last call from `output_tokens` itself (counts and grammar state
advance with each token's text). So a step that is re-run (the engine's fault isolation runs a failed batch again
one chunk at a time) or a preempted sequence recomputed never advances it twice. Whatever raises here (a mask that
cannot be computed, no token left that the grammar allows) fails that one sequence's chunk, so that request alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from minigpt.sampling import SamplingParams

__all__ = ["GrammarConstraint", "LogitsProcessor"]


@dataclass(frozen=True, eq=False)
class GrammarConstraint:
    """A compiled grammar and what masks it: `mask(state)` -> (V_tokenizer,) bool (a `ContextCache.mask`), and
    `texts[token]`, what `grammar.walk` reads for each token: the course's grammars its text (None: a special token or
    part of a character, which no grammar reads), a library's matcher the token id itself
    (minigpt.serving.llguidance_backend.TokenIds). Shared by every request with the same schema; the state lives in
    each sequence's `LogitsProcessor`."""

    grammar: Any                                   # a course Grammar or RegexAutomaton, or llguidance's MatcherGrammar
    mask: Callable[[Any], Tensor]
    texts: Sequence[Any]


class LogitsProcessor:
    """One sequence's bias, penalties and grammar state (see the module docstring)."""

    def __init__(self, sampling: SamplingParams) -> None:
        self.presence, self.frequency = sampling.presence_penalty, sampling.frequency_penalty
        bias = dict(sampling.logit_bias)
        self.bias_ids = torch.tensor(list(bias), dtype=torch.long)
        self.bias_values = torch.tensor(list(bias.values()), dtype=torch.float32)
        self.constraint: GrammarConstraint | None = sampling.constraint
        self._reset()

    @staticmethod
    def for_params(sampling: SamplingParams) -> "LogitsProcessor | None":
        return LogitsProcessor(sampling) if sampling.processes_logits else None

    def _reset(self) -> None:
        self.counts: Counter[int] = Counter()
        self.state = self.constraint.grammar.start_state() if self.constraint is not None else None
        self.num_seen = 0

    # --- queries -----------------------------------------------------------------------------------

    def __call__(self, logits: Tensor, output_tokens: Sequence[int]) -> Tensor:
        """logits (V,) of the position after `output_tokens` -> the processed (V,) float32 row (a copy)."""
        self.catch_up(output_tokens)
        out = logits.float().clone()
        vocab = out.shape[-1]
        if len(self.bias_ids):
            inside = self.bias_ids < vocab
            out[self.bias_ids[inside]] += self.bias_values[inside].to(out.device)
        if self.counts and (self.presence or self.frequency):
            ids = torch.tensor(list(self.counts), dtype=torch.long)
            counts = torch.tensor(list(self.counts.values()), dtype=torch.float32)
            keep = ids < vocab
            out[ids[keep]] -= (counts[keep] * self.frequency + self.presence).to(out.device)
        if self.constraint is not None:
            allowed = self.allowed(vocab).to(out.device)
            out.masked_fill_(~allowed, float("-inf"))
        return out

    def allowed(self, vocab: int) -> Tensor:
        """(vocab,) bool: the tokens the grammar allows from the current state (ValueError if none)."""
        if self.state is None:
            raise ValueError("the output left the grammar (a token the mask did not allow was appended)")
        mask = self.constraint.mask(self.state)
        if len(mask) != vocab:                     # the model's vocabulary may be padded past the tokenizer's
            fitted = torch.zeros(vocab, dtype=torch.bool)
            n = min(vocab, len(mask))
            fitted[:n] = mask[:n]
            mask = fitted
        if not mask.any():
            raise ValueError("no token of the model's vocabulary can continue the grammar here")
        return mask

    # --- changes -----------------------------------------------------------------------------------

    def catch_up(self, output_tokens: Sequence[int]) -> None:
        """Count and read (grammar) the tokens generated since the last call."""
        if len(output_tokens) < self.num_seen:     # never expected: start over rather than be wrong
            self._reset()
        for token in output_tokens[self.num_seen:]:
            self.counts[token] += 1
            if self.constraint is not None and self.state is not None:
                texts = self.constraint.texts
                text = texts[token] if 0 <= token < len(texts) else None
                self.state = self.constraint.grammar.walk(self.state, text) if text is not None else None
        self.num_seen = len(output_tokens)
