"""Lab 08, exercise 1: the SSE streaming handler (sse_stream), scripted and through the server."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable

import httpx

from autograder.harness import call_learner, quiet
from autograder.lab08.common import (ABORTED, DISCONNECT_WAIT_S, MODEL_NAME, TIMEOUT_S, _stub_guard, _wait_for,
                                     check_server, observe_where)
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.serving.aio import run_sync
from minigpt.serving.outputs import RequestOutput
from minigpt.serving.replicas import read_metrics
from minigpt.serving.streaming import sse_stream


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
        try:
            parsed.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
        except json.JSONDecodeError as err:
            raise AssertionError(f"{what}: event {i} carries {payload!r}, which is not JSON ({err.msg}); the "
                                 "payload is json.dumps(chunk, separators=(',', ':'))") from None
        if payload != "[DONE]" and payload != json.dumps(parsed[-1], separators=(",", ":")):
            raise AssertionError(f"{what}: event {i} carries {payload!r}; send compact JSON, "
                                 "json.dumps(chunk, separators=(',', ':')): no spaces, every byte of a stream counts")
    return parsed


def _sse_unit_observations(fn: Callable) -> dict:
    """Run the learner's sse_stream on four scripted streams; what it yielded, raised and aborted (data only)."""
    _stub_guard("sse_stream", fn, "an async generator", _scripted([]), _chunk, lambda: None)
    texts = ["Hello", ", wor", "ld!"]
    seen: dict = {}

    # 1. A whole stream: one event per chunk, in order, then [DONE]; no abort.
    aborts: list[int] = []

    async def whole() -> list[str]:
        return [e async for e in fn(_scripted(_outputs(texts)), _chunk, lambda: aborts.append(1))]
    events = call_learner("sse_stream (a 3-output stream)", run_sync, whole())
    seen["whole"] = {"events": [e if isinstance(e, (str, bytes)) else repr(e) for e in events], "aborts": len(aborts)}

    # 2. The consumer stops after the first event (the server closes the generator when the client goes away).
    aborts.clear()

    async def closed_early() -> None:
        gate = asyncio.Event()
        agen = fn(_scripted(_outputs(texts)[:2], gate), _chunk, lambda: aborts.append(1))
        await agen.__anext__()
        await agen.aclose()
    call_learner("sse_stream (consumer closes it after one event)", run_sync, closed_early())
    seen["closed_early"] = {"aborts": len(aborts)}

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
    seen["cancelled"] = {"aborts": len(aborts)}

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
    seen["broken"] = {"last_event": events[-1] if events and isinstance(events[-1], str) else None,
                      "raised": error is not None, "aborts": len(aborts)}
    return seen


def _check_sse_unit(fn: Callable) -> None:
    texts = ["Hello", ", wor", "ld!"]
    seen = observe_where(fn, _sse_unit_observations, fn, watch=(sse_stream,), what="Exercise 1 (sse_stream)")

    events = list(seen["whole"]["events"])
    got = _parse_events(events, "a 3-output stream")
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
    if seen["whole"]["aborts"]:
        raise AssertionError("a stream that reached its finished output must not abort the request (it is done)")

    if seen["closed_early"]["aborts"] != 1:
        raise AssertionError(f"the client went away after the first event (the generator was closed): the request "
                             f"must be aborted exactly once, got {seen['closed_early']['aborts']} abort call(s). Put "
                             "the abort in a `finally:` that runs when the stream did not reach its finished output.")
    if seen["cancelled"]["aborts"] != 1:
        raise AssertionError(f"the streaming task was cancelled while waiting for the next output (the client "
                             f"disconnected): the request must be aborted exactly once, got "
                             f"{seen['cancelled']['aborts']} call(s). A `try/finally` around the loop catches "
                             "cancellation too.")
    broken = seen["broken"]
    if not broken["raised"] and broken["last_event"] == "data: [DONE]\n\n":
        raise AssertionError("the outputs iterator raised after the first output (the engine failed), and your stream "
                             "still ended with 'data: [DONE]\\n\\n': the client takes a truncated text for a complete "
                             "one. Let the error propagate (do not catch it), so the response ends without [DONE] and "
                             "the client sees the failure.")
    if broken["aborts"] != 1:
        raise AssertionError(f"the engine failed mid-stream: the request must be aborted exactly once (its blocks "
                             f"freed), got {broken['aborts']} abort call(s); the `finally` covers errors too.")


