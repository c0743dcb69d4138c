"""Checks for Lab 08: a serving engine behind an OpenAI-compatible server, load-tested.

Each check runs the learner's function on small scripted cases, then (where the piece lives in a server) inside the
reference server: an in-thread uvicorn server on a free loopback port (`minigpt.serving.launch.serve_in_thread`) over
a tiny seeded random model, driven with the official `openai` client and raw HTTP (httpx), and stopped (thread
joined) at the end. Checks that run coroutines work from plain Python and from a Jupyter kernel (whose event loop is
already running) alike.

Server (exercises 1 and 2):
    check_sse_stream(sse_stream)   events are `data: <json>\n\n`, one per chunk, then `data: [DONE]\n\n`; the
                                   request is aborted if the stream stops early (consumer closed or task cancelled);
                                   through the server: the openai client's streamed completions and chats concatenate
                                   to the non-streamed text (greedy), the raw stream ends with [DONE], and a client
                                   that disconnects mid-stream frees every KV block (read from /metrics)
    check_admission(admitted)      refuses at once with QueueFull(retry_after) when every slot is taken, never admits
                                   past the capacity, gives the slot back on exit (also on error); through the server:
                                   with the engine paused and the queue full the next request gets 429 + Retry-After
                                   quickly, and after resuming everything admitted completes and slots are released
Load testing and routing (exercises 3 and 5; no model):
    check_goodput(goodput_fn)        goodput_fn(records, ttft_limit, tpot_limit) -> requests/s meeting BOTH limits
                                     over the benchmark's duration (max end - min send, all records); failed never count
    check_route(route_fn)            route_fn(prompt_token_ids, replicas, *, block_size, prefix_blocks) -> replica:
                                     prefix affinity, every token of the first blocks matters, short prompts,
                                     spread, consistent hashing (removing / adding a replica moves only its keys),
                                     independent of the replica list's order
    check_router(route_fn)           the learner's function inside the router (minigpt.serving.router) in front of
                                     two fake replicas on loopback: who served each request of a shared-prefix mix
Multi-LoRA (exercise 4):
    check_lora_delta(lora_delta_fn)    the batched LoRA matmul on mixed batches equals MERGING each row's adapter
                                       into the weight (W + s B_a A_a) and running the row alone; -1 = no adapter;
                                       inputs untouched; no Python loop over rows (torch calls do not grow with N)
    check_lora_engine(lora_delta_fn)   the learner's function inside the engine: one packed step serves requests of
                                       different adapters; each greedy output equals generating with its adapter merged
    check_lora_server(lora_delta_fn)   the same behind the OpenAI-compatible server: the `model` field names the
                                       adapter (openai client, concurrent requests); an unknown adapter gets 404
                                       (model_not_found, as OpenAI answers)
Interview questions:
    the gateway: check_q_gateway_replicas (replicas = ceil(rate / (goodput per replica * utilization))),
                 check_q_affinity_pays (which workloads of AFFINITY_SCENARIOS prefix-aware routing helps)
    100 LoRA adapters: check_q1_adapter_mib, check_q2_hundred_adapters_share, check_q3_lora_step_overhead (from the
                 lab's own measurement, minigpt.serving.lora_bench)
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import random
import threading
import time
from collections import Counter
from contextlib import AsyncExitStack, contextmanager
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

import httpx
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from autograder.harness import call_learner, check_answer, quiet
from autograder.reference_guard import no_calls_into, own_work
from autograder.lab03 import NEAR_TIE, SMALL_CONFIG
from autograder.lab03 import _model as lab03_model
from minigpt.cache.paged import PagedKVCache
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.request import Request
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import serve
from minigpt.model import GPT
from minigpt.serving.admission import AdmissionSlots, QueueFull, admitted
from minigpt.serving.aio import run_sync
from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.client_metrics import RequestRecord, request_goodput
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.lora import LoRAAdapters, lora_delta, merge_adapter, with_lora
from minigpt.serving.lora_bench import adapter_bytes
from minigpt.serving.lora_runner import LoRAModelRunner
from minigpt.serving.outputs import RequestOutput
from minigpt.serving.replicas import read_metrics
from minigpt.serving.routing import HashRing, prefix_key
from minigpt.serving.routing import route as reference_route
from minigpt.serving.streaming import sse_stream
from minigpt.teaching.calculators import PRESETS, weight_bytes
from minigpt.timing import fixed_threads

__all__ = ["check_sse_stream", "check_admission", "CHECK_CONFIG", "check_server", "read_metrics",
           "check_goodput", "check_route", "check_router", "goodput_cases", "check_q_gateway_replicas",
           "check_q_affinity_pays", "AFFINITY_SCENARIOS",
           "check_lora_delta", "check_lora_engine", "check_lora_server", "served_lora_model", "check_q1_adapter_mib",
           "check_q2_hundred_adapters_share", "check_q3_lora_step_overhead", "SMALL_CONFIG", "small_model",
           "count_torch_calls", "Q_PRESET", "Q_RANK"]

# A tiny random model over the course vocabulary (text prompts work); weights scaled x6 so that greedy text varies.
CHECK_CONFIG = ModelConfig(vocab_size=4096, max_seq_len=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)
MODEL_NAME = "minigpt-check"
TIMEOUT_S = 10.0            # generous: the machine may be busy; a correct server answers in well under a second
REFUSAL_TIMEOUT_S = 2.0     # a full queue must answer 429 within this (an admission that waits never does)
DISCONNECT_WAIT_S = 3.0     # a disconnected client's blocks must be free within this
ABORTED = 'minigpt_requests_total{outcome="abort"}'
REJECTED = 'minigpt_requests_total{outcome="rejected"}'


def _model(seed: int = 0) -> GPT:
    return lab03_model(seed, CHECK_CONFIG)


@contextmanager
def check_server(*, stream_handler: Callable = sse_stream, admission: Callable = admitted,
                 max_queue: int = 8) -> Iterator[tuple[str, AsyncLLMEngine]]:
    """The reference server with the given pieces, in a thread on a free loopback port; yields (base URL, engine)."""
    from minigpt.tokenizer import load_tokenizer
    engine = LLMEngine(_model(), EngineConfig(num_blocks=64, block_size=8, max_num_seqs=8, max_num_batched_tokens=64),
                       tokenizer=load_tokenizer(), model_name=MODEL_NAME)
    aengine = AsyncLLMEngine(engine, num_threads=1)
    app = create_app(aengine, max_queue=max_queue, retry_after_s=2.0, stream_handler=stream_handler, admission=admission)
    try:
        with serve_in_thread(app) as url:
            yield url, aengine
    finally:
        aengine.shutdown()


def _wait_for(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _stub_guard(what: str, fn: Callable, kind: str, *args: Any) -> None:
    """The released stub (`raise NotImplementedError()` in an `async def` without `yield`) is a coroutine function,
    not an async generator: report 'not implemented yet', or for any other such function that it needs `yield`.
    Anything else (an async generator function, a class, a function returning an async iterator) goes on."""
    if not callable(fn):
        raise AssertionError(f"{what}: expected your function, got {fn!r}")
    raw = inspect.unwrap(fn)
    if inspect.iscoroutinefunction(raw) and not inspect.isasyncgenfunction(raw):
        call_learner(what, lambda: run_sync(raw(*args)))
        raise AssertionError(f"{what} must be {kind}: an `async def` with `yield` in it, got a plain coroutine")


# ---------------------------------------------------------------------------------------------------
# Piece 1: the SSE streaming handler
# ---------------------------------------------------------------------------------------------------

def _outputs(texts: list[str]) -> list[RequestOutput]:
    n = len(texts)
    return [RequestOutput("r", [10 + i], t, i == n - 1, "length" if i == n - 1 else None, 3, i + 1)
            for i, t in enumerate(texts)]


def _chunk(out: RequestOutput) -> list[dict]:
    return [{"text": out.text, "finish_reason": out.finish_reason}]


async def _scripted(outs: list[RequestOutput], then_wait: asyncio.Event | None = None) -> AsyncIterator[RequestOutput]:
    for out in outs:
        yield out
    if then_wait is not None:
        await then_wait.wait()            # a request still generating: the next output is not there yet


def _parse_events(events: list[Any], what: str) -> list[Any]:
    parsed = []
    for i, e in enumerate(events):
        if not isinstance(e, str) or not e.startswith("data: ") or not e.endswith("\n\n"):
            raise AssertionError(f"{what}: event {i} is {e!r}; every server-sent event is the string "
                                 "'data: <payload>\\n\\n' (the blank line ends the event)")
        payload = e[len("data: "):-2]
        parsed.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
    return parsed


def _check_sse_unit(fn: Callable) -> None:
    _stub_guard("sse_stream", fn, "an async generator", _scripted([]), _chunk, lambda: None)
    texts = ["Hello", ", wor", "ld!"]

    # 1. A whole stream: one event per chunk, in order, then [DONE]; no abort.
    aborts: list[int] = []

    async def whole() -> list[str]:
        return [e async for e in fn(_scripted(_outputs(texts)), _chunk, lambda: aborts.append(1))]
    events = call_learner("sse_stream (a 3-output stream)", run_sync, whole())
    got = _parse_events(list(events), "a 3-output stream")
    want = [c for out in _outputs(texts) for c in _chunk(out)] + ["[DONE]"]
    if not got or got[-1] != "[DONE]":
        raise AssertionError(f"a 3-output stream: the last event must be 'data: [DONE]\\n\\n', got {events[-1:]!r}. "
                             "OpenAI clients stop reading only at [DONE].")
    if got != want:
        hint = ""
        if len(got) < len(want):
            hint = " An output is missing: is the LAST output (finished=True, with the last text and the " \
                   "finish_reason) sent before [DONE]?"
        elif any(isinstance(g, dict) and g.get("text", "").startswith("Hello,") for g in got):
            hint = " Each chunk carries only the NEW text of its output (a delta), not the text so far."
        raise AssertionError(f"a 3-output stream: events should carry {want}, got {got}.{hint}")
    if aborts:
        raise AssertionError("a stream that reached its finished output must not abort the request (it is done)")

    # 2. The consumer stops after the first event (the server closes the generator when the client goes away).
    aborts.clear()

    async def closed_early() -> None:
        gate = asyncio.Event()
        agen = fn(_scripted(_outputs(texts)[:2], gate), _chunk, lambda: aborts.append(1))
        await agen.__anext__()
        await agen.aclose()
    call_learner("sse_stream (consumer closes it after one event)", run_sync, closed_early())
    if aborts != [1]:
        raise AssertionError(f"the client went away after the first event (the generator was closed): the request "
                             f"must be aborted exactly once, got {len(aborts)} abort call(s). Put the abort in a "
                             "`finally:` that runs when the stream did not reach its finished output.")

    # 3. The task is cancelled while it waits for the next output (how Starlette reacts to a disconnect).
    aborts.clear()

    async def cancelled() -> None:
        gate = asyncio.Event()

        async def consume() -> None:
            async for _ in fn(_scripted(_outputs(texts)[:1], gate), _chunk, lambda: aborts.append(1)):
                pass
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    call_learner("sse_stream (task cancelled mid-stream)", run_sync, cancelled())
    if aborts != [1]:
        raise AssertionError(f"the streaming task was cancelled while waiting for the next output (the client "
                             f"disconnected): the request must be aborted exactly once, got {len(aborts)} call(s). "
                             "A `try/finally` around the loop catches cancellation too.")

    # 4. The engine fails in the middle of the stream: the client must not see a clean end.
    aborts.clear()

    async def failing_outputs() -> AsyncIterator[RequestOutput]:
        yield _outputs(texts)[0]
        raise RuntimeError("the engine failed mid-stream")

    async def broken() -> tuple[list[str], BaseException | None]:
        events: list[str] = []
        try:
            async for e in fn(failing_outputs(), _chunk, lambda: aborts.append(1)):
                events.append(e)
        except Exception as err:                  # what the server sees: the response ends without [DONE]
            return events, err
        return events, None
    events, error = call_learner("sse_stream (the engine fails mid-stream)", run_sync, broken())
    if error is None and events and events[-1] == "data: [DONE]\n\n":
        raise AssertionError("the outputs iterator raised after the first output (the engine failed), and your stream "
                             "still ended with 'data: [DONE]\\n\\n': the client takes a truncated text for a complete "
                             "one. Let the error propagate (do not catch it), so the response ends without [DONE] and "
                             "the client sees the failure.")
    if aborts != [1]:
        raise AssertionError(f"the engine failed mid-stream: the request must be aborted exactly once (its blocks "
                             f"freed), got {len(aborts)} abort call(s); the `finally` covers errors too.")


def _check_sse_server(fn: Callable) -> None:
    import openai
    with check_server(stream_handler=fn) as (url, aengine):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)
        prompt, msgs = "Once upon a time", [{"role": "user", "content": "Write a haiku about caches."}]
        full = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0)
        try:
            chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0,
                                                    stream=True))
        except Exception as err:
            raise AssertionError(f"streaming a completion through the server with your handler failed: "
                                 f"{type(err).__name__}: {err}") from None
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        if text != full.choices[0].text:
            raise AssertionError(f"streamed completion chunks concatenate to {text!r}, but the same request without "
                                 f"streaming gives {full.choices[0].text!r}")
        chat = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=24, temperature=0)
        try:
            parts = list(client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=24, temperature=0,
                                                        stream=True))
        except Exception as err:
            raise AssertionError(f"streaming a chat completion through the server with your handler failed: "
                                 f"{type(err).__name__}: {err}") from None
        text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        if text != chat.choices[0].message.content:
            raise AssertionError(f"streamed chat chunks concatenate to {text!r}, but the same chat without streaming "
                                 f"gives {chat.choices[0].message.content!r}")

        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=TIMEOUT_S) as r:
            lines = [line for line in r.iter_lines() if line.strip()]
        if not lines or lines[-1] != "data: [DONE]":
            raise AssertionError(f"the raw stream must end with 'data: [DONE]', its last lines are {lines[-2:]!r}")

        # A client that disconnects mid-stream. The engine pauses after a few steps, so the request is still
        # running (holding KV blocks) when the client leaves: only the handler's abort can free them.
        before = read_metrics(url)
        aborted_before = before.get(ABORTED, 0.0)
        aengine.pause(after_steps=10)
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 100, "temperature": 0, "stream": True}
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=TIMEOUT_S) as r:
                events = 0
                for line in r.iter_lines():
                    events += line.startswith("data: ")
                    if events == 2:
                        break                      # leaving the block closes the connection
            freed = _wait_for(lambda: (m := read_metrics(url))["minigpt_kv_blocks_used"] == 0
                              and m["minigpt_requests_running"] == 0, DISCONNECT_WAIT_S)
            m = read_metrics(url)
            if not freed:
                raise AssertionError(
                    f"a client disconnected after 2 events of a 100-token stream; {DISCONNECT_WAIT_S:g} s later /metrics still shows "
                    f"{m['minigpt_kv_blocks_used']:g} KV blocks used and {m['minigpt_requests_running']:g} request(s) "
                    "running. The handler must abort the request when the stream stops before its finished output "
                    "(try/finally), so that its blocks are freed at once.")
            if m.get(ABORTED, 0.0) != aborted_before + 1:
                raise AssertionError("after the disconnect exactly one request should have been aborted, /metrics says "
                                     f"{m.get(ABORTED, 0.0) - aborted_before:g}")
        finally:
            aengine.resume()


def check_sse_stream(sse_stream_fn: Callable) -> None:
    """The learner's `sse_stream(outputs, make_chunks, abort)`: scripted cases, then the server with the openai client."""
    what = "Exercise 1 (sse_stream)"
    own_work(sse_stream_fn, sse_stream, what=what)
    with quiet(), no_calls_into(sse_stream, what=what):
        _check_sse_unit(sse_stream_fn)
        _check_sse_server(sse_stream_fn)


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


