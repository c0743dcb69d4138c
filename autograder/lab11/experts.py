"""Exercises 4 and 5: a mixture-of-experts layer, then its two exchanges under expert parallelism.

    check_moe_forward(moe_forward)        top-k of the judge's router probabilities, weights renormalised, each of
                                          the judge's experts called once on exactly the rows that chose it (the
                                          judge counts the rows), outputs back at their tokens: equal to the layer
    check_ep_exchange(ep_dispatch, ep_combine)
                                          on 2 and 4 ranks, contiguous and shuffled placements, with and without a
                                          capacity: every row sent to the rank that owns its expert, the kept
                                          assignments exactly the first `capacity` per expert in token order; the
                                          judge itself runs the experts and moves the rows between ranks (so it
                                          counts the bytes), then combine must put every output back at its token

The experts and the router stay in the judge (Callbacks); the all-to-all is the judge's, rank by rank.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from autograder.checking.judge_services import Callback
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.harness import call_learner
from minigpt.moe import ep_exchange, expert_parallel, layer
from minigpt.moe.layer import MoELayer, capacity_for

MOE_WHAT = "Exercise 4 (moe_forward)"
EP_WHAT = "Exercise 5 (ep_dispatch, ep_combine)"
MOE_REFERENCES = (expert_parallel.moe_forward, expert_parallel.ep_moe_forward, layer.dispatch, layer.combine,
                  layer.run_experts, layer.dense_reference, MoELayer)
EP_REFERENCES = (ep_exchange.ep_dispatch, ep_exchange.ep_combine, expert_parallel.ep_moe_forward) + MOE_REFERENCES
ATOL, RTOL = 1e-5, 1e-4


def _layer(d_model: int, n_experts: int, top_k: int, seed: int) -> MoELayer:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MoELayer(d_model, 24, n_experts, top_k).eval()


def _tokens_of(rows: torch.Tensor, x: torch.Tensor) -> list[int | None]:
    """For each row, the index of the token of x it is an exact copy of (None if none)."""
    if rows.numel() == 0:
        return []
    match = (rows[:, None, :] == x[None, :, :]).all(-1)
    return [int(m.nonzero()[0]) if bool(m.any()) else None for m in match]


class _CountedExpert:
    """An expert of the judge's that remembers the rows of every call it ran (a call that fails leaves no record)."""

    def __init__(self, expert: torch.nn.Module) -> None:
        self.expert, self.calls = expert, []

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if type(rows) not in (torch.Tensor, torch.nn.Parameter) or rows.ndim != 2:
            raise TypeError("an expert takes a (rows, d_model) tensor")
        rows = rows.detach().clone()
        with torch.no_grad():
            out = self.expert(rows)
        self.calls.append(rows)
        return out


# ---------------------------------------------------------------------------------------------------
# Exercise 4
# ---------------------------------------------------------------------------------------------------

def _check_calls(counted: list[_CountedExpert], x: torch.Tensor, expert_ids: torch.Tensor, where: str) -> None:
    n = x.shape[0]
    for e, c in enumerate(counted):
        calls = [rows for rows in c.calls if rows.shape[0]]
        chose = sorted(int(t) for t in (expert_ids == e).any(-1).nonzero().flatten())
        if len(calls) > 1:
            raise AssertionError(f"{where}: expert {e} was called {len(calls)} times; gather all the rows that chose "
                                 "it and call it once (one batched matmul per expert, not one call per token)")
        seen = _tokens_of(calls[0], x) if calls else []
        if len(seen) == n and len(chose) < n:
            raise AssertionError(f"{where}: expert {e} ran on all {n} tokens although {len(chose)} chose it: that is "
                                 "the dense reference, k/E of the work wasted. Run each expert only on its tokens")
        if None in seen:
            raise AssertionError(f"{where}: expert {e} got a row that is not one of the input tokens (pass the rows "
                                 "of x themselves; weight the OUTPUTS, not the inputs)")
        if sorted(seen) != chose:
            raise AssertionError(f"{where}: expert {e} ran on tokens {sorted(seen)}; the tokens whose top-k chose it "
                                 f"are {chose}")


