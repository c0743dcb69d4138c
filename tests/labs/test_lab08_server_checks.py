"""Lab 08 server checks: the reference passes; the stubs and each plausible wrong implementation fail."""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager

import pytest

import inspect
import textwrap

from autograder import lab08
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.serving.admission import QueueFull, admitted
from minigpt.serving.streaming import DONE_EVENT, sse_event, sse_stream


def _no_stray_threads() -> None:
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith(("uvicorn-", "minigpt-engine"))], names


# --- piece 1: the SSE handler ------------------------------------------------------------------------

async def stub_sse(outputs, make_chunks, abort):
    raise NotImplementedError()


async def sse_no_done(outputs, make_chunks, abort):
    finished = False
    try:
        async for out in outputs:
            for chunk in make_chunks(out):
                yield sse_event(chunk)
            finished = out.finished
    finally:
        if not finished:
            abort()


async def sse_cumulative(outputs, make_chunks, abort):
    """Sends the text so far in every chunk instead of the delta."""
    import dataclasses
    finished, text = False, ""
    try:
        async for out in outputs:
            text += out.text
            for chunk in make_chunks(dataclasses.replace(out, text=text)):
                yield sse_event(chunk)
            finished = out.finished
        yield DONE_EVENT
    finally:
        if not finished:
            abort()


async def sse_drops_last(outputs, make_chunks, abort):
    """Stops at the finished output without sending it (its text and finish_reason are lost)."""
    finished = False
    try:
        async for out in outputs:
            if out.finished:
                finished = True
                break
            for chunk in make_chunks(out):
                yield sse_event(chunk)
        yield DONE_EVENT
    finally:
        if not finished:
            abort()


async def sse_no_abort(outputs, make_chunks, abort):
    async for out in outputs:
        for chunk in make_chunks(out):
            yield sse_event(chunk)
    yield DONE_EVENT


async def sse_abort_only_on_cancel(outputs, make_chunks, abort):
    """Catches CancelledError only: a generator closed by the server (GeneratorExit) leaks its request."""
    try:
        async for out in outputs:
            for chunk in make_chunks(out):
                yield sse_event(chunk)
        yield DONE_EVENT
    except asyncio.CancelledError:
        abort()
        raise


def learner_copy(fn):
    """The reference's source pasted into a notebook cell: the learner's own function object."""
    namespace = dict(inspect.unwrap(fn).__globals__)
    exec(compile(textwrap.dedent(inspect.getsource(inspect.unwrap(fn))), "<learner cell>", "exec"), namespace)
    return namespace[fn.__name__]


own_sse, own_admitted = learner_copy(sse_stream), learner_copy(admitted)


async def sse_done_after_failure(outputs, make_chunks, abort):
    """Catches the engine's failure and ends the stream cleanly: the client takes a truncated text as complete."""
    finished = False
    try:
        async for out in outputs:
            for chunk in make_chunks(out):
                yield sse_event(chunk)
            finished = out.finished
    except RuntimeError:
        pass
    finally:
        if not finished:
            abort()
    yield DONE_EVENT


async def sse_wrapper(outputs, make_chunks, abort):
    async for event in sse_stream(outputs, make_chunks, abort):
        yield event


@asynccontextmanager
async def admitted_wrapper(slots, retry_after_s):
    async with admitted(slots, retry_after_s):
        yield


@pytest.mark.parametrize("run, message", [
    (lambda: lab08.check_sse_stream(sse_stream), "this is the course's reference"),
    (lambda: lab08.check_sse_stream(sse_wrapper), r"reference \(sse_stream\)"),
    (lambda: lab08.check_admission(admitted), "this is the course's reference"),
    (lambda: lab08.check_admission(admitted_wrapper), r"reference \(admitted\)"),
], ids=["sse", "sse wrapper", "admitted", "admitted wrapper"])
def test_the_reference_handed_in_is_refused(run, message):
    with pytest.raises(ReferenceHandedIn, match=message):
        run()
    _no_stray_threads()


def test_a_failure_mid_stream_must_not_end_with_done():
    with pytest.raises(AssertionError, match="engine failed"):
        lab08.check_sse_stream(sse_done_after_failure)


def test_reference_sse_passes():
    lab08.check_sse_stream(own_sse)
    _no_stray_threads()


@pytest.mark.parametrize("wrong, words", [
    (stub_sse, "not implemented"),
    (sse_no_done, r"\[DONE\]"),
    (sse_cumulative, "delta"),
    (sse_drops_last, "LAST output"),
    (sse_no_abort, "abort"),
    (sse_abort_only_on_cancel, "abort"),
])
def test_wrong_sse_handlers_fail(wrong, words):
    with pytest.raises(AssertionError, match=words):
        lab08.check_sse_stream(wrong)
    _no_stray_threads()