REPLICAS4 = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003", "http://127.0.0.1:8004"]


# ---------------------------------------------------------------------------------------------------
# Goodput
# ---------------------------------------------------------------------------------------------------

def _record(i: int, send: float, first: float, tpot: float, n: int, end: float, *, status: int = 200,
            error: str | None = None) -> RequestRecord:
    return RequestRecord(i, send, end, [first + k * tpot for k in range(n)], n, 8, status=status, error=error)


def goodput_cases() -> dict[str, tuple[list[RequestRecord], float, float]]:
    """Named (records, ttft_limit, tpot_limit) cases. Limits 0.5 s TTFT and 0.25 s/token TPOT; times are exact
    binary fractions, so a request exactly AT a limit meets it."""
    mixed = [
        _record(0, 1.0, 1.25, 0.125, 5, 1.875),          # good
        _record(1, 0.5, 1.75, 0.125, 5, 2.5),            # TTFT 1.25: misses TTFT only
        _record(2, 2.0, 2.25, 0.75, 4, 4.5),             # TPOT 0.75: misses TPOT only
        _record(3, 0.0, 0.5, 0.25, 3, 1.0),              # exactly at both limits: good
        _record(4, 3.0, 3.125, 0.0, 1, 3.25),            # one token (TPOT 0): good
        _record(5, 3.5, 3.5, 0.0, 0, 3.5, status=429, error="HTTP 429: queue full"),     # rejected, no chunks
        _record(6, 4.0, 4.125, 0.125, 4, 8.0, error="the stream ended without data: [DONE]"),  # broken stream
        _record(7, 2.5, 3.5, 0.5, 3, 5.0),               # misses both
        _record(8, 1.5, 1.75, 0.5, 3, 3.0),              # TPOT 0.5: misses TPOT only
        _record(9, 4.5, 4.625, 1.0, 3, 6.75),            # TPOT 1.0: misses TPOT only
        _record(10, 5.0, 5.25, 0.125, 6, 7.0, error="cancelled: the benchmark's max_duration ran out"),
    ]
    all_good = [_record(i, 0.25 * i, 0.25 * i + 0.25, 0.125, 3, 0.25 * i + 0.75) for i in range(4)]
    return {"a mixed benchmark (11 requests: some slow to start, some slow per token, a 429, a broken and a "
            "cancelled stream)":
            (mixed, 0.5, 0.25),
            "four fast requests": (all_good, 0.5, 0.25),
            "no requests at all": ([], 0.5, 0.25)}


