"""Expert parallelism (lab 11): the all-to-all collective, and ep_moe_forward equal to the one-process MoE."""

from __future__ import annotations

import pytest
import torch

from minigpt_fixtures import seeded

from minigpt.moe.expert_parallel import ep_bytes_per_layer, ep_moe_forward, moe_forward
from minigpt.moe.layer import MoELayer, capacity_for, combine, contiguous_placement, dispatch, run_experts
from minigpt.parallel.comm import CountingComm, Solo, ring_wire_bytes
from minigpt.parallel.launch import RankError, run_ranks

D, D_FF, E, K = 16, 32, 8, 2


def make_layer(seed: int = 0, n_experts: int = E, top_k: int = K) -> MoELayer:
    return seeded(seed, lambda: MoELayer(D, D_FF, n_experts, top_k).eval())


def make_tokens(seed: int, sizes: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, D, generator=g) for n in sizes]


def routing(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    return layer.router(x)[1]


def _ep_worker(comm: CountingComm, xs: list[torch.Tensor], layer: MoELayer, placement: list[int],
               capacity: int | None):
    mine = {e: layer.experts[e] for e, r in enumerate(placement) if r == comm.rank}
    with torch.no_grad():
        y, dropped = ep_moe_forward(xs[comm.rank], layer.router.probabilities, mine, comm, placement, K, capacity)
    return y, dropped, dict(comm.stats.calls), dict(comm.stats.bytes)


# ---------------------------------------------------------------- the all-to-all

def _exchange(comm: CountingComm):
    """Rank r sends r + s rows of value 10 r + s to rank s (rank 0 sends itself 0 rows)."""
    chunks = [torch.full((comm.rank + s, 3), float(10 * comm.rank + s)) for s in range(comm.world_size)]
    return comm.all_to_all(chunks), dict(comm.stats.calls), dict(comm.stats.bytes)


@pytest.mark.parametrize("backend, n", [("threads", 2), ("threads", 3), ("gloo", 2)])
def test_all_to_all_delivers_uneven_and_empty_chunks(backend: str, n: int) -> None:
    for rank, (received, calls, nbytes) in enumerate(run_ranks(_exchange, n, backend=backend, timeout_s=60)):
        assert [tuple(c.shape) for c in received] == [(src + rank, 3) for src in range(n)]
        for src, c in enumerate(received):
            assert torch.equal(c, torch.full((src + rank, 3), float(10 * src + rank))), (rank, src, c)
        sent_elsewhere = sum((rank + s) * 3 * 4 for s in range(n) if s != rank)
        assert calls == {"all_to_all": 1} and nbytes == {"all_to_all": sent_elsewhere}


def test_all_to_all_wire_bytes_are_its_payload() -> None:
    assert ring_wire_bytes("all_to_all", 1234, 4) == 1234      # only chunks for other ranks were counted


def test_solo_all_to_all_returns_its_own_chunk_and_counts_nothing() -> None:
    comm = CountingComm(Solo())
    chunk = torch.arange(6.0).view(3, 2)
    (out,) = comm.all_to_all([chunk])
    assert torch.equal(out, chunk) and out is not chunk
    assert comm.stats.calls["all_to_all"] == 1 and comm.stats.bytes["all_to_all"] == 0


def test_all_to_all_refuses_a_wrong_number_of_chunks_or_mixed_shapes() -> None:
    comm = CountingComm(Solo())
    with pytest.raises(ValueError, match="list of 1 tensors"):
        comm.all_to_all([torch.zeros(1, 2), torch.zeros(1, 2)])
    with pytest.raises(RankError, match="trailing shape and dtype"):
        run_ranks(lambda c: c.all_to_all([torch.zeros(1, 2), torch.zeros(1, 3)]), 2, backend="threads")


# ---------------------------------------------------------------- one process

def test_moe_forward_is_the_layers_math() -> None:
    layer = make_layer(1)
    (x,) = make_tokens(1, [20])
    with torch.no_grad():
        torch.testing.assert_close(moe_forward(x, layer.router.probabilities, layer.experts, K), layer(x))


def test_moe_forward_calls_each_expert_once_on_its_rows_only() -> None:
    layer = make_layer(2)
    (x,) = make_tokens(2, [12])
    ids = routing(layer, x)
    seen: dict[int, list[int]] = {}

    def recording(e: int):
        def fn(rows: torch.Tensor) -> torch.Tensor:
            seen.setdefault(e, []).append(rows.shape[0])
            return layer.experts[e](rows)
        return fn

    with torch.no_grad():
        moe_forward(x, layer.router.probabilities, [recording(e) for e in range(E)], K)
    expected = {e: [int((ids == e).sum())] for e in range(E) if (ids == e).any()}
    assert seen == expected, f"expected one call per routed expert with its row count {expected}, got {seen}"


# ---------------------------------------------------------------- EP == one process

@pytest.mark.parametrize("backend, n_ranks", [("threads", 2), ("threads", 4), ("gloo", 2)])
def test_expert_parallel_equals_one_process_without_drops(backend: str, n_ranks: int) -> None:
    layer = make_layer(3)
    xs = make_tokens(3, [11 + 3 * r for r in range(n_ranks)])
    placement = contiguous_placement(E, n_ranks)
    results = run_ranks(_ep_worker, n_ranks, xs, layer, placement, None, backend=backend, timeout_s=90)
    for rank, (y, dropped, calls, _) in enumerate(results):
        with torch.no_grad():
            expected = moe_forward(xs[rank], layer.router.probabilities, layer.experts, K)
        torch.testing.assert_close(y, expected, msg=lambda m: f"rank {rank}: {m}")
        assert dropped == 0 and calls == {"all_to_all": 3}


@pytest.mark.parametrize("n_ranks", [2, 4])
def test_bytes_counted_equal_the_formula(n_ranks: int) -> None:
    layer = make_layer(4)
    xs = make_tokens(4, [16] * n_ranks)
    placement = contiguous_placement(E, n_ranks)
    results = run_ranks(_ep_worker, n_ranks, xs, layer, placement, None, backend="threads")
    counted = sum(nbytes["all_to_all"] for *_, nbytes in results)
    formula = ep_bytes_per_layer([routing(layer, x) for x in xs], placement, D)
    assert counted == formula.total, f"CountingComm counted {counted} bytes, ep_bytes_per_layer says {formula}"
    assert formula.dispatch == formula.combine == formula.remote_rows * D * 4 > 0


def test_bytes_formula_by_hand() -> None:
    ids0 = torch.tensor([[0, 1], [0, 2]])      # rank 0 owns experts 0, 1: one remote row (expert 2)
    ids1 = torch.tensor([[0, 3], [2, 3]])      # rank 1 owns 2, 3: one remote row (expert 0)
    b = ep_bytes_per_layer([ids0, ids1], [0, 0, 1, 1], d_model=10)
    assert (b.remote_rows, b.dispatch, b.combine, b.expert_ids, b.total) == (2, 80, 80, 16, 176)
    assert ep_bytes_per_layer([ids0, ids1], [0, 0, 1, 1], d_model=10, capacity=0).total == 0


@pytest.mark.parametrize("n_ranks", [2, 4])
def test_capacity_drops_per_expert_on_the_source_rank_like_dispatch(n_ranks: int) -> None:
    layer = make_layer(5)
    xs = make_tokens(5, [24] * n_ranks)
    capacity = capacity_for(24, E, K, capacity_factor=1.0)                  # the rank's own tokens: 6 rows
    placement = contiguous_placement(E, n_ranks)
    results = run_ranks(_ep_worker, n_ranks, xs, layer, placement, capacity, backend="threads")
    total_dropped = 0
    for rank, (y, dropped, _, nbytes) in enumerate(results):
        x = xs[rank]
        with torch.no_grad():
            weights, ids = layer.router(x)
            plan = dispatch(x, ids, E, capacity)
            expected = combine(run_experts(layer.experts, plan), plan, weights, x.shape[0])
        assert dropped == plan.n_dropped, f"rank {rank}: dropped {dropped}, moe.layer.dispatch drops {plan.n_dropped}"
        torch.testing.assert_close(y, expected)
        total_dropped += dropped
    assert total_dropped > 0, "the test needs a capacity that drops something"
    counted = sum(nbytes["all_to_all"] for *_, nbytes in results)
    with torch.no_grad():
        assert counted == ep_bytes_per_layer([routing(layer, x) for x in xs], placement, D, capacity).total


def test_combine_restores_each_tokens_own_row_under_an_interleaved_placement() -> None:
    """Experts that scale by (e + 1) and distinct tokens: any row added to the wrong token shows."""
    layer = make_layer(6)
    xs = make_tokens(6, [9, 9])
    scales = [lambda rows, e=e: rows * (e + 1) for e in range(E)]
    placement = [e % 2 for e in range(E)]                                     # experts 0,2,4,6 | 1,3,5,7

    def worker(comm: CountingComm):
        mine = {e: scales[e] for e, r in enumerate(placement) if r == comm.rank}
        with torch.no_grad():
            return ep_moe_forward(xs[comm.rank], layer.router.probabilities, mine, comm, placement, K, None)[0]

    for rank, y in enumerate(run_ranks(worker, 2, backend="threads")):
        with torch.no_grad():
            weights, ids = layer.router(xs[rank])
        expected = ((weights * (ids + 1).float()).sum(-1, keepdim=True)) * xs[rank]
        torch.testing.assert_close(y, expected)


def test_a_rank_without_tokens_still_takes_part() -> None:
    """Rank 1 has no tokens: it sends only 0-row chunks and still runs its experts on rank 0's rows."""
    layer = make_layer(7)
    xs = make_tokens(7, [10, 0])
    placement = contiguous_placement(E, 2)
    (y0, _, _, b0), (y1, _, _, b1) = run_ranks(_ep_worker, 2, xs, layer, placement, None, backend="gloo")
    with torch.no_grad():
        torch.testing.assert_close(y0, moe_forward(xs[0], layer.router.probabilities, layer.experts, K))
    assert y1.shape == (0, D)
    assert b0["all_to_all"] + b1["all_to_all"] == ep_bytes_per_layer(
        [routing(layer, x) for x in xs], placement, D).total


def test_placement_must_match_the_local_experts() -> None:
    layer = make_layer(8)
    (x,) = make_tokens(8, [4])
    with pytest.raises(ValueError, match="placement puts"):
        ep_moe_forward(x, layer.router.probabilities, {0: layer.experts[0]}, CountingComm(Solo()), [0] * E, K, None)
