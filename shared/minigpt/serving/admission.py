"""Admission control and backpressure (lab 08, learner piece 2).

The server holds at most `capacity` requests at once (queued in the engine or running). A request that
finds every slot taken is refused AT ONCE with 429 Too Many Requests and a `Retry-After` header, instead
of waiting for a free slot: a waiting request holds a connection and memory, and once arrivals exceed
capacity the queueing delay of everyone behind it grows without bound. The client backs off and retries
after the given time (the openai package does this by itself).

    slots = AdmissionSlots(capacity=64)
    async with admitted(slots, retry_after_s=1.0):      # QueueFull(1.0) at once if all 64 slots are taken
        ...serve the request...                         # the slot is given back on exit, whatever happens

Everything runs in the server's event loop (one thread), so checking `in_use` and taking the slot with no
`await` in between cannot race.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

__all__ = ["AdmissionSlots", "QueueFull", "admitted"]


@dataclass
class AdmissionSlots:
    """`capacity` slots, `in_use` of them taken."""

    capacity: int
    in_use: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {self.capacity!r}")


class QueueFull(Exception):
    """Every slot is taken; the client should retry after `retry_after` seconds (the 429's Retry-After)."""

    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__("the server queue is full" + (f"; retry after {retry_after:g} s" if retry_after is not None else ""))
        self.retry_after = retry_after


@asynccontextmanager
async def admitted(slots: AdmissionSlots, retry_after_s: float) -> AsyncIterator[None]:
    """Take a slot without waiting (QueueFull(retry_after_s) if none is free); give it back when the request ends."""
    if slots.in_use >= slots.capacity:
        raise QueueFull(retry_after_s)
    slots.in_use += 1
    try:
        yield
    finally:
        slots.in_use -= 1
