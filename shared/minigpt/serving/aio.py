"""Running a coroutine from synchronous code, in a plain script and inside Jupyter alike (lab 08).

`asyncio.run` refuses to start when the calling thread already runs an event loop, which is the case in a
Jupyter kernel. `run_sync` then runs the coroutine on a fresh loop in a worker thread and waits for it.

    records = run_sync(run_benchmark(url, prompts))
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Coroutine, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(coro: Coroutine[object, object, T]) -> T:
    """The coroutine's result (or its exception), whether or not this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-sync") as pool:
        return pool.submit(asyncio.run, coro).result()
