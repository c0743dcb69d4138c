"""Expert-parallel load balancing (lab 11): valid placements, a slowest rank no slower after replication, and Zipf
routing that is skewed, seeded and gives each token distinct experts."""

from __future__ import annotations

import pytest
import torch

from minigpt.moe.eplb import eplb_placement, rank_loads, replica_counts, zipf_routing
from minigpt.moe.layer import expert_load


def contiguous(n_experts: int, n_ranks: int) -> list[list[int]]:
    per = n_experts // n_ranks
    return [list(range(r * per, (r + 1) * per)) for r in range(n_ranks)]


def assert_valid(placement: list[list[int]], n_experts: int, n_ranks: int, slots: int) -> None:
    assert len(placement) == n_ranks, f"expected {n_ranks} ranks, got {len(placement)}"
    assert all(len(p) == slots for p in placement), f"every rank needs {slots} slots, got {placement}"
    hosted = sorted({e for p in placement for e in p})
    assert hosted == list(range(n_experts)), f"every expert at least once, got {placement}"


# ---------------------------------------------------------------- by hand

def test_hand_checked_placement() -> None:
    """load [6, 2, 1, 1], 2 ranks x 3 slots: the 2 spare slots both go to expert 0 (6/1, then 6/2 = 3 > 2), so
    expert 0 has 3 replicas of 2 tokens; packing heaviest first: 0 -> r0, 0 -> r1 (r0 already hosts it),
    0 -> r0 (both host it, tie), 1 -> r1 (2 < 4), 2 -> r0 (tie 4 = 4), 3 -> r1: loads 5 and 5."""
    placement = eplb_placement([6, 2, 1, 1], n_ranks=2, slots_per_rank=3)
    assert placement == [[0, 0, 2], [0, 1, 3]]
    assert rank_loads([6, 2, 1, 1], placement).tolist() == [5.0, 5.0]
    assert rank_loads([6, 2, 1, 1], [[0, 1], [2, 3]]).tolist() == [8.0, 2.0]


def test_rank_loads_split_an_expert_evenly_among_its_replicas() -> None:
    assert rank_loads(torch.tensor([4, 2, 2]), [[0, 1], [0, 2]]).tolist() == [4.0, 4.0]
    assert replica_counts([[0, 1], [0, 2]], 3).tolist() == [2, 1, 1]


def test_without_spare_slots_it_is_pure_packing() -> None:
    placement = eplb_placement([5, 4, 3, 3, 2, 1], n_ranks=2, slots_per_rank=3)
    assert_valid(placement, 6, 2, 3)
    assert rank_loads([5, 4, 3, 3, 2, 1], placement).max() == 9     # the best split of 18 into 3 + 3 experts


# ---------------------------------------------------------------- skewed routing

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_ranks, slots", [(4, 4), (4, 5), (8, 3), (2, 9)])
def test_placements_are_valid_and_the_slowest_rank_is_no_slower(seed: int, n_ranks: int, slots: int) -> None:
    n_experts, g = 16, torch.Generator().manual_seed(seed)
    load = expert_load(zipf_routing(2048, n_experts, 2, s=1.2, generator=g), n_experts)
    placement = eplb_placement(load, n_ranks, slots)
    assert_valid(placement, n_experts, n_ranks, slots)
    before = rank_loads(load, contiguous(n_experts, n_ranks)).max()
    after = rank_loads(load, placement)
    assert after.sum() == pytest.approx(float(load.sum()))
    assert after.max() <= before, f"slowest rank {float(after.max()):.1f} tokens after EPLB, {float(before):.1f} before"


def test_replication_brings_the_slowest_rank_near_the_mean_under_zipf() -> None:
    """16 experts on 4 ranks, Zipf s = 1.2, 4096 tokens x 2: contiguous placement leaves the slowest rank at 3309
    assignments (mean 2048, 1.62x); packing alone cannot split the hottest expert (2559) and stops at 2940; one
    spare slot per rank (20 slots, 4 replicas) gets it to 2062.75 (1.007x)."""
    g = torch.Generator().manual_seed(0)
    load = expert_load(zipf_routing(4096, 16, 2, s=1.2, generator=g), 16)
    mean = float(load.sum()) / 4
    before = float(rank_loads(load, contiguous(16, 4)).max())
    packed = float(rank_loads(load, eplb_placement(load, 4, 4)).max())
    replicated = float(rank_loads(load, eplb_placement(load, 4, 5)).max())
    assert (before, packed, replicated, mean) == (3309.0, 2940.0, 2062.75, 2048.0)
    assert replicated < packed < before


def test_refuses_too_few_slots_and_bad_loads() -> None:
    with pytest.raises(ValueError, match="cannot host"):
        eplb_placement([1, 2, 3], n_ranks=1, slots_per_rank=2)
    with pytest.raises(ValueError, match="non-negative"):
        eplb_placement([1, -2, 3], n_ranks=3, slots_per_rank=1)
    with pytest.raises(ValueError, match="hosted by no rank"):
        rank_loads([1, 2, 3], [[0, 1]])


# ---------------------------------------------------------------- Zipf routing

def test_zipf_routing_is_seeded_distinct_and_skewed() -> None:
    a = zipf_routing(1000, 16, 4, s=1.0, generator=torch.Generator().manual_seed(3))
    b = zipf_routing(1000, 16, 4, s=1.0, generator=torch.Generator().manual_seed(3))
    assert a.shape == (1000, 4) and a.dtype == torch.long and torch.equal(a, b)
    assert all(len(set(row)) == 4 for row in a.tolist()), "a token's experts must be distinct"
    skewed = expert_load(a, 16).double()
    uniform = expert_load(zipf_routing(1000, 16, 4, s=0.0, generator=torch.Generator().manual_seed(3)), 16).double()
    assert skewed.max() / skewed.mean() > 2.0, f"s=1 should give hot experts, max/mean {skewed.max() / skewed.mean():.2f}"
    assert uniform.max() / uniform.mean() < 1.25, f"s=0 is uniform, max/mean {uniform.max() / uniform.mean():.2f}"