def _goodput_mistakes(records: list[RequestRecord], ttft: float, tpot: float) -> list[tuple[float, str]]:
    """Answers the usual mistakes give on these records, with their diagnosis."""
    if not records:
        return []
    ok = [r for r in records if r.ok]
    span = max(r.end_time for r in records) - min(r.send_time for r in records)
    good = [r for r in ok if r.ttft <= ttft and r.tpot <= tpot]
    strict = [r for r in ok if r.ttft < ttft and r.tpot < tpot]
    counted_failed = [r for r in records if r.chunk_times and r.ttft <= ttft and r.tpot <= tpot]
    spans = {"the span of the ok requests only": max(r.end_time for r in ok) - min(r.send_time for r in ok),
             "the span of the good requests only": max(r.end_time for r in good) - min(r.send_time for r in good)
             if good else span,
             "the sum of the requests' latencies (they overlap in time)": sum(r.e2e for r in records),
             "the time to the last FIRST token": max(r.chunk_times[0] for r in ok) - min(r.send_time for r in records)}
    out = [(sum(r.ttft <= ttft for r in ok) / span, "a request that met only the TTFT limit counted; it must "
            "meet BOTH limits (TTFT <= ttft_limit AND TPOT <= tpot_limit)"),
           (sum(r.tpot <= tpot for r in ok) / span, "a request that met only the TPOT limit counted; it must "
            "meet BOTH limits"),
           (sum(r.ttft <= ttft or r.tpot <= tpot for r in ok) / span, "`or` instead of `and`: both limits must "
            "hold"),
           (len(counted_failed) / span, "failed requests (a 429, a broken stream) counted; only ok ones can be good"),
           (len(strict) / span, "a request exactly AT a limit must count (<=, not <)"),
           (len(good) / len(records), "that is the SHARE of good requests (lab 03); goodput here is a rate: "
            "good requests per second of benchmark"),
           (len(good), "that is a count; divide by the benchmark's duration in seconds")]
    out += [(len(good) / d, f"divided by {what}; the duration is max(end_time) - min(send_time) over ALL records")
            for what, d in spans.items() if d > 0]
    return [(v, m) for v, m in out if abs(v - len(good) / span) > 1e-9]


