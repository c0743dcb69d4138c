"""Vocabulary-parallel embedding and LM head: the (vocab, d_model) table split by rows over the ranks.

Rank r holds rows [r*V/tp, (r+1)*V/tp) of the embedding, which the tied LM head reuses.

    embedding:  each rank looks up the tokens it owns, writes zeros for the others, and an all-reduce
                sums the pieces: every token's vector comes from exactly one rank.    (tokens, d_model)
    LM head:    each rank computes the logits of its own rows, (tokens, V/tp); an all-GATHER along the
                vocabulary puts them side by side: (tokens, V). An all-reduce would add logits of
                different tokens together, which is meaningless (and has the wrong shape).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minigpt.parallel.comm import CountingComm

__all__ = ["VocabParallelEmbedding", "VocabParallelLMHead", "vocab_parallel_logits"]


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + V/tp) of the embedding; forward(tokens (B, T)) -> (B, T, d_model), all-reduced."""

    def __init__(self, vocab_size: int, d_model: int, comm: CountingComm) -> None:
        super().__init__()
        if vocab_size % comm.world_size:
            raise ValueError(f"vocab_size={vocab_size} is not divisible by the {comm.world_size} ranks")
        self.rows = vocab_size // comm.world_size
        self.start = comm.rank * self.rows
        self.weight = nn.Parameter(torch.zeros(self.rows, d_model))
        self.comm = comm

    def forward(self, tokens: Tensor) -> Tensor:
        local = tokens - self.start
        mine = (local >= 0) & (local < self.rows)
        x = nn.functional.embedding(local.clamp(0, self.rows - 1), self.weight)
        return self.comm.all_reduce(x * mine[..., None].to(x.dtype))


def vocab_parallel_logits(x: Tensor, weight_shard: Tensor, comm: CountingComm) -> Tensor:
    """x (..., d_model), weight_shard (V/tp, d_model) -> full logits (..., V): local logits, then all-gather."""
    return comm.all_gather(x @ weight_shard.t(), dim=-1)


class VocabParallelLMHead(nn.Module):
    """The LM head tied to a VocabParallelEmbedding's rows."""

    def __init__(self, embedding: VocabParallelEmbedding, comm: CountingComm) -> None:
        super().__init__()
        self.embedding = [embedding]             # a list: do not register the tied weight twice
        self.comm = comm

    @property
    def weight(self) -> Tensor:
        return self.embedding[0].weight

    def forward(self, x: Tensor) -> Tensor:
        return vocab_parallel_logits(x, self.weight, self.comm)
