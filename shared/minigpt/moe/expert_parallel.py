"""Expert parallelism: each rank holds some of the experts, and tokens travel to them and back by all-to-all.

    y = moe_forward(x, layer.router.probabilities, layer.experts, top_k=2)        # one process, every expert

    def worker(comm, x_per_rank, layer, placement):                             # on each of the R ranks
        mine = {e: layer.experts[e] for e, r in enumerate(placement) if r == comm.rank}
        return ep_moe_forward(x_per_rank[comm.rank], layer.router.probabilities, mine, comm, placement, 2, None)
    run_ranks(worker, 2, x_per_rank, layer, [0, 0, 0, 1, 1, 1], backend="threads")   # [(y0, 0), (y1, 0)]
    ep_bytes_per_layer([ids0, ids1], placement, d_model=16)    # EPBytes(dispatch=..., combine=..., expert_ids=...)

One MoE layer on one rank r with tokens x (N_r, D), for E experts placed by placement[e] = owning rank:

    1. route      p = probabilities(x) (N_r, E); top-k experts per token, weights p_e / sum_{j in K} p_j
    2. group      the N_r * k (token, slot) assignments sorted by expert, token order inside each expert; at most
                  `capacity` kept per expert (first come, first served), each row for its expert's rank
                  (`minigpt.moe.ep_exchange.ep_dispatch`)
    3. dispatch   all-to-all: rank s receives the rows of the assignments whose expert lives on s, and, in a second
                  all-to-all of (rows,) long tensors, which expert each row is for
    4. compute    each local expert runs ONCE on every row any rank sent it
    5. combine    all-to-all back: each output row returns to the rank its token came from, in the order sent
    6. reduce     the source rank weights each output and adds it to its token's row (`ep_exchange.ep_combine`)

So a forward pass makes three all-to-alls. Bytes that leave a rank (CountingComm's count): every kept assignment
whose expert lives elsewhere sends its row out (D floats) and gets one back (D floats), plus its expert id (one
long). This reference sends one row per assignment: a token with two experts on the same remote rank travels
twice. DeepEP and `minigpt.moe.arithmetic` count one copy per (token, remote rank) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor

from minigpt.moe.ep_exchange import ep_combine, ep_dispatch
from minigpt.moe.layer import combine, dispatch, run_experts

__all__ = ["moe_forward", "ep_moe_forward", "EPBytes", "ep_bytes_per_layer"]

Probabilities = Callable[[Tensor], Tensor]
ExpertFn = Callable[[Tensor], Tensor]


def _route(x: Tensor, probabilities: Probabilities, n_experts: int, top_k: int) -> tuple[Tensor, Tensor]:
    """(weights (N, k) float32 summing to 1 per token, expert_ids (N, k) long) from the router's probabilities."""
    p = probabilities(x)
    if p.shape != (x.shape[0], n_experts):
        raise ValueError(f"probabilities(x) must have shape ({x.shape[0]}, {n_experts}), got {tuple(p.shape)}")
    if not 0 < top_k <= n_experts:
        raise ValueError(f"top_k must lie in [1, {n_experts}], got {top_k}")
    weights, expert_ids = torch.topk(p.float(), top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), expert_ids


def moe_forward(x: Tensor, probabilities: Probabilities, experts: Sequence[ExpertFn], top_k: int) -> Tensor:
    """The routed MoE output on one process: y[n] = sum_{e in top-k(n)} w[n, e] * experts[e](x[n]), x (N, D).

    Each expert is called once, on exactly the rows routed to it (none: not called); the weighted outputs are
    added back to each token's own row. Same math as `MoELayer` without shared experts.
    """
    if x.ndim != 2:
        raise ValueError(f"x must have shape (N, D), got {tuple(x.shape)}")
    weights, expert_ids = _route(x, probabilities, len(experts), top_k)
    plan = dispatch(x, expert_ids, len(experts), capacity=None)
    return combine(run_experts(experts, plan), plan, weights, x.shape[0])


