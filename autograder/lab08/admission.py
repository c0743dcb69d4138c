"""Lab 08, exercise 2: admission and backpressure (admitted), scripted and through the server."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import AsyncExitStack
from typing import Callable

import httpx

from autograder.harness import call_learner, quiet
from autograder.lab08.common import (MODEL_NAME, REFUSAL_TIMEOUT_S, REJECTED, TIMEOUT_S, _stub_guard, _wait_for,
                                     check_server)
from autograder.reference_guard import no_calls_into, own_work
from minigpt.serving.admission import AdmissionSlots, QueueFull, admitted
from minigpt.serving.aio import run_sync
from minigpt.serving.replicas import read_metrics


# ---------------------------------------------------------------------------------------------------
# Piece 2: admission and backpressure
# ---------------------------------------------------------------------------------------------------

def _check_admission_unit(fn: Callable) -> None:
    _stub_guard("admitted", fn, "an async context manager", AdmissionSlots(1), 1.0)

    async def scenario() -> str | None:
        slots = AdmissionSlots(2)
        stack = AsyncExitStack()
        for i in range(2):
            try:
                await asyncio.wait_for(stack.enter_async_context(fn(slots, 0.5)), 1.0)
            except QueueFull:
                return f"request {i + 1} was refused although only {i} of 2 slots were taken"
            except asyncio.TimeoutError:
                return f"request {i + 1} waited although {2 - i} of 2 slots were free"
        try:
            await asyncio.wait_for(stack.enter_async_context(fn(slots, 0.5)), 1.0)
            await stack.aclose()
            return ("with 2 of 2 slots taken a third request was admitted: never admit past the capacity "
                    "(refuse when in_use >= capacity)")
        except asyncio.TimeoutError:
            await stack.aclose()
            return ("with every slot taken, the third request WAITED for a free slot instead of being refused at "
                    "once: raise QueueFull(retry_after_s) so the server answers 429 (a waiting request piles up "
                    "latency and connections)")
        except QueueFull as err:
            if getattr(err, "retry_after", None) != 0.5:
                await stack.aclose()
                return (f"QueueFull should carry retry_after=0.5 (the retry_after_s given), got "
                        f"{getattr(err, 'retry_after', None)!r}: it becomes the 429's Retry-After header")
        await stack.aclose()
        if slots.in_use != 0:
            return f"after both requests ended, {slots.in_use} slot(s) are still taken: give the slot back on exit"
        try:
            async with fn(slots, 0.5):
                raise KeyError("boom")
        except KeyError:
            pass
        if slots.in_use != 0:
            return ("a request that failed with an exception kept its slot: give it back in a `finally` "
                    "(a few errors would otherwise fill the queue forever)")
        return None
    problem = call_learner("admitted", run_sync, scenario(), passthrough=(QueueFull,))
    if problem:
        raise AssertionError(problem)


def _post_or_error(url: str, body: dict) -> httpx.Response | Exception:
    try:
        return httpx.post(url + "/v1/completions", json=body, timeout=30)
    except httpx.HTTPError as err:
        return err


def _check_admission_server(fn: Callable) -> None:
    max_queue = 3
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    with check_server(admission=fn, max_queue=max_queue) as (url, aengine):
        aengine.pause()
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(
            httpx.post(url + "/v1/completions", json=body, timeout=30).status_code)) for _ in range(max_queue)]
        try:
            for t in threads:
                t.start()
            if not _wait_for(lambda: read_metrics(url)["minigpt_server_requests_in_flight"] == max_queue, 5.0):
                raise AssertionError(f"{max_queue} requests were sent to a server with max_queue={max_queue} (engine "
                                     f"paused), but only {read_metrics(url)['minigpt_server_requests_in_flight']:g} "
                                     "hold a slot")
            # One more request, in its own thread: watch /metrics while it waits for its answer (a client that gives
            # up would be noticed by the server and its slot freed, hiding an admission past the capacity).
            extra: list = []
            probe = threading.Thread(target=lambda: extra.append(_post_or_error(url, body)))
            probe.start()
            threads.append(probe)
            held = 0.0
            deadline = time.monotonic() + REFUSAL_TIMEOUT_S
            while time.monotonic() < deadline and not extra:
                held = max(held, read_metrics(url)["minigpt_server_requests_in_flight"])
                if held > max_queue:
                    raise AssertionError(f"with the queue full ({max_queue} of {max_queue}) one more request was "
                                         f"admitted ({held:g} in flight, expected 429): never admit past the capacity")
                time.sleep(0.02)
            if not extra:
                raise AssertionError(f"with the queue full ({max_queue} of {max_queue}), a request got no answer "
                                     f"within {REFUSAL_TIMEOUT_S} s: the admission waits instead of refusing with 429")
            r = extra[0]
            if isinstance(r, Exception):
                raise AssertionError(f"with the queue full, a request failed: {type(r).__name__}: {r}")
            if r.status_code != 429:
                raise AssertionError(f"with the queue full ({max_queue} of {max_queue}) a request got {r.status_code}, "
                                     "expected 429 Too Many Requests")
            if "retry-after" not in r.headers:
                raise AssertionError("the 429 has no Retry-After header: raise QueueFull(retry_after_s)")
        finally:
            aengine.resume()
            for t in threads:
                t.join(30)
        if sorted(results) != [200] * max_queue:
            raise AssertionError(f"after resuming, the {max_queue} admitted requests should all complete (200), "
                                 f"got {sorted(results)}")
        later = [httpx.post(url + "/v1/completions", json=body, timeout=TIMEOUT_S).status_code
                 for _ in range(max_queue + 2)]
        if later != [200] * len(later):
            raise AssertionError(f"after the queue drained, {len(later)} requests one at a time got {later}: slots "
                                 "are not given back when a request ends (a leak fills the queue for good)")
        m = read_metrics(url)
        if m["minigpt_server_requests_in_flight"] != 0 or m[REJECTED] != 1:
            raise AssertionError(f"at the end no slot should be taken and exactly 1 request rejected; /metrics: "
                                 f"{m['minigpt_server_requests_in_flight']:g} in flight, "
                                 f"{m[REJECTED]:g} rejected")


def check_admission(admitted_fn: Callable) -> None:
    """The learner's `admitted(slots, retry_after_s)`: scripted cases, then 429 + Retry-After through the server."""
    what = "Exercise 2 (admitted)"
    own_work(admitted_fn, admitted, what=what)
    with quiet(), no_calls_into(admitted, what=what):
        _check_admission_unit(admitted_fn)
        _check_admission_server(admitted_fn)
