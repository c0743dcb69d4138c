"""Checks for Lab 08, the server's learner pieces: the SSE streaming handler and the admission rule.

Each check runs the learner's function on its own (small scripted cases), then inside the reference server:
an in-thread uvicorn server on a free loopback port (`minigpt.serving.launch.serve_in_thread`) over a tiny seeded
random model, driven with the official `openai` client and raw HTTP (httpx), and stopped (thread joined) at the end.

    check_sse_stream(sse_stream)   events are `data: <json>\\n\\n`, one per chunk, then `data: [DONE]\\n\\n`; the
                                   request is aborted if the stream stops early (consumer closed or task cancelled);
                                   through the server: the openai client's streamed completions and chats concatenate
                                   to the non-streamed text (greedy), the raw stream ends with [DONE], and a client
                                   that disconnects mid-stream frees every KV block (read from /metrics)
    check_admission(admitted)      refuses at once with QueueFull(retry_after) when every slot is taken, never admits
                                   past the capacity, gives the slot back on exit (also on error); through the server:
                                   with the engine paused and the queue full the next request gets 429 + Retry-After
                                   quickly, and after resuming everything admitted completes and slots are released
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from contextlib import AsyncExitStack, contextmanager
from typing import Any, AsyncIterator, Callable, Iterator

import httpx
import torch

from autograder.harness import call_learner, quiet
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.serving.admission import AdmissionSlots, QueueFull, admitted
from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.outputs import RequestOutput
from minigpt.serving.streaming import sse_stream

__all__ = ["check_sse_stream", "check_admission", "CHECK_CONFIG", "check_server", "read_metrics"]

# A tiny random model over the course vocabulary (text prompts work); weights scaled x6 so that greedy text varies.
CHECK_CONFIG = ModelConfig(vocab_size=4096, max_seq_len=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)
MODEL_NAME = "minigpt-check"
TIMEOUT_S = 10.0            # generous: the machine may be busy; a correct server answers in well under a second
REFUSAL_TIMEOUT_S = 2.0     # a full queue must answer 429 within this (an admission that waits never does)
DISCONNECT_WAIT_S = 3.0     # a disconnected client's blocks must be free within this
ABORTED = 'minigpt_requests_total{outcome="abort"}'
REJECTED = 'minigpt_requests_total{outcome="rejected"}'


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CHECK_CONFIG).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(6.0)
    return model


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


def read_metrics(url: str) -> dict[str, float]:
    """GET /metrics parsed with prometheus_client: {'name{label="v"}': value} (no labels: just the name)."""
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(url + "/metrics", timeout=TIMEOUT_S).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


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
        call_learner(what, lambda: asyncio.run(raw(*args)))
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
    events = call_learner("sse_stream (a 3-output stream)", asyncio.run, whole())
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
    call_learner("sse_stream (consumer closes it after one event)", asyncio.run, closed_early())
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
    call_learner("sse_stream (task cancelled mid-stream)", asyncio.run, cancelled())
    if aborts != [1]:
        raise AssertionError(f"the streaming task was cancelled while waiting for the next output (the client "
                             f"disconnected): the request must be aborted exactly once, got {len(aborts)} call(s). "
                             "A `try/finally` around the loop catches cancellation too.")


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
    with quiet():
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
    problem = call_learner("admitted", asyncio.run, scenario(), passthrough=(QueueFull,))
    if problem:
        raise AssertionError(problem)


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
            try:
                r = httpx.post(url + "/v1/completions", json=body, timeout=REFUSAL_TIMEOUT_S)
            except httpx.TimeoutException:
                held = read_metrics(url)["minigpt_server_requests_in_flight"]
                if held > max_queue:
                    raise AssertionError(f"with the queue full ({max_queue} of {max_queue}) one more request was "
                                         f"admitted ({held:g} in flight, expected 429): never admit past the capacity"
                                         ) from None
                raise AssertionError(f"with the queue full ({max_queue} of {max_queue}), a request got no answer "
                                     f"within {REFUSAL_TIMEOUT_S} s: the admission waits instead of refusing with 429"
                                     ) from None
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
    with quiet():
        _check_admission_unit(admitted_fn)
        _check_admission_server(admitted_fn)