def check_goodput(goodput_fn: Callable[[Sequence[RequestRecord], float, float], float]) -> None:
    """goodput_fn(records, ttft_limit, tpot_limit) equals the reference (requests/s) on hand-made benchmarks."""
    what = "Exercise 3 (request_goodput)"
    own_work(goodput_fn, request_goodput, what=what)
    goodput_fn = _watched(goodput_fn, (request_goodput,), what)
    for what, (records, ttft, tpot) in goodput_cases().items():
        expected = request_goodput(records, ttft, tpot)
        shuffled = list(records)
        random.Random(0).shuffle(shuffled)
        got = call_learner(f"goodput ({what})", goodput_fn, shuffled, ttft, tpot,
                           context="a failed request (record.ok is False: a 429, a broken or cancelled stream) may "
                                   "have no chunk_times, so no TTFT: skip failed records before looking at latencies; no "
                                   "records at all give 0.0")
        check_answer(got, expected, f"goodput of {what}, ttft_limit={ttft} s, tpot_limit={tpot} s",
                     _goodput_mistakes(records, ttft, tpot), unit="requests/s", rel=1e-6, reveal=True,
                     hint="Count the ok requests with TTFT <= ttft_limit AND TPOT <= tpot_limit, and divide by "
                          "max(end_time) - min(send_time) over all records (0.0 when there are none).")


# ---------------------------------------------------------------------------------------------------
# The routing function
# ---------------------------------------------------------------------------------------------------

