"""Expert parallelism's two exchanges seen from one rank: what it sends where (dispatch), and how the answers come
home (combine). The all-to-all between them belongs to whoever moves the bytes (gloo, NCCL, DeepEP, or a grader).

    rows, experts, plan = ep_dispatch(x, expert_ids, placement, n_ranks, capacity)
    # rows[r] (m_r, D): the token rows rank r's experts must run; experts[r] (m_r,): which expert each row is for
    returned = all_to_all(...)      # rank r runs expert experts[r][i] on rows[r][i], sends the outputs back in order
    y = ep_combine(returned, plan, weights, n_tokens)       # (N, D) in the tokens' original order

placement[e] is the rank that owns expert e. The rank's N tokens each chose k experts (expert_ids (N, k)); the N*k
assignments are grouped by expert (moe.layer.dispatch), at most `capacity` kept per expert in token order (first
come, first served: the capacity is per expert, counted over THIS rank's tokens, as in GShard's local groups), and a
kept row goes to its expert's owner. combine puts each returned row back at its place in the grouped order, then
adds w[n, j] * output to token n (moe.layer.combine): a dropped assignment adds nothing.

Bytes. Every kept row sent to ANOTHER rank crosses the network twice (D activations out, D outputs back); rows for
the rank's own experts never leave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from minigpt.moe.layer import Dispatch, combine, dispatch

__all__ = ["EPPlan", "ep_dispatch", "ep_combine", "cross_rank_rows"]


@dataclass(frozen=True)
class EPPlan:
    """What combine needs: the grouped dispatch, and the rank each kept row (in grouped order) went to."""
    dispatch: Dispatch
    dest_rank: Tensor          # (M,) long


def _check_placement(placement: Sequence[int], n_ranks: int) -> None:
    if not placement or any(not isinstance(r, int) or not 0 <= r < n_ranks for r in placement):
        raise ValueError(f"placement must give every expert a rank in [0, {n_ranks}), got {list(placement)!r}")


def ep_dispatch(x: Tensor, expert_ids: Tensor, placement: Sequence[int], n_ranks: int,
                capacity: int | None) -> tuple[list[Tensor], list[Tensor], EPPlan]:
    """x (N, D), expert_ids (N, k) -> per destination rank r: rows (m_r, D) and their experts (m_r,), and the plan."""
    _check_placement(placement, n_ranks)
    plan = dispatch(x, expert_ids, len(placement), capacity)
    row_expert = torch.repeat_interleave(torch.arange(len(placement)), torch.tensor(plan.tokens_per_expert))
    dest = torch.tensor(list(placement), dtype=torch.long)[row_expert]
    rows = [plan.expert_inputs[dest == r] for r in range(n_ranks)]
    experts = [row_expert[dest == r] for r in range(n_ranks)]
    return rows, experts, EPPlan(plan, dest)


def ep_combine(returned: Sequence[Tensor], plan: EPPlan, weights: Tensor, n_tokens: int) -> Tensor:
    """returned[r] (m_r, D): rank r's outputs for rows[r], in the order sent -> y (N, D) in token order."""
    d = plan.dispatch
    outputs = d.expert_inputs.new_zeros(d.n_kept, d.expert_inputs.shape[1])
    for r, chunk in enumerate(returned):
        outputs[plan.dest_rank == r] = chunk.to(outputs.dtype)
    return combine(outputs, d, weights, n_tokens)


def cross_rank_rows(experts_sent: Sequence[Tensor], rank: int) -> int:
    """Rows this rank sends to other ranks (each crosses the network out and back): sum of m_r over r != rank."""
    return sum(int(e.numel()) for r, e in enumerate(experts_sent) if r != rank)
