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
                                     check_server, observe_where)
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.serving.admission import AdmissionSlots, QueueFull, admitted
from minigpt.serving.aio import run_sync
from minigpt.serving.replicas import read_metrics


# ---------------------------------------------------------------------------------------------------
# Piece 2: admission and backpressure
# ---------------------------------------------------------------------------------------------------

def _plain_value(x: object) -> object:
    return x if x is None or isinstance(x, (bool, int, float, str)) else repr(x)


def _admission_unit_observations(fn: Callable) -> dict:
    """The learner's `admitted` on two slots: how each of three requests fared (admitted, waited, refused with which
    retry_after) and the slots in use after they ended and after a failing request (data only; stops at the first
    outcome that settles the verdict)."""
    _stub_guard("admitted", fn, "an async context manager", AdmissionSlots(1), 1.0)

    async def scenario() -> dict:
        seen: dict = {}
        slots = AdmissionSlots(2)
        stack = AsyncExitStack()
        for i in range(2):
            try:
                await asyncio.wait_for(stack.enter_async_context(fn(slots, 0.5)), 1.0)
            except QueueFull:
                seen["first_two"] = ("refused", i)
                return seen
            except asyncio.TimeoutError:
                seen["first_two"] = ("waited", i)
                return seen
        try:
            await asyncio.wait_for(stack.enter_async_context(fn(slots, 0.5)), 1.0)
            await stack.aclose()
            seen["third"] = ("admitted", None)
            return seen
        except asyncio.TimeoutError:
            await stack.aclose()
            seen["third"] = ("waited", None)
            return seen
        except QueueFull as err:
            seen["third"] = ("refused", _plain_value(getattr(err, "retry_after", None)))
            if getattr(err, "retry_after", None) != 0.5:
                await stack.aclose()
                return seen
        await stack.aclose()
        seen["in_use_after"] = slots.in_use
        if slots.in_use != 0:
            return seen
        try:
            async with fn(slots, 0.5):
                raise KeyError("boom")
        except KeyError:
            pass
        seen["in_use_after_error"] = slots.in_use
        if slots.in_use != 0:
            return seen
        try:                        # a client that goes away: its task is cancelled (a BaseException, not Exception)
            async with fn(slots, 0.5):
                raise asyncio.CancelledError()
        except asyncio.CancelledError:
            pass
        seen["in_use_after_cancel"] = slots.in_use
        return seen
    return call_learner("admitted", run_sync, scenario(), passthrough=(QueueFull,))


def _check_admission_unit(fn: Callable) -> None:
    seen = observe_where(fn, _admission_unit_observations, fn, watch=(admitted,), what="Exercise 2 (admitted)")
    if "first_two" in seen:
        how, i = seen["first_two"]
        if how == "refused":
            raise AssertionError(f"request {i + 1} was refused although only {i} of 2 slots were taken")
        raise AssertionError(f"request {i + 1} waited although {2 - i} of 2 slots were free")
    how, retry_after = seen["third"]
    if how == "admitted":
        raise AssertionError("with 2 of 2 slots taken a third request was admitted: never admit past the capacity "
                             "(refuse when in_use >= capacity)")
    if how == "waited":
        raise AssertionError("with every slot taken, the third request WAITED for a free slot instead of being refused "
                             "at once: raise QueueFull(retry_after_s) so the server answers 429 (a waiting request piles "
                             "up latency and connections)")
    if retry_after != 0.5:
        raise AssertionError(f"QueueFull should carry retry_after=0.5 (the retry_after_s given), got {retry_after!r}: "
                             "it becomes the 429's Retry-After header")
    if seen["in_use_after"] != 0:
        raise AssertionError(f"after both requests ended, {seen['in_use_after']} slot(s) are still taken: give the "
                             "slot back on exit")
    if seen["in_use_after_error"] != 0:
        raise AssertionError("a request that failed with an exception kept its slot: give it back in a `finally` "
                             "(a few errors would otherwise fill the queue forever)")
    if seen["in_use_after_cancel"] != 0:
        raise AssertionError("a cancelled request (its client went away: asyncio.CancelledError, a BaseException, not "
                             "an Exception) kept its slot: give it back in a `finally`, which runs for both")