def _watched(fn: Callable, references: tuple, what: str) -> Callable:
    """fn, refusing (ReferenceHandedIn) a call that enters the reference's code while fn runs (the check's own calls
    of the reference, between the learner's calls, are not watched)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        with no_calls_into(*references, what=what):
            return fn(*args, **kwargs)
    return call


ROUTE_REFERENCES = (reference_route, prefix_key, HashRing)


@contextmanager
def _another_hash_seed() -> Iterator[None]:
    """builtins.hash salted differently, as in a process started with another PYTHONHASHSEED (str and bytes hashes
    change between processes; a router restarted with a different salt would send every prefix elsewhere)."""
    import builtins
    original = builtins.hash
    builtins.hash = lambda obj: original(("another process", obj))
    try:
        yield
    finally:
        builtins.hash = original


def _by_position_diagnosis(route_fn: Callable, prompts: list[list[int]], before: list[str]) -> str:
    """Why keys moved: replicas placed by their position in the list (a ring of f'{i}#{v}' points) or a modulo."""
    renamed = [f"http://10.9.9.{i}:7000" for i in range(1, 5)]
    by_index = [REPLICAS4.index(b) for b in before] == [renamed.index(_call_route(route_fn, p, renamed))
                                                         for p in prompts]
    if by_index:
        grown = renamed + ["http://10.9.9.5:7000"]
        moved = [_call_route(route_fn, p, grown) for p in prompts]
        if all(m in (renamed[REPLICAS4.index(b)], grown[-1]) for m, b in zip(moved, before)):
            return ("The replicas' names do not matter to your routing, only their positions in the list: the ring's "
                    "points are named by the replica's INDEX (f'{i}#{v}'), so removing one renames the points of every "
                    "replica after it. Name the points by the replica itself: ring_hash(f'{replica}#{v}').")
    return ("hash % len(replicas) remaps about 3/4 of all keys when the count changes. Use a hash ring: sorted "
            "points named by each replica (ring_hash(f'{replica}#{v}')), the first point at or after the key, "
            "wrapping around.")


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(4096) for _ in range(n)]


def _call_route(route_fn: Callable, prompt: list[int], replicas: list[str], block_size: int = 16,
                prefix_blocks: int = 4, what: str = "") -> str:
    got = call_learner(f"route{what}", route_fn, list(prompt), list(replicas), block_size=block_size,
                       prefix_blocks=prefix_blocks, context=f"a {len(prompt)}-token prompt, {len(replicas)} replicas")
    if got not in replicas:
        raise AssertionError(f"route must return one of the replicas it was given ({replicas}), got {got!r}")
    return got


def check_route(route_fn: Callable[..., Any]) -> None:
    """Prefix-aware consistent-hashing routing on token lists (no server)."""
    what = "Exercise 5 (route)"
    own_work(route_fn, ROUTE_REFERENCES, what=what)
    _check_route(_watched(route_fn, ROUTE_REFERENCES, what))


def _check_route(route_fn: Callable[..., Any]) -> None:
    rng = random.Random(0)
    two = REPLICAS4[:2]
    # 1. affinity: equal first prefix_blocks blocks -> one replica, whatever follows (longer, shorter, partial blocks)
    for block_size, prefix_blocks in ((16, 4), (8, 2)):
        window = block_size * prefix_blocks
        for _ in range(12):
            head = _prompt(rng, window)
            tails = [_prompt(rng, n) for n in (0, 1, block_size - 1, block_size, 3 * block_size + 5)]
            served = {_call_route(route_fn, head + t, REPLICAS4, block_size, prefix_blocks) for t in tails}
            if len(served) > 1:
                raise AssertionError(
                    f"prompts sharing their first {prefix_blocks} blocks of {block_size} tokens went to "
                    f"{len(served)} different replicas: the routing key must depend only on those first "
                    f"{window} tokens (not the whole prompt), so their KV blocks are reused on one replica")
    # 2. spread: distinct prefixes cover the replicas about evenly
    for replicas in (two, REPLICAS4):
        load = Counter(_call_route(route_fn, _prompt(rng, 70), replicas) for _ in range(400))
        fair = 400 / len(replicas)
        if min(load.get(r, 0) for r in replicas) < 0.5 * fair:
            raise AssertionError(
                f"400 different prefixes over {len(replicas)} replicas gave loads {[load.get(r, 0) for r in replicas]}"
                f" (fair share {fair:.0f}): some replica gets less than half its share. Use many virtual nodes per "
                "replica on the ring (e.g. 64), hashed from the replica's NAME")
    # 3. every token of the routing window matters: prompts differing only in the window's first or last token
    for pos, name in ((0, "first"), (63, "last")):
        served = Counter()
        for t in range(200):
            p = [7] * 64 + [1] * 10
            p[pos] = t
            served[_call_route(route_fn, p, REPLICAS4)] += 1
        if len(served) < 4:
            raise AssertionError(
                f"200 prompts that differ only in the {name} token of the first 4 blocks all went to "
                f"{len(served)} replica(s): the key must hash all prefix_blocks * block_size tokens (the chained "
                "block hashes, block_hashes(tokens[:prefix_blocks * block_size], block_size))")
    # 4. short prompts: the full blocks they have; prompts shorter than a block still get a replica, always the same
    for n_full in (1, 2, 3):
        head = _prompt(rng, 16 * n_full)
        served = {_call_route(route_fn, head + _prompt(rng, k), REPLICAS4) for k in (0, 3, 9, 15)}
        if len(served) > 1:
            raise AssertionError(
                f"prompts with the same {n_full} full block(s) and different partial last blocks went to "
                f"{len(served)} replicas: a short prompt is keyed by the full blocks it has (a partial block is "
                "never in the prefix cache, so it must not decide the replica)")
    tiny = [5, 6, 7]
    if _call_route(route_fn, tiny, REPLICAS4) != _call_route(route_fn, tiny, REPLICAS4):
        raise AssertionError("the same 3-token prompt went to two replicas: routing must be deterministic")
    # 5. consistent hashing: removing / adding a replica moves only the keys of that replica
    prompts = [_prompt(rng, 70) for _ in range(300)]
    before = [_call_route(route_fn, p, REPLICAS4) for p in prompts]
    removed = REPLICAS4[1]
    rest = [r for r in REPLICAS4 if r != removed]
    after = [_call_route(route_fn, p, rest) for p in prompts]
    moved = sum(b != a and b != removed for b, a in zip(before, after))
    if moved:
        raise AssertionError(
            f"removing one of 4 replicas moved {moved} of {sum(b != removed for b in before)} prompts that were on "
            "the OTHER replicas: with consistent hashing only the removed replica's keys move. "
            + _by_position_diagnosis(route_fn, prompts, before))
    added = REPLICAS4 + ["http://127.0.0.1:8005"]
    grown = [_call_route(route_fn, p, added) for p in prompts]
    moved = sum(g != b and g != added[-1] for b, g in zip(before, grown))
    if moved:
        raise AssertionError(f"adding a fifth replica moved {moved} prompts between the OLD replicas; only keys "
                             "taken by the new replica may move")
    # 6. the same in every process: nothing may depend on Python's salted hash() of strings
    with _another_hash_seed():
        elsewhere = [_call_route(route_fn, p, REPLICAS4) for p in prompts[:100]]
    if elsewhere != before[:100]:
        changed = sum(a != b for a, b in zip(elsewhere, before))
        raise AssertionError(
            f"with Python's hash() salted as in another process (PYTHONHASHSEED), {changed} of 100 prompts went to "
            "another replica: your ring points or key use the built-in hash(), which is salted per process for "
            "strings, so a restarted router would send every prefix elsewhere (and two routers would disagree). Use a "
            "stable hash: ring_hash (SHA-256) for the points, the chained block hashes for the key")
    shuffled = [REPLICAS4[i] for i in (2, 0, 3, 1)]
    if [_call_route(route_fn, p, shuffled) for p in prompts] != before:
        raise AssertionError("the same prompts went elsewhere when the replica list was given in another order: "
                             "place replicas on the ring by their name (ring_hash(f'{replica}#{v}')), not by index")


# ---------------------------------------------------------------------------------------------------
# The routing function inside the router
# ---------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _fake_cluster(route_fn: Callable, n: int = 2) -> Iterator[tuple[str, list[str]]]:
    from minigpt.serving.fake_replica import create_fake_app
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.router import create_router_app

    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serve_in_thread(create_fake_app(f"replica-{i}"))) for i in range(n)]
        router = stack.enter_context(serve_in_thread(create_router_app(urls, policy=route_fn)))
        yield router, urls


def check_router(route_fn: Callable[..., Any], *, num_prefixes: int = 12, questions: int = 2) -> None:
    """The learner's route_fn inside the router, two fake replicas: each system prompt's requests are served by one
    replica, and both replicas serve some."""
    import httpx

    from minigpt.serving.load_generator import shared_prefix_prompts

    what = "Exercise 5 (route, inside the router)"
    own_work(route_fn, ROUTE_REFERENCES, what=what)
    route_fn = _watched(route_fn, ROUTE_REFERENCES, what)
    work = shared_prefix_prompts(num_prefixes, questions, seed=0)
    _call_route(route_fn, list(range(70)), REPLICAS4[:2])          # a clear message if it is not implemented yet
    served: dict[int, set[str]] = {}
    with quiet(), _fake_cluster(route_fn) as (router, _), httpx.Client(trust_env=False, timeout=30) as http:
        for pid, prompt in zip(work.prefix_ids, work.prompts):
            r = http.post(router + "/v1/completions", json={"model": "minigpt", "prompt": prompt, "max_tokens": 1})
            if r.status_code != 200:
                raise AssertionError(f"the router answered {r.status_code} with your route function: {r.text[:300]}")
            served.setdefault(pid, set()).add(r.json()["system_fingerprint"])
    split = [pid for pid, s in served.items() if len(s) > 1]
    if split:
        raise AssertionError(f"behind the router, the requests of {len(split)} of {num_prefixes} system prompts were "
                             "served by both replicas: no prefix affinity")
    used = set().union(*served.values())
    if len(used) < 2:
        raise AssertionError(f"all {num_prefixes} system prompts went to {used.pop()}: the other replica idles")


# ---------------------------------------------------------------------------------------------------
# Interview questions: the gateway
# ---------------------------------------------------------------------------------------------------

def check_q_gateway_replicas(answer: Any, *, request_rate: float, per_replica_goodput: float,
                             per_replica_throughput: float, utilization: float = 0.8) -> None:
    """Replicas a gateway needs for `request_rate` req/s when one replica delivers `per_replica_goodput` req/s within
    the latency objectives and is run at most at `utilization` of it: ceil(rate / (goodput * utilization))."""
    if not (request_rate > 0 and per_replica_goodput > 0 and per_replica_throughput > 0 and 0 < utilization <= 1):
        raise ValueError("request_rate, per-replica goodput and throughput must be > 0 and utilization in (0, 1]")
    expected = math.ceil(request_rate / (per_replica_goodput * utilization))
    mistakes = [(math.floor(request_rate / (per_replica_goodput * utilization)),
                 "rounded down: a fractional replica means one more replica, round UP"),
                (math.ceil(request_rate / per_replica_goodput), "no headroom: run each replica at most at "
                 f"{utilization:.0%} of its goodput, so queues stay short when traffic bursts"),
                (math.ceil(request_rate / (per_replica_throughput * utilization)), "sized on raw request throughput: "
                 "past its goodput a replica still answers, but late; size on goodput (requests meeting the SLO)"),
                (math.ceil(request_rate * utilization / per_replica_goodput), "multiplied by the utilization instead "
                 "of dividing: each replica may carry only utilization x its goodput")]
    check_answer(answer, expected, f"replicas for {request_rate:g} req/s at {per_replica_goodput:g} req/s goodput per "
                 f"replica, run at {utilization:.0%}", [(v, m) for v, m in mistakes if v != expected], unit="replicas")


AFFINITY_SCENARIOS = {
    "A": "an agent framework: every request starts with the same 2,000-token tool description and a few-shot preamble",
    "B": "a batch job summarising a million unrelated documents, each prompt different from the first token",
    "C": "multi-turn chat: each turn resends the whole conversation so far (the history is the previous turn's prompt)",
    "D": "a single popular system prompt carries 90% of the traffic and one replica cannot serve that much alone",
    "E": "short prompts (under one KV block) with long answers",
}


def check_q_affinity_pays(answer: Any) -> None:
    """The set of AFFINITY_SCENARIOS letters where prefix-aware routing (pure consistent hashing) clearly pays."""
    if isinstance(answer, str):
        answer = set(answer.replace(",", " ").split())
    if not isinstance(answer, (set, frozenset, list, tuple)) or not all(isinstance(x, str) for x in answer):
        raise AssertionError(f"answer with a set of letters from {sorted(AFFINITY_SCENARIOS)}, e.g. {{'A'}}; got {answer!r}")
    got = {x.strip().upper() for x in answer}
    unknown = got - set(AFFINITY_SCENARIOS)
    if unknown:
        raise AssertionError(f"unknown scenario(s) {sorted(unknown)}; choose from {sorted(AFFINITY_SCENARIOS)}")
    why = {"A": "A shares a long prefix across requests: affinity prefills it once per replica it lives on, "
                "round-robin once on every replica (and again after each eviction)",
           "B": "B has no shared prefix: nothing to reuse, so affinity only costs balance",
           "C": "C is the classic case: a conversation's next turn extends its last prompt, so the same replica "
                "still holds its KV blocks (route on the first blocks: the whole conversation stays together)",
           "D": "D: pure consistent hashing pins the hot prefix to ONE replica, which overloads; production routers "
                "(SGLang's cache-aware router, vLLM's production stack) fall back to the least-loaded replica past a "
                "load imbalance threshold",
           "E": "E: a prompt shorter than one block has no full block to cache; there is nothing to route on"}
    wrong = sorted(got ^ {"A", "C"})
    if wrong:
        raise AssertionError("not quite: " + " ".join(why[x] for x in wrong) if len(wrong) <= 1 else
                             f"{len(wrong)} scenarios are misjudged; think about which ones repeat a long prefix AND "
                             "keep the load spread")


Q_PRESET, Q_RANK = "Llama-3-8B", 16          # the interview questions' model and adapter rank (bf16)

# (d_in, d_out, rank, n_adapters, rows): non-square; square with r < d (B-before-A and a transposed delta fit);
# all square (r = d: every mix-up of A and B fits and must be caught by its values).
_DELTA_CASES = [(24, 40, 4, 4, 13), (32, 32, 4, 3, 9), (8, 8, 8, 4, 10)]


def count_torch_calls(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """(fn(*args), number of torch functions and Tensor methods it called): a deterministic proxy for Python loops."""
    class Counter(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):     # type: ignore[no-untyped-def]
            Counter.calls += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        out = fn(*args)
    return out, Counter.calls


def _delta_inputs(d_in: int, d_out: int, r: int, n: int, rows: int, seed: int) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d_in, generator=g)
    A = torch.randn(n, r, d_in, generator=g) / math.sqrt(d_in)
    B = torch.randn(n, d_out, r, generator=g)
    # every adapter and -1 present, in no sorted order, neighbours differ, row 0's adapter is not everyone's
    values = [n - 2, 0, -1, n - 1] + list(range(1, n - 2))
    idx = [values[0]]
    for i in range(1, rows):
        choices = [v for v in (values if i >= len(values) else [values[i]]) if v != idx[-1]]
        idx.append(choices[int(torch.randint(len(choices), (1,), generator=g))])
    idx = torch.tensor(idx)
    return x, A, B, idx


def _per_row_deltas(x: Tensor, A: Tensor, B: Tensor, s: float) -> Tensor:
    """(n_adapters, N, d_out) in float64: every row's delta under every adapter, merged-weight style."""
    dW = torch.einsum("aor,ari->aoi", B.double(), A.double()) * s          # (n, d_out, d_in): s B_a A_a
    return torch.einsum("aoi,ni->ano", dW, x.double())


