"""Exercise 6: EPLB-style placement, hot experts replicated so the slowest rank carries less.

    check_eplb_placement(eplb_placement)   six loads (skewed, one very hot expert first or last, no spare slot,
                                           uniform, a measured-looking one): every rank exactly slots_per_rank experts, every
                                           expert somewhere; the slowest rank's load, computed here with each
                                           expert's tokens split evenly over its replicas, no higher than the
                                           greedy replicate-then-pack of DeepSeek's EPLB reaches
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.harness import call_learner
from minigpt.moe import eplb

WHAT = "Exercise 6 (eplb_placement)"
REFERENCES = (eplb.eplb_placement,)

# (what, per-expert load, ranks, slots per rank)
CASES = [
    ("skewed load (1/rank^1.2)", [round(1000 / (e + 1) ** 1.2) for e in range(8)], 4, 3),
    ("one very hot expert", [600, 40, 35, 30, 25, 20], 2, 4),
    ("the hottest expert listed last", [20, 25, 30, 35, 40, 600], 2, 4),
    ("no spare slot (packing only)", [90, 10, 50, 40, 70, 30], 3, 2),
    ("uniform load", [100] * 8, 4, 2),
    ("16 experts, a few hot", [310, 12, 44, 9, 150, 20, 18, 7, 220, 15, 11, 30, 8, 61, 25, 10], 4, 5),
]


def _rank_loads(load: list[float], placement: list[list[int]]) -> list[float]:
    """Each rank's tokens, each expert's split evenly over its replicas (the package's rule, run here)."""
    return eplb.rank_loads(torch.tensor(load, dtype=torch.float64), placement).tolist()


def _greedy_bound(load: list[float], n_ranks: int, slots: int) -> float:
    """The slowest rank's load the greedy reaches, the worse of its two tie-breaks (experts listed in either order):
    a learner's greedy that breaks ties the other way is as good an answer."""
    worst = 0.0
    for order in (list(range(len(load))), list(reversed(range(len(load))))):
        placed = eplb.eplb_placement(torch.tensor([load[e] for e in order], dtype=torch.float64), n_ranks, slots)
        worst = max(worst, max(_rank_loads(load, [[order[i] for i in rank] for rank in placed])))
    return worst


def _valid(got: Any, n_experts: int, n_ranks: int, slots: int, where: str) -> list[list[int]]:
    if (not isinstance(got, (list, tuple)) or len(got) != n_ranks
            or not all(isinstance(rank, (list, tuple)) for rank in got)):
        raise AssertionError(f"{where}: return a list of {n_ranks} lists, the expert ids each rank hosts")
    placement = [list(rank) for rank in got]
    for r, rank in enumerate(placement):
        if len(rank) != slots:
            raise AssertionError(f"{where}: rank {r} hosts {len(rank)} experts; every rank has exactly {slots} slots "
                                 "(fill the spare ones with replicas of hot experts)")
        if any(not isinstance(e, int) or isinstance(e, bool) or not 0 <= e < n_experts for e in rank):
            raise AssertionError(f"{where}: rank {r} hosts {rank}; expert ids are ints in [0, {n_experts})")
    missing = sorted(set(range(n_experts)) - {e for rank in placement for e in rank})
    if missing:
        raise AssertionError(f"{where}: expert(s) {missing} are on no rank; tokens routed to them would have nowhere "
                             "to go")
    return placement


def check_eplb_placement(fn: Callable) -> None:
    """fn(load, n_ranks, slots_per_rank) -> list of n_ranks lists of expert ids: replicate, then pack."""
    own_work(fn, REFERENCES, what=WHAT)
    for name, load, n_ranks, slots in CASES:
        where = f"{WHAT}, {name}: {len(load)} experts on {n_ranks} ranks x {slots} slots"
        with no_calls_into(*REFERENCES, what=WHAT):
            got = call_learner(WHAT, fn, torch.tensor(load, dtype=torch.float64), n_ranks, slots, context=where)
        placement = _valid(got, len(load), n_ranks, slots, where)
        loads = _rank_loads(load, placement)
        best = _greedy_bound(load, n_ranks, slots)
        if max(loads) > best * (1 + 1e-9) + 1e-9:
            replicas = [sum(rank.count(e) for rank in placement) for e in range(len(load))]
            doubled = [e for rank in placement for e in set(rank) if rank.count(e) > 1]
            if doubled:
                hint = (f"expert {doubled[0]} has two replicas on one rank: that takes none of the rank's load. ")
            elif n_ranks * slots > len(load) and max(replicas) == 1:
                hint = "no expert was replicated although there are spare slots. "
            else:
                hint = ""
            raise AssertionError(f"{where}: the slowest rank carries {max(loads):.1f} tokens (ranks: "
                                 f"{[round(v, 1) for v in loads]}); replicating then packing greedily reaches "
                                 f"{best:.1f}. {hint}Give each spare slot to the expert with the most tokens per "
                                 "replica, then place the replicas, heaviest first, on the least loaded rank with "
                                 "a free slot")
