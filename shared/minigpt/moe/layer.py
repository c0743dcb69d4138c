"""A mixture-of-experts MLP: a router picks top_k of n_experts SwiGLU MLPs per token, and only those run.

    layer = MoELayer(d_model=64, d_ff=128, n_experts=8, top_k=2, n_shared=1)
    y = layer(x)                                     # x (B, T, D) -> (B, T, D)
    torch.testing.assert_close(y, dense_reference(layer, x))

    weights, expert_ids = layer.router(x_flat)       # (N, k) float32, (N, k) long
    plan = dispatch(x_flat, expert_ids, n_experts=8, capacity=capacity_for(N, 8, 2, capacity_factor=1.25))
    outputs = run_experts(layer.experts, plan)       # (M, D): the M kept assignments, grouped by expert
    routed = combine(outputs, plan, weights, N)      # (N, D) in token order; dropped assignments add 0
    plan.n_dropped, expert_load(expert_ids, 8), rank_load(expert_load(expert_ids, 8), [0, 0, 1, 1, 2, 2, 3, 3])

For a token x with router probabilities p = softmax(x W_gate) over the E experts and its top-k set K:

    y = sum_{e in K} w_e * Expert_e(x)  +  sum_{s < n_shared} Shared_s(x)
    w_e = p_e / sum_{j in K} p_j   (renormalize=True: Mixtral, Qwen-MoE)    or    w_e = p_e   (False: DeepSeek-V2)

The sparse path never runs an expert on a token that did not pick it: the N*k (token, slot) assignments are
sorted by expert id (stable, so token order is kept inside each expert), each expert runs once on its rows
(index_select), and the weighted outputs are added back to their tokens (index_add_). Under expert parallelism
the same two steps become the all-to-all "dispatch" and "combine" between ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minigpt.model import SwiGLU

__all__ = ["Router", "Expert", "MoELayer", "dense_gates", "dense_reference", "Dispatch", "dispatch", "run_experts",
           "combine", "capacity_for", "expert_load", "contiguous_placement", "rank_load"]


def _check_positive_int(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def _check_top_k(top_k: int, n_experts: int) -> None:
    _check_positive_int(top_k=top_k, n_experts=n_experts)
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} is larger than n_experts={n_experts}: a token cannot pick more experts "
                         "than there are")


# ---------------------------------------------------------------- the layer

class Router(nn.Module):
    """Linear gate, softmax over the experts, top-k.

    x (N, D) -> logits x W_gate^T (N, E) -> p = softmax in float32 -> (weights (N, k) float32, expert_ids (N, k)
    long), each row's experts in decreasing probability. With `renormalize` the k weights are divided by their
    sum (they add up to 1: Mixtral, Qwen-MoE); without, they are the raw probabilities p_e (DeepSeek-V2: the
    weights of a token add up to less than 1). Equal probabilities are broken by torch.topk, the same way
    every time for the same input on the same device.
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, renormalize: bool = True) -> None:
        super().__init__()
        _check_positive_int(d_model=d_model)
        _check_top_k(top_k, n_experts)
        self.n_experts, self.top_k, self.renormalize = n_experts, top_k, renormalize
        self.gate = nn.Linear(d_model, n_experts, bias=False)

    def probabilities(self, x: Tensor) -> Tensor:
        """softmax(x W_gate^T) over the experts, (N, E) float32."""
        return F.softmax(self.gate(x).float(), dim=-1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        weights, expert_ids = torch.topk(self.probabilities(x), self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, expert_ids


class Expert(SwiGLU):
    """One expert: the course model's MLP, w_down(silu(w_gate x) * w_up x), sized by (d_model, d_ff).

    The forward pass is `minigpt.model.SwiGLU`'s own; only the constructor differs (SwiGLU's takes a ModelConfig
    and a layer index to name its projections), so the weights are the same three bias-free linears.
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        _check_positive_int(d_model=d_model, d_ff=d_ff)
        nn.Module.__init__(self)
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)


class MoELayer(nn.Module):
    """x (B, T, D) -> (B, T, D): each token's output is sum_k w_k * Expert_{e_k}(x), plus, when n_shared > 0, the
    unweighted sum of n_shared shared experts that every token runs (DeepSeekMoE's shared experts).

    The routed part is `combine(run_experts(experts, dispatch(x, expert_ids, E, capacity=None)), ...)`: no token is
    dropped, and each expert runs only on the tokens that picked it.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int, n_shared: int = 0,
                 renormalize: bool = True) -> None:
        super().__init__()
        if not isinstance(n_shared, int) or isinstance(n_shared, bool) or n_shared < 0:
            raise ValueError(f"n_shared must be a non-negative int, got {n_shared!r}")
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.router = Router(d_model, n_experts, top_k, renormalize)
        self.experts = nn.ModuleList(Expert(d_model, d_ff) for _ in range(n_experts))
        self.shared_experts = nn.ModuleList(Expert(d_model, d_ff) for _ in range(n_shared))

    def shared_output(self, x_flat: Tensor) -> Tensor:
        """sum_s Shared_s(x), (N, D); zeros without shared experts."""
        out = torch.zeros_like(x_flat)
        for expert in self.shared_experts:
            out = out + expert(x_flat)
        return out

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has last dimension {x.shape[-1]}, the layer expects d_model={self.d_model}")
        x_flat = x.reshape(-1, self.d_model)
        weights, expert_ids = self.router(x_flat)
        plan = dispatch(x_flat, expert_ids, self.n_experts, capacity=None)
        routed = combine(run_experts(self.experts, plan), plan, weights, x_flat.shape[0])
        return (routed + self.shared_output(x_flat)).view_as(x)


def dense_gates(weights: Tensor, expert_ids: Tensor, n_experts: int) -> Tensor:
    """The router's choice as a dense (N, E) matrix: G[n, expert_ids[n, j]] = weights[n, j], zeros elsewhere."""
    return torch.zeros(weights.shape[0], n_experts, dtype=weights.dtype, device=weights.device) \
        .scatter_(1, expert_ids, weights)


def dense_reference(layer: MoELayer, x: Tensor) -> Tensor:
    """The oracle: EVERY expert on EVERY token, weighted by the dense gate matrix (zeros off the top-k).

    y[n] = sum_e G[n, e] * Expert_e(x[n]) + shared(x[n]), with all_outputs (N, E, D): E times the work of the
    sparse path, and the same answer up to the order of the floating-point additions.
    """
    x_flat = x.reshape(-1, layer.d_model)
    weights, expert_ids = layer.router(x_flat)
    gates = dense_gates(weights, expert_ids, layer.n_experts).to(x.dtype)             # (N, E)
    all_outputs = torch.stack([expert(x_flat) for expert in layer.experts], dim=1)    # (N, E, D)
    routed = torch.einsum("ne,ned->nd", gates, all_outputs)
    return (routed + layer.shared_output(x_flat)).view_as(x)


# ---------------------------------------------------------------- dispatch and combine

@dataclass(frozen=True)
class Dispatch:
    """Where each of the N*k (token, slot) assignments went, in the packed per-expert layout.

    Kept assignments (M of them) are grouped by expert, in token order inside each group:
      expert_inputs   (M, D)  the token rows, expert 0's first: torch.split(expert_inputs, tokens_per_expert)
                              gives the per-expert buffers (a padded (E, C, D) buffer holds the same rows)
      token_index     (M,)    the token each row came from
      slot_index      (M,)    which of that token's k choices it is (to find its weight)
      tokens_per_expert       kept rows per expert (E ints, each <= capacity)
    Dropped assignments (the expert was full when the token came), in token order:
      dropped_token_index, dropped_slot_index  (n_dropped,)
    """

    expert_inputs: Tensor
    token_index: Tensor
    slot_index: Tensor
    tokens_per_expert: tuple[int, ...]
    dropped_token_index: Tensor
    dropped_slot_index: Tensor
    capacity: int | None

    @property
    def n_kept(self) -> int:
        return int(self.token_index.numel())

    @property
    def n_dropped(self) -> int:
        return int(self.dropped_token_index.numel())

    def per_expert_inputs(self) -> tuple[Tensor, ...]:
        """Expert e's rows, (tokens_per_expert[e], D), for each e."""
        return torch.split(self.expert_inputs, list(self.tokens_per_expert))


def capacity_for(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Rows each expert accepts: ceil(capacity_factor * n_tokens * top_k / n_experts) (GShard, Switch).

    capacity_factor 1.0 is exactly the fair share of the N*k assignments; above 1 leaves room for imbalance.
    The factor is read as the decimal it is written as (1.1 is 11/10), so the ceiling is not nudged up by
    binary rounding.
    """
    _check_positive_int(n_experts=n_experts, top_k=top_k)
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 0:
        raise ValueError(f"n_tokens must be a non-negative int, got {n_tokens!r}")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor!r}")
    return math.ceil(Fraction(str(capacity_factor)) * n_tokens * top_k / n_experts)


def _check_routing(expert_ids: Tensor, n_experts: int, n_tokens: int | None = None) -> None:
    _check_positive_int(n_experts=n_experts)
    if expert_ids.ndim != 2 or expert_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"expert_ids must be an integer tensor of shape (N, k), got {expert_ids.dtype} "
                         f"{tuple(expert_ids.shape)}")
    if n_tokens is not None and expert_ids.shape[0] != n_tokens:
        raise ValueError(f"expert_ids has {expert_ids.shape[0]} rows for {n_tokens} tokens")
    if expert_ids.numel() and (int(expert_ids.min()) < 0 or int(expert_ids.max()) >= n_experts):
        raise ValueError(f"expert_ids must lie in [0, {n_experts}), got values from {int(expert_ids.min())} "
                         f"to {int(expert_ids.max())}")


def dispatch(x: Tensor, expert_ids: Tensor, n_experts: int, capacity: int | None) -> Dispatch:
    """Group the token rows x (N, D) by the experts in expert_ids (N, k); keep at most `capacity` per expert.

    Assignment a = n * k + j is token n's j-th choice. A stable sort by expert id lists each expert's assignments
    in token order; the first `capacity` of them are kept and the rest dropped (first come, first served, as
    Switch does; GShard's top-2 gating instead seats every token's first choice before any second choice).
    capacity=None keeps everything.
    """
    if x.ndim != 2:
        raise ValueError(f"x must have shape (N, D), got {tuple(x.shape)}; flatten the batch with x.reshape(-1, D)")
    _check_routing(expert_ids, n_experts, x.shape[0])
    if capacity is not None and (not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0):
        raise ValueError(f"capacity must be None or a non-negative int, got {capacity!r}")
    k = expert_ids.shape[1]
    flat_ids = expert_ids.reshape(-1).long()                                  # (N*k,) expert of assignment a
    order = torch.argsort(flat_ids, stable=True)                              # assignments grouped by expert
    counts = torch.bincount(flat_ids, minlength=n_experts)                    # (E,)
    group_start = torch.cumsum(counts, 0) - counts                            # first position of each group
    position_in_expert = torch.arange(order.numel(), device=order.device) - group_start[flat_ids[order]]
    keep = torch.ones_like(order, dtype=torch.bool) if capacity is None else position_in_expert < capacity
    kept, dropped = order[keep], order[~keep].sort().values                   # dropped listed in token order
    kept_counts = counts if capacity is None else counts.clamp(max=capacity)
    token_index = kept // k
    return Dispatch(expert_inputs=x.index_select(0, token_index), token_index=token_index, slot_index=kept % k,
                    tokens_per_expert=tuple(kept_counts.tolist()), dropped_token_index=dropped // k,
                    dropped_slot_index=dropped % k, capacity=capacity)


def run_experts(experts: Sequence[nn.Module], plan: Dispatch) -> Tensor:
    """Each expert once on its own rows: (M, D) outputs in the plan's packed order (experts with no rows skipped)."""
    if len(experts) != len(plan.tokens_per_expert):
        raise ValueError(f"got {len(experts)} experts for a dispatch over {len(plan.tokens_per_expert)} experts")
    chunks = [expert(rows) for expert, rows in zip(experts, plan.per_expert_inputs()) if rows.shape[0]]
    return torch.cat(chunks) if chunks else plan.expert_inputs.clone()


def combine(expert_outputs: Tensor, plan: Dispatch, weights: Tensor, n_tokens: int) -> Tensor:
    """Weighted sum back in the tokens' ORIGINAL order: out[n] = sum of w[n, j] * output over n's kept assignments.

    expert_outputs (M, D) in the plan's packed order, weights (N, k) from the router. Rows are added at their
    token's index (index_add_), so the order in which experts ran does not matter; a dropped assignment adds
    nothing (a token with all k dropped gets zeros: a transformer layer then passes it on by the residual alone).
    """
    if expert_outputs.ndim != 2 or expert_outputs.shape[0] != plan.n_kept:
        raise ValueError(f"expert_outputs must have shape ({plan.n_kept}, D), one row per kept assignment, "
                         f"got {tuple(expert_outputs.shape)}")
    if weights.ndim != 2 or weights.shape[0] != n_tokens:
        raise ValueError(f"weights must have shape ({n_tokens}, k), got {tuple(weights.shape)}")
    w = weights[plan.token_index, plan.slot_index].to(expert_outputs.dtype)        # (M,)
    out = torch.zeros(n_tokens, expert_outputs.shape[1], dtype=expert_outputs.dtype, device=expert_outputs.device)
    return out.index_add_(0, plan.token_index, expert_outputs * w[:, None])


# ---------------------------------------------------------------- load

def expert_load(expert_ids: Tensor, n_experts: int) -> Tensor:
    """Assignments per expert, (E,) long: how many of the N*k (token, slot) choices picked each expert."""
    _check_routing(expert_ids, n_experts)
    return torch.bincount(expert_ids.reshape(-1).long(), minlength=n_experts)


def contiguous_placement(n_experts: int, ep_size: int) -> list[int]:
    """Experts spread evenly over ep_size ranks in blocks: expert e on rank e // (n_experts / ep_size)."""
    _check_positive_int(n_experts=n_experts, ep_size=ep_size)
    if n_experts % ep_size:
        raise ValueError(f"ep_size={ep_size} does not divide n_experts={n_experts}")
    return [e // (n_experts // ep_size) for e in range(n_experts)]


def rank_load(load: Tensor, placement: Sequence[int], n_ranks: int | None = None) -> Tensor:
    """Assignments per rank, (R,) long: rank r's load is the sum of load[e] over the experts e with placement[e] == r.

    load: `expert_load`'s (E,) counts; placement: the rank of each expert (length E); n_ranks defaults to
    max(placement) + 1. The busiest rank sets the layer's time: max / mean is its imbalance.
    """
    if load.ndim != 1:
        raise ValueError(f"load must be a 1-D tensor of per-expert counts, got shape {tuple(load.shape)}")
    if len(placement) != load.shape[0]:
        raise ValueError(f"placement has {len(placement)} entries for {load.shape[0]} experts; it must name the "
                         "rank of every expert")
    if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in placement):
        raise ValueError(f"placement must hold non-negative int ranks, got {list(placement)}")
    n_ranks = max(placement, default=-1) + 1 if n_ranks is None else n_ranks
    if placement and max(placement) >= n_ranks:
        raise ValueError(f"placement names rank {max(placement)} but n_ranks={n_ranks}")
    ranks = torch.tensor(list(placement), dtype=torch.long, device=load.device)
    return torch.zeros(n_ranks, dtype=load.dtype, device=load.device).index_add_(0, ranks, load)