_VAGUE = ("its delta is 0 although", "its delta is neither")


def _diagnose(got: Tensor, x: Tensor, A: Tensor, B: Tensor, idx: Tensor, s: float, row: int) -> str:
    """Why row `row` is wrong: another adapter's delta, the last adapter for -1, no scaling, a transposed delta."""
    all_deltas = _per_row_deltas(x, A, B, s)
    g = got[row].double()
    a = int(idx[row])

    def close(t: Tensor) -> bool:
        return t.shape == g.shape and torch.allclose(g, t, rtol=1e-3, atol=1e-4)

    if a == -1:
        if close(all_deltas[-1, row]):
            return ("it has adapter index -1 (no adapter) but got the LAST adapter's delta: A[-1] is Python's negative "
                    "indexing. Mask the rows with index -1 (delta 0).")
        for b in range(len(A)):
            if close(all_deltas[b, row]):
                return f"it has adapter index -1 (no adapter) but got adapter {b}'s delta; rows with -1 get delta 0."
        return "it has adapter index -1: its delta must be exactly 0."
    if s != 1 and close(all_deltas[a, row] / s):
        return f"its delta is missing the scaling s = alpha / r (= {s:g} here): multiply by `scaling`."
    for b in range(len(A)):
        if b != a and close(all_deltas[b, row]):
            return (f"its adapter index is {a} but it got adapter {b}'s delta: each row must use ITS OWN index "
                    "(no sorting, rolling, or reusing another row's index).")
    if close(torch.zeros_like(g)):
        return "its delta is 0 although its adapter index is not -1."
    if A.shape[2] == B.shape[1]:
        dWt = (B[a].double() @ A[a].double()).T * s
        if close(dWt @ x[row].double()):
            return "it used the transposed delta (B_a A_a)^T: the delta is B_a @ (A_a @ x), A (r, d_in) first."
        if A.shape[1] == A.shape[2] and close(s * A[a].double() @ (B[a].double() @ x[row].double())):
            return "B was applied before A: the delta is B_a @ (A_a @ x) (A shrinks d_in to r, B expands r to d_out)."
    return "its delta is neither this row's adapter's, another adapter's, nor zero."


