"""Ranks the judge plays one after another, its own communicator answering their collectives (labs 07 and 09).

A check whose learner code takes part in collectives (lab 07's parallel linears and vocabulary-parallel logits, lab
09's ring attention) does not start threads or processes: it calls the learner's code for rank 0, 1, ..., n-1 in
turn (over the wire when judged), each rank with a `CountingComm` of the judge's whose backend is a `ReplayBackend`.
The k-th collective of a round is answered with what the ranks gave their k-th collective in the previous round
(copies of the rank's own tensor in the first, a wrong answer on purpose), and rounds repeat until what the ranks give
stops changing: then each rank saw exactly what real collectives would have given it.

    comms = replay_comms(n)
    results, first = replayed_ranks(lambda rank, comm: learner_fn(comm, inputs[rank]), comms, "Exercise 6 (...)")
    results[rank] == (the rank's result, its collective calls, its payload bytes)   # as the judge counted them

Every collective is a request the judge answers and counts on its own objects; nothing the learner's process
reports decides. A `run_rank` may also read `comm.backend.given` and `comm.backend.answered` (what the rank sent and
was handed this round) to judge its result against what it was given.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from minigpt.parallel.comm import CountingComm

__all__ = ["MAX_ROUNDS", "ReplayBackend", "replay_comms", "replayed_ranks", "same_tensor"]

MAX_ROUNDS = 40


class ReplayBackend:
    """One rank of a world run one rank at a time (no threads, no processes): the k-th collective of a round
    answers with what every rank gave its k-th collective in the previous round (copies of this rank's own tensor
    in the first). Rounds repeat until the tensors given are the ones answered for: then each rank saw exactly
    what real collectives would have given it. For a deterministic function of its inputs, as a forward pass is.

    `given[k]` is (op, the tensor the rank gave its k-th collective of this round), `answered[k]` what it got back;
    both are the judge's own copies."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.previous: list[list[tuple[str, torch.Tensor]]] | None = None
        self.given: list[tuple[str, torch.Tensor]] = []
        self.answered: list[torch.Tensor | list[torch.Tensor]] = []

    def new_round(self, previous: list[list[tuple[str, torch.Tensor]]] | None) -> None:
        self.previous, self.given, self.answered = previous, [], []

    def _parts(self, op: str, t: torch.Tensor) -> list[torch.Tensor]:
        k = len(self.given)
        self.given.append((op, t.detach().clone()))
        if self.previous is None or any(len(p) <= k for p in self.previous):
            return [t.detach().clone() for _ in range(self.world_size)]
        return [p[k][1].clone() for p in self.previous]

    def _answer(self, out: Any) -> Any:
        self.answered.append([t.clone() for t in out] if isinstance(out, list) else out.clone())
        return out

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        parts = self._parts("all_reduce", t)
        out = parts[0].clone()
        for p in parts[1:]:
            out += p
        return self._answer(out)

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        return self._answer(self._parts("all_gather", t))

    def ring_pass(self, t: torch.Tensor) -> torch.Tensor:
        """What rank r - 1 gave this ring pass (the rank's own tensor in the first round)."""
        return self._answer(self._parts("ring_pass", t)[(self.rank - 1) % self.world_size])


def replay_comms(world_size: int) -> list[CountingComm]:
    """The judge's communicators of a world of `world_size` ranks played one after another (what the learner's code
    gets)."""
    return [CountingComm(ReplayBackend(rank, world_size)) for rank in range(world_size)]


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values, NaN where the other has NaN."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num()) \
        and torch.equal(a.isnan(), b.isnan())


def replayed_ranks(run_rank: Callable[[int, CountingComm], Any], comms: list[CountingComm], what: str,
                   world: str = "tp") -> tuple[list[tuple[Any, dict, dict]], list[Any]]:
    """run_rank(rank, comms[rank]) for every rank, in rounds (ReplayBackend) until each rank's collectives got what
    real ones would give. Returns every rank's (result, collective calls, payload bytes) of that last round, as the
    judge's communicators counted them, and every rank's result of the first round (its collectives answered wrong).
    `world` names the number of ranks in messages ("tp=4")."""
    previous, first = None, None
    for round_number in range(1, MAX_ROUNDS + 1):
        results, given = [], []
        for rank, comm in enumerate(comms):
            comm.backend.new_round(previous)
            comm.stats.reset()
            out = run_rank(rank, comm)
            results.append((out, dict(comm.stats.calls), dict(comm.stats.bytes)))
            given.append(comm.backend.given)
        first = first if first is not None else [out for out, _, _ in results]
        ops = [[op for op, _ in g] for g in given]
        if any(o != ops[0] for o in ops):
            raise AssertionError(f"{what}, {world}={len(comms)}: the ranks called different collectives ({ops}): every "
                                 "rank must call the same collectives in the same order, or they wait for each other "
                                 "forever")
        if previous is not None and all(len(g) == len(p) and all(same_tensor(a[1], b[1]) for a, b in zip(g, p))
                                        for g, p in zip(given, previous)):
            return results, first
        if round_number > len(ops[0]) + 1:        # k collectives settle in k + 1 rounds
            break
        previous = given
    raise AssertionError(f"{what}, {world}={len(comms)}: what your code gives its collectives kept changing from one "
                         "run to the next with the same inputs; it must depend only on its inputs and the collectives")