def _check_one_moe(fn: Callable, n_tokens: int, d_model: int, n_experts: int, top_k: int, seed: int) -> None:
    moe = _layer(d_model, n_experts, top_k, seed)
    x = torch.randn(n_tokens, d_model, generator=torch.Generator().manual_seed(seed + 100))
    counted = [_CountedExpert(e) for e in moe.experts]
    with torch.no_grad():
        want = moe(x)
        probs = moe.router.probabilities(x)
        raw_w, ids = torch.topk(probs, top_k, dim=-1)
        plan = layer.dispatch(x, ids, n_experts, None)
        unnormalised = layer.combine(layer.run_experts(moe.experts, plan), plan, raw_w, n_tokens)

    def probabilities(rows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return moe.router.probabilities(rows)

    where = f"{MOE_WHAT}, {n_tokens} tokens, {n_experts} experts, top-{top_k}"
    with no_calls_into(*MOE_REFERENCES, what=MOE_WHAT):
        got: Any = call_learner(MOE_WHAT, fn, x.clone(), Callback(probabilities), [Callback(c) for c in counted],
                                top_k, context=where)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(x.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise AssertionError(f"{where}: return a tensor of shape {tuple(x.shape)}, got {shape}")
    _check_calls(counted, x, ids, where)
    if not torch.allclose(got, want, atol=ATOL, rtol=RTOL):
        if torch.allclose(got, unnormalised, atol=ATOL, rtol=RTOL) and top_k > 1:
            raise AssertionError(f"{where}: the top-k weights are the raw probabilities; renormalise them so each "
                                 "token's k weights add up to 1 (w_e = p_e / sum of its top-k p)")
        raise AssertionError(f"{where}: the output differs from the layer's by up to {(got - want).abs().max():.3g}. "
                             "Add w[n, j] * expert(x[n]) to token n's own row (index_add_ at the token's index), "
                             "not to the row at the position where the output came out")


def check_moe_forward(fn: Callable) -> None:
    """fn(x (N, D), probabilities, experts, top_k) -> (N, D): top-k, renormalised, each expert once on its rows."""
    own_work(fn, MOE_REFERENCES, what=MOE_WHAT)
    for n_tokens, d_model, n_experts, top_k, seed in ((12, 16, 8, 2, 0), (9, 8, 4, 1, 1), (10, 16, 6, 3, 2),
                                                      (3, 8, 8, 2, 3)):
        _check_one_moe(fn, n_tokens, d_model, n_experts, top_k, seed)


# ---------------------------------------------------------------------------------------------------
# Exercise 5
# ---------------------------------------------------------------------------------------------------

# (ranks, experts, top-k, tokens per rank, placement, capacity factor or None, skewed routing)
EP_CASES = [
    (1, 4, 2, 5, [0, 0, 0, 0], None, False),                 # EP 1: every expert local, nothing crosses
    (2, 4, 2, 6, [0, 0, 1, 1], None, False),
    (4, 8, 2, 8, [3, 1, 0, 2, 1, 3, 2, 0], None, False),
    (2, 4, 2, 10, [0, 0, 1, 1], 1.0, True),
    (4, 8, 1, 6, [0, 0, 1, 1, 2, 2, 3, 3], 1.0, True),
    (2, 6, 2, 9, [1, 0, 1, 0, 1, 0], 1.25, True),
]
D_MODEL = 8


def _routing(n_tokens: int, n_experts: int, top_k: int, skewed: bool, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(weights (N, k) summing to 1, expert_ids (N, k) distinct per token); skewed: expert e drawn with weight 1/(e+1)^2."""
    prefs = (1.0 / torch.arange(1, n_experts + 1, dtype=torch.float64) ** 2 if skewed
             else torch.ones(n_experts, dtype=torch.float64))
    ids = torch.stack([torch.multinomial(prefs, top_k, replacement=False, generator=g) for _ in range(n_tokens)])
    w = torch.rand(n_tokens, top_k, generator=g) + 0.1
    return w / w.sum(-1, keepdim=True), ids


def _as_chunks(got: Any, n_ranks: int, what: str, where: str, *, long: bool = False) -> list[torch.Tensor]:
    if not isinstance(got, (list, tuple)) or len(got) != n_ranks or not all(isinstance(t, torch.Tensor) for t in got):
        raise AssertionError(f"{where}: {what} must be a list of {n_ranks} tensors, one per destination rank")
    if long and any(t.dtype not in (torch.int64, torch.int32) or t.ndim != 1 for t in got):
        raise AssertionError(f"{where}: {what} must hold 1-D integer tensors (the expert id of each row sent)")
    if not long and any(t.ndim != 2 or t.shape[1] != D_MODEL for t in got):
        raise AssertionError(f"{where}: {what} must hold (rows, d_model={D_MODEL}) tensors (0 rows where nothing goes)")
    return list(got)


def _check_sent(rows: list[torch.Tensor], experts: list[torch.Tensor], x: torch.Tensor, ids: torch.Tensor,
                placement: Sequence[int], capacity: int | None, reference: tuple, where: str) -> None:
    """Every row goes to its expert's owner, and the kept (token, expert) pairs are the reference's."""
    n_experts = len(placement)
    kept: list[tuple[int, int]] = []
    for d, (chunk, ex) in enumerate(zip(rows, experts)):
        if chunk.shape[0] != ex.shape[0]:
            raise AssertionError(f"{where}: rank {d} gets {chunk.shape[0]} rows but {ex.shape[0]} expert ids")
        for token, e in zip(_tokens_of(chunk, x), ex.tolist()):
            if not 0 <= e < n_experts or placement[e] != d:
                owner = placement[e] if 0 <= e < n_experts else None
                raise AssertionError(f"{where}: a row for expert {e} went to rank {d}, but expert {e} lives on rank "
                                     f"{owner}: send each row to placement[expert]")
            if token is None:
                raise AssertionError(f"{where}: a row sent to rank {d} is not one of this rank's tokens")
            if e not in ids[token].tolist():
                raise AssertionError(f"{where}: token {token} was sent to expert {e}, which it did not choose")
            kept.append((token, e))
    if len(set(kept)) != len(kept):
        raise AssertionError(f"{where}: some (token, expert) assignment was sent twice")
    want_rows, want_experts, _ = reference
    want = sorted((t, e) for chunk, ex in zip(want_rows, want_experts) for t, e in zip(_tokens_of(chunk, x),
                                                                                      ex.tolist()))
    if sorted(kept) == want:
        return
    per_expert = torch.bincount(torch.tensor([e for _, e in kept], dtype=torch.long), minlength=n_experts)
    if capacity is None:
        raise AssertionError(f"{where}: with no capacity every assignment must be sent ({len(want)} of them); "
                             f"{len(kept)} were")
    over = [e for e in range(n_experts) if per_expert[e] > capacity]
    if over:
        per_rank = [sum(int(per_expert[e]) for e in range(n_experts) if placement[e] == d) for d in range(len(rows))]
        raise AssertionError(f"{where}: expert {over[0]} got {int(per_expert[over[0]])} rows from this rank, more than "
                             f"its capacity ({capacity}). The capacity is per EXPERT, not per destination rank "
                             f"(rows per rank sent: {per_rank})")
    if len(kept) < len(want):
        per_rank = [sum(int(per_expert[e]) for e in range(n_experts) if placement[e] == d) for d in range(len(rows))]
        as_rank = (" It looks as if the capacity was counted per destination RANK (rows per rank sent: "
                   f"{per_rank}); it is per EXPERT." if max(per_rank) <= capacity else "")
        raise AssertionError(f"{where}: {len(want) - len(kept)} more assignments were dropped than the capacity "
                             f"({capacity} rows per expert) requires.{as_rank}")
    raise AssertionError(f"{where}: the kept assignments are not the first {capacity} per expert in token order "
                         "(first come, first served: token 0's choices before token 1's)")


def _exchange(sent: list[list[torch.Tensor]], sent_experts: list[list[torch.Tensor]],
              experts: Sequence[torch.nn.Module]) -> list[list[torch.Tensor]]:
    """What each source rank gets back: returned[r][d] = expert outputs for the rows r sent to d, in their order."""
    with torch.no_grad():
        return [[torch.stack([experts[e](row[None])[0] for row, e in zip(chunk, ex.tolist())])
                 if chunk.shape[0] else chunk.new_zeros(0, D_MODEL)
                 for chunk, ex in zip(sent[r], sent_experts[r])] for r in range(len(sent))]


def check_ep_exchange(dispatch_fn: Callable, combine_fn: Callable) -> None:
    """dispatch_fn(x, expert_ids, placement, n_ranks, capacity) -> (rows per rank, expert ids per rank, plan);
    combine_fn(returned, plan, weights, n_tokens) -> (N, D) in the tokens' original order."""
    own_work(dispatch_fn, EP_REFERENCES, what=EP_WHAT)
    own_work(combine_fn, EP_REFERENCES, what=EP_WHAT)
    for case, (n_ranks, n_experts, top_k, n_tokens, placement, factor, skewed) in enumerate(EP_CASES):
        g = torch.Generator().manual_seed(40 + case)
        experts = _layer(D_MODEL, n_experts, top_k, 50 + case).experts
        capacity = None if factor is None else capacity_for(n_tokens, n_experts, top_k, factor)
        label = (f"{EP_WHAT}, {n_ranks} ranks, {n_experts} experts placed {placement}, top-{top_k}, "
                 f"{n_tokens} tokens a rank, capacity {capacity}")
        references, routes, plans, sent, sent_experts = [], [], [], [], []
        for r in range(n_ranks):
            x = torch.randn(n_tokens, D_MODEL, generator=g)
            w, ids = _routing(n_tokens, n_experts, top_k, skewed, g)
            where = f"{label}, rank {r}"
            with no_calls_into(*EP_REFERENCES, what=EP_WHAT):
                out: Any = call_learner(EP_WHAT, dispatch_fn, x.clone(), ids.clone(), list(placement), n_ranks,
                                        capacity, context=where)
            if not isinstance(out, (list, tuple)) or len(out) != 3:
                raise AssertionError(f"{where}: ep_dispatch must return (rows, expert_ids, plan)")
            rows = _as_chunks(out[0], n_ranks, "rows", where)
            ex = _as_chunks(out[1], n_ranks, "expert ids", where, long=True)
            reference = ep_exchange.ep_dispatch(x, ids, list(placement), n_ranks, capacity)
            _check_sent(rows, ex, x, ids, placement, capacity, reference, where)
            references.append(reference), routes.append((w, ids)), plans.append(out[2])
            sent.append(rows), sent_experts.append(ex)
        returned = _exchange(sent, sent_experts, experts)
        for r in range(n_ranks):
            where = f"{label}, rank {r}"
            w, ids = routes[r]
            with no_calls_into(*EP_REFERENCES, what=EP_WHAT):
                y: Any = call_learner(EP_WHAT, combine_fn, [t.clone() for t in returned[r]], plans[r], w.clone(),
                                      n_tokens, context=where)
            want_rows, want_experts, want_plan = references[r]
            want = ep_exchange.ep_combine(_exchange([want_rows], [want_experts], experts)[0], want_plan, w, n_tokens)
            if not isinstance(y, torch.Tensor) or tuple(y.shape) != (n_tokens, D_MODEL):
                raise AssertionError(f"{where}: ep_combine must return ({n_tokens}, {D_MODEL}), one row per token")
            if not torch.allclose(y, want, atol=ATOL, rtol=RTOL):
                raise AssertionError(f"{where}: the combined output differs from the layer's by up to "
                                     f"{(y - want).abs().max():.3g}. Each returned row belongs to the token it was "
                                     "sent for: add w[n, j] * output to token n's row in the ORIGINAL order (not "
                                     "in the order rows were sent); a dropped assignment adds nothing")