def test_sse_without_abort_is_caught_by_the_server_part_alone():
    """Even if the scripted cases were skipped, the server's /metrics shows the disconnected request's blocks."""
    with pytest.raises(AssertionError, match="KV blocks used"):
        lab08._check_sse_server(sse_no_abort)
    _no_stray_threads()


# --- piece 2: admission ------------------------------------------------------------------------------

@asynccontextmanager
async def stub_admitted(slots, retry_after_s):
    raise NotImplementedError()


@asynccontextmanager
async def admit_waits(slots, retry_after_s):
    """Waits for a free slot instead of refusing."""
    while slots.in_use >= slots.capacity:
        await asyncio.sleep(0.01)
    slots.in_use += 1
    try:
        yield
    finally:
        slots.in_use -= 1


@asynccontextmanager
async def admit_leaks(slots, retry_after_s):
    """Never gives the slot back."""
    if slots.in_use >= slots.capacity:
        raise QueueFull(retry_after_s)
    slots.in_use += 1
    yield


@asynccontextmanager
async def admit_leaks_on_error(slots, retry_after_s):
    """Gives the slot back only when the request succeeds."""
    if slots.in_use >= slots.capacity:
        raise QueueFull(retry_after_s)
    slots.in_use += 1
    yield
    slots.in_use -= 1


@asynccontextmanager
async def admit_frees_on_exception_only(slots, retry_after_s):
    """Gives the slot back on success and on an Exception, but a cancelled request (CancelledError is a
    BaseException) keeps it forever."""
    if slots.in_use >= slots.capacity:
        raise QueueFull(retry_after_s)
    slots.in_use += 1
    try:
        yield
    except Exception:
        slots.in_use -= 1
        raise
    slots.in_use -= 1


@asynccontextmanager
async def admit_no_retry_after(slots, retry_after_s):
    if slots.in_use >= slots.capacity:
        raise QueueFull()
    slots.in_use += 1
    try:
        yield
    finally:
        slots.in_use -= 1


@asynccontextmanager
async def admit_one_past(slots, retry_after_s):
    """Off by one: refuses only when in_use > capacity."""
    if slots.in_use > slots.capacity:
        raise QueueFull(retry_after_s)
    slots.in_use += 1
    try:
        yield
    finally:
        slots.in_use -= 1


def test_reference_admission_passes():
    lab08.check_admission(own_admitted)
    _no_stray_threads()


@pytest.mark.parametrize("wrong, words", [
    (stub_admitted, "not implemented"),
    (admit_waits, "WAITED"),
    (admit_leaks, "still taken"),
    (admit_leaks_on_error, "exception kept its slot"),
    (admit_frees_on_exception_only, "cancelled request"),
    (admit_no_retry_after, "retry_after"),
    (admit_one_past, "past the capacity"),
])
def test_wrong_admissions_fail(wrong, words):
    with pytest.raises(AssertionError, match=words):
        lab08.check_admission(wrong)
    _no_stray_threads()


@pytest.mark.parametrize("wrong, words", [
    (admit_leaks, "not given back"),
    (admit_no_retry_after, "Retry-After"),
    (admit_one_past, "past the capacity"),
])
def test_wrong_admissions_are_caught_by_the_server_part_alone(wrong, words):
    with pytest.raises(AssertionError, match=words):
        lab08._check_admission_server(wrong)
    _no_stray_threads()


class ClassAdmission:
    """A correct admission written as a class (an async context manager object): accepted."""

    def __init__(self, slots, retry_after_s):
        self.slots, self.retry_after_s = slots, retry_after_s

    async def __aenter__(self):
        if self.slots.in_use >= self.slots.capacity:
            raise QueueFull(self.retry_after_s)
        self.slots.in_use += 1

    async def __aexit__(self, *exc):
        self.slots.in_use -= 1


def test_a_class_based_admission_passes():
    lab08.check_admission(ClassAdmission)


def test_a_coroutine_without_yield_is_told_to_yield():
    async def no_yield(outputs, make_chunks, abort):
        return None
    with pytest.raises(AssertionError, match="with `yield`"):
        lab08.check_sse_stream(no_yield)


def test_checks_run_inside_a_running_event_loop():
    """In a Jupyter kernel an event loop already runs in the main thread: the checks must not call asyncio.run there."""
    async def from_a_notebook_cell() -> None:
        lab08.check_sse_stream(own_sse)
        lab08.check_admission(own_admitted)

    asyncio.run(from_a_notebook_cell())