def _own_lora(lora_delta_fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Refuse the reference handed in; the returned function refuses a wrapper that calls it, in any thread."""
    what = "Exercise 4 (lora_delta)"
    own_work(lora_delta_fn, lora_delta, what=what)
    return _watched(lora_delta_fn, (lora_delta,), what)


def check_lora_delta(lora_delta_fn: Callable[..., Tensor]) -> None:
    """lora_delta_fn(x (N, d_in), A (n, r, d_in), B (n, d_out, r), adapter_idx (N,), scaling) -> (N, d_out).

    On mixed batches (every adapter and -1 present, unsorted), W x + delta must equal running each row alone through
    the MERGED weight W + s B_a A_a (W alone for -1); the inputs must be left unchanged; and the number of torch
    calls must not grow with the number of rows (gather + batched matmuls, no Python loop over rows).
    """
    lora_delta_fn = _own_lora(lora_delta_fn)
    for case, (d_in, d_out, r, n, rows) in enumerate(_DELTA_CASES):
        x, A, B, idx = _delta_inputs(d_in, d_out, r, n, rows, seed=case)
        s = 2.0 / r if r != 2 else 0.75                  # never 1: a missing scaling shows
        g = torch.Generator().manual_seed(100 + case)
        W = torch.randn(d_out, d_in, generator=g)
        saved = [t.clone() for t in (x, A, B, idx)]
        what = f"lora_delta on {rows} rows, {n} adapters of rank {r}, d_in={d_in}, d_out={d_out}, scaling {s:g}"
        got = call_learner(what, lora_delta_fn, x, A, B, idx, s)
        for name, before, after in zip(("x", "A", "B", "adapter_idx"), saved, (x, A, B, idx)):
            if not torch.equal(before, after):
                raise AssertionError(f"{what}: your function changed its input `{name}` in place (e.g. clamp_ or "
                                     "masked_fill_ on the caller's tensor); work on a copy")
        if not isinstance(got, Tensor) or tuple(got.shape) != (rows, d_out):
            raise AssertionError(f"{what}: expected a tensor of shape ({rows}, {d_out}), got "
                                 f"{tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__}")
        if not torch.isfinite(got).all():
            raise AssertionError(f"{what}: the result has NaN or inf values")
        wrong = []
        for i in range(rows):               # the reference: the row alone through the merged weight
            a = int(idx[i])
            merged = W.double() + (s * B[a].double() @ A[a].double() if a >= 0 else 0)
            want = merged @ x[i].double()
            if not torch.allclose(W.double() @ x[i].double() + got[i].double(), want, rtol=1e-4, atol=1e-4):
                wrong.append(i)
        if wrong:
            why = {i: _diagnose(got.detach(), x, A, B, idx, s, i) for i in wrong}
            i = next((i for i in wrong if not why[i].startswith(_VAGUE)), wrong[0])
            raise AssertionError(f"{what}: {len(wrong)} of {rows} rows differ from running each row alone with its "
                                 f"adapter merged (W + s B_a A_a); row {i} (adapter index {int(idx[i])}; indices "
                                 f"{idx.tolist()}): {why[i]}")
    # no Python loop over rows: the same adapters, 8 rows against 64 rows
    x8, A8, B8, i8 = _delta_inputs(16, 16, 4, 4, 8, seed=7)
    x64, _, _, i64 = _delta_inputs(16, 16, 4, 4, 64, seed=8)
    _, few = count_torch_calls(lambda: call_learner("lora_delta on 8 rows", lora_delta_fn, x8, A8, B8, i8, 0.5))
    _, many = count_torch_calls(lambda: call_learner("lora_delta on 64 rows", lora_delta_fn, x64, A8, B8, i64, 0.5))
    if many > few + 8:
        raise AssertionError(f"lora_delta made {few} torch calls for 8 rows and {many} for 64 rows (same 4 adapters): "
                             "it loops over rows in Python. Gather every row's factors at once (A[idx], B[idx]) and "
                             "apply them with batched matmuls (torch.bmm / einsum).")


def small_model(seed: int = 0) -> GPT:
    """Lab 03's small random model (matrices scaled x6, so that greedy outputs depend on the context)."""
    return lab03_model(seed)


def _divergence(model: GPT, prompt: list[int], got: list[int], want: list[int]) -> str | None:
    """None if got == want up to a near-tie; else where they first really differ."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            with torch.inference_mode():
                top = model(torch.tensor([prompt + want[:i]]))[0, -1].float().topk(2).values
            if (top[0] - top[1]).item() < NEAR_TIE:
                return None
            return f"token {i}: got {a}, with its adapter merged it is {b}"
    return None if len(got) == len(want) else f"{len(got)} tokens instead of {len(want)}"


def check_lora_engine(lora_delta_fn: Callable[..., Tensor], *, layout: str = "packed") -> dict[str, int]:
    """Serve 9 requests of 3 adapters and the base model (the same prompt under several adapters among them) with
    lab 03's scheduler and the LoRA runner using `lora_delta_fn`: each greedy output must equal generating that
    prompt alone with its adapter merged into the weights. Returns {"steps", "mixed_steps"}."""
    lora_delta_fn = _own_lora(lora_delta_fn)
    model = small_model()
    adapters = LoRAAdapters.random(model, ["sql", "poem", "chat"], rank=4, seed=1)
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 255, (14,), generator=g).tolist()
    plan = [(0, shared), (1, shared), (2, shared), (-1, shared)]
    plan += [(a, torch.randint(0, 255, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist())
             for a in (2, 0, -1, 1, 0)]
    reqs = [Request(i, p, int(torch.randint(4, 14, (1,), generator=g)), stop_token_ids=()) for i, (_, p) in enumerate(plan)]
    adapter_of = {i: a for i, (a, _) in enumerate(plan)}
    merged = {a: merge_adapter(model, adapters, a) for a in range(len(adapters))}
    merged[-1] = model
    mixed = []
    with fixed_threads(1):
        want = {r.request_id: generate_kv_cache(merged[adapter_of[r.request_id]], list(r.prompt), r.max_new_tokens,
                                                stop_token_ids=()).tokens for r in reqs}
        cache = PagedKVCache.for_model(model, 64, 4)
        runner = LoRAModelRunner(with_lora(model, adapters, delta_fn=lora_delta_fn), cache, layout,
                                 adapter_of=lambda seq: adapter_of[seq.seq_id])
        execute = runner.execute

        def counting(out: Any) -> Any:
            mixed.append(len({adapter_of[c.seq_id] for c in out.chunks}) > 1)
            return execute(out)

        sch = Scheduler(cache.manager, SchedulerConfig(6, 24), max_model_len=SMALL_CONFIG.max_seq_len)
        with quiet():
            res = call_learner(f"serving 9 requests of 3 adapters ({layout} layout)", serve, reqs, sch, counting)
    for seq in res.sequences:
        a = adapter_of[seq.seq_id]
        bad = _divergence(merged[a], list(seq.prompt), list(seq.output_tokens), want[seq.seq_id])
        if bad:
            raise AssertionError(f"request {seq.seq_id} (adapter {a if a >= 0 else 'none (-1)'}, served in a batch mixing "
                                 f"adapters) differs from generating it alone with that adapter merged, at {bad}. "
                                 "Run check_lora_delta first: each token row must get its own request's adapter.")
    return {"steps": len(mixed), "mixed_steps": sum(mixed)}


def served_lora_model(seed: int = 3) -> tuple[GPT, LoRAAdapters]:
    """A tiny random model over the course vocabulary (text prompts work; weights x4 so that greedy outputs depend on
    the adapter) and three adapters named adapter-0 .. adapter-2."""
    model = lab03_model(seed, CHECK_CONFIG, scale=4.0)
    return model, LoRAAdapters.random(model, ["adapter-0", "adapter-1", "adapter-2"], rank=4, seed=seed - 1)


def check_lora_server(lora_delta_fn: Callable[..., Tensor]) -> dict[str, str]:
    """Serve the tiny model with three adapters (the learner's `lora_delta_fn` in the engine) on a free loopback port;
    five concurrent completions through the official openai client, `model` = an adapter name or the base ("tiny"):
    each text must equal greedy generation with that adapter merged; model="adapter-9" must get 404. Returns the texts."""
    lora_delta_fn = _own_lora(lora_delta_fn)
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import EngineConfig
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.lora_runner import engine_with_adapters
    from minigpt.tokenizer import load_tokenizer

    enc = load_tokenizer()
    model, adapters = served_lora_model()
    prompt = "def parse(args):"
    names = ["adapter-2", "tiny", "adapter-0", "adapter-1", "adapter-2"]
    with quiet():
        engine = engine_with_adapters(model, adapters, EngineConfig(num_blocks=64, block_size=8), tokenizer=enc,
                                      model_name="tiny", delta_fn=lora_delta_fn)
        with serve_in_thread(create_app(AsyncLLMEngine(engine), max_queue=16)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

            def ask(name: str) -> str:
                return client.completions.create(model=name, prompt=prompt, max_tokens=10, temperature=0).choices[0].text
            try:
                with ThreadPoolExecutor(len(names)) as pool:
                    texts = list(pool.map(ask, names))
            except openai.APIError as err:
                raise AssertionError(f"a completion naming an adapter failed: {err}. The engine step raised: is your "
                                     "lora_delta implemented and passing check_lora_delta?") from None
            try:
                client.completions.create(model="adapter-9", prompt=prompt, max_tokens=4)
                unknown = "accepted"
            except openai.NotFoundError:
                unknown = "404"
            except openai.APIError as err:
                unknown = f"{type(err).__name__}"
    if unknown != "404":
        raise AssertionError(f"model='adapter-9' (no such adapter) should get 404 model_not_found, got {unknown}")
    ids = enc.encode(prompt)
    for name, text in zip(names, texts):
        ref = model if name == "tiny" else merge_adapter(model, adapters, name)
        want = enc.decode(generate_kv_cache(ref, ids, 10, stop_token_ids=()).tokens)
        if text != want:
            raise AssertionError(f"model={name!r} (served together with requests of other adapters) answered {text!r}; "
                                 f"generating alone with {name} merged gives {want!r}. Each row must use its own "
                                 "request's adapter (run check_lora_delta first).")
    return dict(zip(names, texts))


# ---------------------------------------------------------------------------------------------------
# Interview question: serve 100 LoRA adapters on one base
# ---------------------------------------------------------------------------------------------------

def check_q1_adapter_mib(answer: Any) -> None:
    """Llama-3-8B, one LoRA adapter of rank 16 on all seven projections of every layer, bf16: its size in MiB."""
    shape = PRESETS[Q_PRESET]
    want = adapter_bytes(shape, Q_RANK) / 2**20
    d, q, ff, L = shape.d_model, shape.n_heads * shape.head_dim, shape.d_ff, shape.n_layers
    only_a = L * Q_RANK * (5 * d + q + ff) * 2 / 2**20       # A is r x d_in: d_in is d for wq wk wv w_gate w_up, q for wo, ff for w_down
    mha = L * Q_RANK * (4 * (d + q) + 3 * (d + ff)) * 2 / 2**20
    check_answer(answer, want, "Q1 (one rank-16 adapter of Llama-3-8B, bf16)",
                 {want * 2: "that is float32 (4 bytes); adapters are served in bf16 (2 bytes).",
                  want * 2**20 / 1e6: "MiB is 2**20 bytes, not 1e6.",
                  want / L: "that is one layer; the adapter covers all 32.",
                  only_a: "that counts A (r x d_in) only; each projection has B (d_out x r) too.",
                  mha: "wk and wv are GQA projections: d_model -> n_kv_heads * head_dim = 1024, not 4096."},
                 unit="MiB", rel=0.01,
                 hint="Per projection r * (d_in + d_out) parameters: wq, wo d->d; wk, wv d->1024 (8 KV heads of 128); "
                      "gate, up d->14336; down 14336->d. Times layers, times 2 bytes.")


def check_q2_hundred_adapters_share(answer: Any) -> None:
    """100 such adapters kept in GPU memory next to the bf16 base weights: what percentage of the base's weight bytes?"""
    shape = PRESETS[Q_PRESET]
    want = 100 * 100 * adapter_bytes(shape, Q_RANK) / weight_bytes(shape, 2)
    check_answer(answer, want, "Q2 (100 adapters as a share of the base weights)",
                 {want / 100: "give a percentage (x 100), not a fraction.",
                  want / 2: "count 100 adapters of BOTH factors, A and B, at 2 bytes each, against bf16 base weights."},
                 unit="percent of the base model's weight bytes", rel=0.01,
                 hint="100 * adapter bytes / calculators.weight_bytes(shape, 2), as a percentage.")


def check_q3_lora_step_overhead(answer: Any, figures: dict[str, float]) -> None:
    """From the lab's measurement (`lora_bench.lora_serving_figures()`): by what percentage does a decode step of the
    batch mixing four adapters cost more than the same step on the base model alone?"""
    want = 100 * (figures["lora_step_s"] / figures["base_step_s"] - 1)
    check_answer(answer, want, "Q3 (extra cost of batched LoRA per step, measured)",
                 {figures["lora_step_s"] / figures["base_step_s"]: "that is the ratio; give the EXTRA cost in percent.",
                  100 * figures["base_step_s"] / figures["lora_step_s"]: "compare LoRA over base, not base over LoRA."},
                 unit="percent", rel=0.01, hint="100 * (lora_step_s / base_step_s - 1) from your measured figures.")