def ep_moe_forward(x: Tensor, probabilities: Probabilities, local_experts: Mapping[int, ExpertFn], comm,
                   placement: Sequence[int], top_k: int, capacity: int | None) -> tuple[Tensor, int]:
    """One rank's share of an expert-parallel MoE layer: (y (N_local, D), assignments dropped on this rank).

    x (N_local, D): this rank's tokens. placement[e]: the rank owning expert e (len = E). local_experts: {e: fn}
    for the experts this rank owns. capacity: rows each expert accepts from THIS rank's tokens (None: all), kept
    in token order. comm.all_to_all(chunks) sends chunks[r] to rank r and returns what each rank sent here.
    Every rank must call this together (it makes three all-to-alls).
    """
    if x.ndim != 2:
        raise ValueError(f"x must have shape (N, D), got {tuple(x.shape)}")
    n_experts, n_ranks = len(placement), comm.world_size
    if any(not 0 <= r < n_ranks for r in placement):
        raise ValueError(f"placement {list(placement)} names a rank outside [0, {n_ranks})")
    mine = {e for e, r in enumerate(placement) if r == comm.rank}
    if set(local_experts) != mine:
        raise ValueError(f"rank {comm.rank} was given experts {sorted(local_experts)} but the placement puts "
                         f"{sorted(mine)} on it")
    weights, expert_ids = _route(x, probabilities, n_experts, top_k)
    rows, row_experts, plan = ep_dispatch(x, expert_ids, placement, n_ranks, capacity)
    received_rows = comm.all_to_all(rows)                 # dispatch: rows to the ranks owning their experts
    received_ids = comm.all_to_all(row_experts)           # and which expert each row is for

    # compute: each local expert once, on every row sent to it by any rank
    arrived, ids = torch.cat(received_rows), torch.cat(received_ids)
    outputs = torch.zeros_like(arrived)
    for e, expert in local_experts.items():
        at = torch.nonzero(ids == e).squeeze(1)
        if at.numel():
            outputs[at] = expert(arrived[at])

    # combine: outputs back to their source ranks, in the order each sent them; then weighted, in token order
    returned = comm.all_to_all(list(torch.split(outputs, [r.shape[0] for r in received_rows])))
    return ep_combine(returned, plan, weights, x.shape[0]), plan.dispatch.n_dropped


@dataclass(frozen=True)
class EPBytes:
    """Bytes one EP forward moves between ranks, summed over all source ranks (rows to the same rank excluded)."""

    remote_rows: int      # kept assignments whose expert lives on another rank than their token
    dispatch: int         # token rows out: remote_rows * d_model * bytes_per_element
    combine: int          # expert outputs back: the same
    expert_ids: int       # which expert each dispatched row is for: remote_rows * id_bytes

    @property
    def total(self) -> int:
        return self.dispatch + self.combine + self.expert_ids


def ep_bytes_per_layer(expert_ids_per_rank: Sequence[Tensor], placement: Sequence[int], d_model: int,
                       capacity: int | None = None, bytes_per_element: int = 4, id_bytes: int = 8) -> EPBytes:
    """The exact bytes `ep_moe_forward` sends to other ranks in one layer, all ranks together.

    expert_ids_per_rank[r]: rank r's routing (N_r, k). With capacity, rank r keeps min(count_r[e], capacity) of
    the count_r[e] assignments to expert e. An assignment of rank r to expert e crosses ranks when
    placement[e] != r; it then costs a row out (dispatch), a row back (combine) and its expert id:

        total = sum_r sum_{e: placement[e] != r} kept_r[e] * (2 * d_model * bytes_per_element + id_bytes)

    (fp32 rows and int64 ids by default). Sum `CountingComm.stats.bytes["all_to_all"]` over the ranks to compare.
    """
    n_experts = len(placement)
    remote = 0
    for r, ids in enumerate(expert_ids_per_rank):
        kept = torch.bincount(ids.reshape(-1).long(), minlength=n_experts)
        if capacity is not None:
            kept = kept.clamp(max=capacity)
        remote += sum(int(kept[e]) for e in range(n_experts) if placement[e] != r)
    rows = remote * d_model * bytes_per_element
    return EPBytes(remote, rows, rows, remote * id_bytes)
