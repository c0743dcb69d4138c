"""One clock for the two processes of a disaggregated run: seconds since an instant both agree on.

    now = shared_clock()          # on every rank, together: a barrier, then rank 0's perf_counter() broadcast
    t = now()                     # seconds since that instant
    now.at(time.perf_counter())   # a stamp taken earlier, on the same scale

time.perf_counter is CLOCK_MONOTONIC on Linux, one clock for every process of the host, so readings from the
prefill and the decode process can be subtracted from each other.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

__all__ = ["RunClock", "shared_clock"]


class RunClock:
    """Seconds since `start` (a time.perf_counter() reading): clock() now, clock.at(t) for a perf_counter stamp t."""

    def __init__(self, start: float) -> None:
        self.start = start

    def __call__(self) -> float:
        return time.perf_counter() - self.start

    def at(self, t: float) -> float:
        return t - self.start


def shared_clock() -> RunClock:
    """After a barrier, rank 0's perf_counter() goes to every rank: all measure from that instant."""
    dist.barrier()
    start = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.broadcast(start, 0)
    return RunClock(float(start))
