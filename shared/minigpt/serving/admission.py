"""Admission control and backpressure (lab 08, learner piece 2).

The server holds at most `max_queue` requests at once (queued in the engine or running). A request that
finds every slot taken is refused AT ONCE with 429 Too Many Requests and a `Retry-After` header, instead
of waiting: a waiting request holds a connection, memory and the client's patience, and makes every
request behind it later too (queueing delay grows without bound once arrivals exceed capacity).
The client (the openai package does this) backs off and retries after the given time.

    async with admitted(slots, retry_after_s):     # QueueFull(retry_after_s) if no slot is free now
        ...serve the request...                    # the slot is released on exit, whatever happens

`slots` is an asyncio.Semaphore(max_queue); everything runs in the event loop, so checking
`slots.locked()` and then acquiring cannot race.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

__all__ = ["QueueFull", "admitted"]


class QueueFull(Exception):
    """Every slot is taken; the client should retry after `retry_after` seconds (the 429's Retry-After)."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"the server queue is full; retry after {retry_after:g} s")
        self.retry_after = retry_after


@asynccontextmanager
async def admitted(slots: asyncio.Semaphore, retry_after_s: float) -> AsyncIterator[None]:
    """Take a slot without waiting (QueueFull if none is free) and give it back when the request ends."""
    if slots.locked():
        raise QueueFull(retry_after_s)
    await slots.acquire()
    try:
        yield
    finally:
        slots.release()
