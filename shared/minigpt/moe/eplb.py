"""Expert-parallel load balancing (EPLB): replicate the busiest experts and pack the replicas so that no rank
waits long for the others.

    ids = zipf_routing(4096, n_experts=16, top_k=2, s=1.2, generator=torch.Generator().manual_seed(0))
    load = expert_load(ids, 16)                              # (E,) assignments per expert (minigpt.moe.layer)
    before = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    after = eplb_placement(load, n_ranks=4, slots_per_rank=5)          # 20 slots: 4 replicas to spare
    rank_loads(load, before).max(), rank_loads(load, after).max()      # the slowest rank, before and after

A placement lists, for each rank, the experts it hosts (its slots); an expert may be hosted by several ranks
(replicas), and its tokens are then split evenly among them. With replicas[e] copies,

    rank load[r] = sum over the slots of rank r of load[e] / replicas[e]

and an MoE layer lasts as long as its slowest rank: max_r rank load[r] against the mean, sum(load) / R.

The method is DeepSeek's EPLB (github.com/deepseek-ai/EPLB, `replicate_experts` then `balanced_packing`), here
in its simplest form without the node level: each spare slot, one at a time, goes to the expert with the largest
load per replica; then the replicas, heaviest first, each go to the least loaded rank that still has a free slot
(preferring a rank that does not host that expert yet), a greedy that keeps the slowest rank close to the mean.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["eplb_placement", "replica_counts", "rank_loads", "zipf_routing"]

Placement = Sequence[Sequence[int]]


def _as_load(load: Tensor | Sequence[float]) -> Tensor:
    load = torch.as_tensor(load, dtype=torch.float64)
    if load.ndim != 1 or load.numel() == 0:
        raise ValueError(f"load must be a non-empty 1-D sequence of per-expert token counts, got shape "
                         f"{tuple(load.shape)}")
    if bool((load < 0).any()) or not bool(torch.isfinite(load).all()):
        raise ValueError(f"load must hold finite non-negative counts, got {load.tolist()}")
    return load


def replica_counts(placement: Placement, n_experts: int) -> Tensor:
    """(E,) long: on how many slots of the placement each expert sits. Raises if an expert is missing or unknown."""
    counts = torch.zeros(n_experts, dtype=torch.long)
    for r, experts in enumerate(placement):
        for e in experts:
            if not 0 <= e < n_experts:
                raise ValueError(f"rank {r} hosts expert {e}, outside [0, {n_experts})")
            counts[e] += 1
    if bool((counts == 0).any()):
        raise ValueError(f"experts {torch.nonzero(counts == 0).squeeze(1).tolist()} are hosted by no rank: their "
                         "tokens would have nowhere to go")
    return counts


def rank_loads(load: Tensor | Sequence[float], placement: Placement) -> Tensor:
    """(R,) float64: each rank's tokens when an expert's load is split evenly among its replicas."""
    load = _as_load(load)
    share = load / replica_counts(placement, load.numel())
    return torch.stack([share[list(experts)].sum() if len(experts) else share.new_zeros(()) for experts in placement])


def eplb_placement(load: Tensor | Sequence[float], n_ranks: int, slots_per_rank: int) -> list[list[int]]:
    """The experts each of n_ranks ranks hosts, slots_per_rank each, every expert at least once, balanced by load.

    1. replicate: replicas = 1 per expert; each of the n_ranks * slots_per_rank - E spare slots goes, one at a
       time, to the expert with the largest load[e] / replicas[e] (ties: the lower expert id).
    2. pack: the replicas sorted by load[e] / replicas[e], heaviest first (ties: the lower expert id); each goes
       to the rank with the least load so far among those with a free slot, preferring ranks that do not host
       that expert yet (ties: the lower rank).
    Each rank's list is returned sorted.
    """
    load = _as_load(load)
    for name, v in (("n_ranks", n_ranks), ("slots_per_rank", slots_per_rank)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    n_experts = load.numel()
    if n_ranks * slots_per_rank < n_experts:
        raise ValueError(f"{n_ranks} ranks x {slots_per_rank} slots = {n_ranks * slots_per_rank} slots cannot host "
                         f"all {n_experts} experts")

    replicas = torch.ones(n_experts, dtype=torch.long)
    for _ in range(n_ranks * slots_per_rank - n_experts):
        replicas[int(torch.argmax(load / replicas))] += 1       # argmax: the first of equal maxima

    share = load / replicas
    items = sorted(((float(share[e]), e) for e in range(n_experts) for _ in range(int(replicas[e]))),
                   key=lambda item: (-item[0], item[1]))
    hosted: list[list[int]] = [[] for _ in range(n_ranks)]
    totals = [0.0] * n_ranks
    for weight, e in items:
        free = [r for r in range(n_ranks) if len(hosted[r]) < slots_per_rank]
        candidates = [r for r in free if e not in hosted[r]] or free
        r = min(candidates, key=lambda r: (totals[r], r))
        hosted[r].append(e)
        totals[r] += weight
    return [sorted(experts) for experts in hosted]


def zipf_routing(n_tokens: int, n_experts: int, top_k: int, s: float, generator: torch.Generator) -> Tensor:
    """Skewed routing, (n_tokens, top_k) long: each token's top_k distinct experts drawn without replacement with
    weights 1 / rank^s, the ranks 1..E given to the experts in a random order (torch.randperm with `generator`).

    s = 0 is uniform routing; s around 1 gives a few hot experts, like real routers without a balancing loss.
    """
    for name, v in (("n_tokens", n_tokens), ("n_experts", n_experts), ("top_k", top_k)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} is larger than n_experts={n_experts}: the experts of a token are distinct")
    if not s >= 0:
        raise ValueError(f"the Zipf exponent s must be non-negative, got {s!r}")
    order = torch.randperm(n_experts, generator=generator)
    weights = torch.empty(n_experts, dtype=torch.float64)
    weights[order] = 1.0 / torch.arange(1, n_experts + 1, dtype=torch.float64) ** s
    return torch.multinomial(weights.expand(n_tokens, n_experts), top_k, replacement=False, generator=generator)