def _post_or_error(url: str, body: dict) -> httpx.Response | Exception:
    try:
        return httpx.post(url + "/v1/completions", json=body, timeout=30)
    except httpx.HTTPError as err:
        return err


def _admission_server_observations(fn: Callable) -> dict:
    """The reference server with the learner's admission, engine paused and max_queue requests waiting: how many held
    a slot, what one more request got (and the most in flight while it waited), the statuses after resuming, and
    /metrics at the end (data only)."""
    max_queue = 3
    seen: dict = {"max_queue": max_queue}
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    with check_server(admission=fn, max_queue=max_queue) as (url, aengine):
        aengine.pause()
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(
            httpx.post(url + "/v1/completions", json=body, timeout=30).status_code)) for _ in range(max_queue)]
        try:
            for t in threads:
                t.start()
            seen["all_held"] = _wait_for(
                lambda: read_metrics(url)["minigpt_server_requests_in_flight"] == max_queue, 5.0)
            seen["held"] = read_metrics(url)["minigpt_server_requests_in_flight"]
            if not seen["all_held"]:
                return seen
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
                    break
                time.sleep(0.02)
            seen["most_in_flight"] = held
            if held > max_queue or not extra:
                return seen
            r = extra[0]
            seen["extra"] = (f"{type(r).__name__}: {r}" if isinstance(r, Exception) else
                             {"status": r.status_code, "retry_after": "retry-after" in r.headers})
        finally:
            aengine.resume()
            for t in threads:
                t.join(30)
        seen["admitted_statuses"] = sorted(results)
        seen["later_statuses"] = [httpx.post(url + "/v1/completions", json=body, timeout=TIMEOUT_S).status_code
                                  for _ in range(max_queue + 2)]
        m = read_metrics(url)
        seen["in_flight_at_end"], seen["rejected"] = m["minigpt_server_requests_in_flight"], m[REJECTED]
    return seen


def _check_admission_server(fn: Callable) -> None:
    seen = observe_where(fn, _admission_server_observations, fn, watch=(admitted,), what="Exercise 2 (admitted)")
    max_queue = seen["max_queue"]
    if not seen["all_held"]:
        raise AssertionError(f"{max_queue} requests were sent to a server with max_queue={max_queue} (engine "
                             f"paused), but only {seen['held']:g} hold a slot")
    if seen["most_in_flight"] > max_queue:
        raise AssertionError(f"with the queue full ({max_queue} of {max_queue}) one more request was admitted "
                             f"({seen['most_in_flight']:g} in flight, expected 429): never admit past the capacity")
    if "extra" not in seen:
        raise AssertionError(f"with the queue full ({max_queue} of {max_queue}), a request got no answer "
                             f"within {REFUSAL_TIMEOUT_S} s: the admission waits instead of refusing with 429")
    r = seen["extra"]
    if isinstance(r, str):
        raise AssertionError(f"with the queue full, a request failed: {r}")
    if r["status"] != 429:
        raise AssertionError(f"with the queue full ({max_queue} of {max_queue}) a request got {r['status']}, "
                             "expected 429 Too Many Requests")
    if not r["retry_after"]:
        raise AssertionError("the 429 has no Retry-After header: raise QueueFull(retry_after_s)")
    if seen["admitted_statuses"] != [200] * max_queue:
        raise AssertionError(f"after resuming, the {max_queue} admitted requests should all complete (200), "
                             f"got {seen['admitted_statuses']}")
    later = seen["later_statuses"]
    if later != [200] * len(later):
        raise AssertionError(f"after the queue drained, {len(later)} requests one at a time got {later}: slots "
                             "are not given back when a request ends (a leak fills the queue for good)")
    if seen["in_flight_at_end"] != 0 or seen["rejected"] != 1:
        raise AssertionError(f"at the end no slot should be taken and exactly 1 request rejected; /metrics: "
                             f"{seen['in_flight_at_end']:g} in flight, {seen['rejected']:g} rejected")


def check_admission(admitted_fn: Callable) -> None:
    """The learner's `admitted(slots, retry_after_s)`: scripted cases, then 429 + Retry-After through the server."""
    what = "Exercise 2 (admitted)"
    own_work(admitted_fn, admitted, what=what)
    with quiet(), no_calls_into(admitted, what=what):
        _check_admission_unit(admitted_fn)
        _check_admission_server(admitted_fn)