def _sse_server_observations(fn: Callable) -> dict:
    """The reference server with the learner's stream handler, driven by the openai client and raw HTTP: the texts
    it streamed and did not, the raw stream's last lines, and /metrics after a client left mid-stream (data only)."""
    import openai
    seen: dict = {}
    with check_server(stream_handler=fn) as (url, aengine):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)
        prompt, msgs = "Once upon a time", [{"role": "user", "content": "Write a haiku about caches."}]
        seen["full"] = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24,
                                                 temperature=0).choices[0].text
        try:
            chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0,
                                                    stream=True))
            seen["streamed"] = "".join(c.choices[0].text for c in chunks if c.choices)
        except Exception as err:
            seen["stream_error"] = f"{type(err).__name__}: {err}"
            return seen
        seen["chat"] = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=24,
                                                      temperature=0).choices[0].message.content
        try:
            parts = list(client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=24, temperature=0,
                                                        stream=True))
            seen["chat_streamed"] = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        except Exception as err:
            seen["chat_stream_error"] = f"{type(err).__name__}: {err}"
            return seen

        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=TIMEOUT_S) as r:
            seen["raw_lines"] = [line for line in r.iter_lines() if line.strip()][-2:]

        # A client that disconnects mid-stream. The engine pauses after a few steps, so the request is still
        # running (holding KV blocks) when the client leaves: only the handler's abort can free them.
        aborted_before = read_metrics(url).get(ABORTED, 0.0)
        aengine.pause(after_steps=10)
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 100, "temperature": 0, "stream": True}
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=TIMEOUT_S) as r:
                events = 0
                for line in r.iter_lines():
                    events += line.startswith("data: ")
                    if events == 2:
                        break                      # leaving the block closes the connection
            seen["freed"] = _wait_for(lambda: (m := read_metrics(url))["minigpt_kv_blocks_used"] == 0
                                      and m["minigpt_requests_running"] == 0, DISCONNECT_WAIT_S)
            m = read_metrics(url)
            seen["after_disconnect"] = {"blocks_used": m["minigpt_kv_blocks_used"],
                                        "running": m["minigpt_requests_running"],
                                        "aborted": m.get(ABORTED, 0.0) - aborted_before}
        finally:
            aengine.resume()
    return seen


def _check_sse_server(fn: Callable) -> None:
    seen = observe_where(fn, _sse_server_observations, fn, watch=(sse_stream,), what="Exercise 1 (sse_stream)")
    if "stream_error" in seen:
        raise AssertionError(f"streaming a completion through the server with your handler failed: "
                             f"{seen['stream_error']}")
    if seen["streamed"] != seen["full"]:
        raise AssertionError(f"streamed completion chunks concatenate to {seen['streamed']!r}, but the same request "
                             f"without streaming gives {seen['full']!r}")
    if "chat_stream_error" in seen:
        raise AssertionError(f"streaming a chat completion through the server with your handler failed: "
                             f"{seen['chat_stream_error']}")
    if seen["chat_streamed"] != seen["chat"]:
        raise AssertionError(f"streamed chat chunks concatenate to {seen['chat_streamed']!r}, but the same chat "
                             f"without streaming gives {seen['chat']!r}")
    lines = seen["raw_lines"]
    if not lines or lines[-1] != "data: [DONE]":
        raise AssertionError(f"the raw stream must end with 'data: [DONE]', its last lines are {lines!r}")
    m = seen["after_disconnect"]
    if not seen["freed"]:
        raise AssertionError(
            f"a client disconnected after 2 events of a 100-token stream; {DISCONNECT_WAIT_S:g} s later /metrics "
            f"still shows {m['blocks_used']:g} KV blocks used and {m['running']:g} request(s) running. The handler "
            "must abort the request when the stream stops before its finished output (try/finally), so that its "
            "blocks are freed at once.")
    if m["aborted"] != 1:
        raise AssertionError("after the disconnect exactly one request should have been aborted, /metrics says "
                             f"{m['aborted']:g}")


def check_sse_stream(sse_stream_fn: Callable) -> None:
    """The learner's `sse_stream(outputs, make_chunks, abort)`: scripted cases, then the server with the openai client."""
    what = "Exercise 1 (sse_stream)"
    own_work(sse_stream_fn, sse_stream, what=what)
    with quiet(), no_calls_into(sse_stream, what=what):
        _check_sse_unit(sse_stream_fn)
        _check_sse_server(sse_stream_fn)
