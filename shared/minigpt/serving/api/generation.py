"""From a validated OpenAI request to engine requests and back (lab 08), shared by completions and chat.

One HTTP request holds ONE admission slot and becomes prompts x candidates engine requests (n choices, or best_of
candidates, per prompt), each with its own seed (choice i: seed + i; no seed: a fresh random one per HTTP request).
Their outputs arrive merged in one `ChoiceStream`. Then either

* streaming: the lab's SSE handler turns every output into chunks (`make_chunks`) and events; or
* not streaming: `collect` gathers every choice while polling the client: a client that leaves is noticed within
  `disconnect_poll_s` and its engine requests are aborted (slot and KV blocks freed), instead of generating on.

A choice the engine could not finish (its own step failed, or the engine stopped) is an error, never a
finish_reason: 500 (or 503) for a non-streaming request, a last `{"error": ...}` event in a stream.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Hashable, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minigpt.engine.logits_processing import GrammarConstraint
from minigpt.sampling import SamplingParams
from minigpt.serving.api.errors import BadRequest, EngineUnavailable, ModelNotFound, error_response
from minigpt.serving.api.state import ServerState
from minigpt.serving.outputs import RequestOutput, TokenLogprob
from minigpt.serving.protocol import error_body
from minigpt.serving.tool_calls import ToolMode, call_grammar, call_lark

__all__ = ["Generation", "ChoiceResult", "ChoiceStream", "start_generation", "collect", "stream_response",
           "adapter_of", "usage_of", "constraint_of"]

CLIENT_CLOSED = 499          # nginx's "client closed request": the response of a request nobody waits for


def adapter_of(state: ServerState, model: str) -> int:
    """The request's `model` -> -1 (the base model) or a LoRA adapter's index; 404 model_not_found otherwise."""
    core = state.core
    if model == core.model_name:
        return -1
    if model in core.adapter_names:
        return core.adapter_names.index(model)
    raise ModelNotFound(model, state.served_models)


async def constraint_of(state: ServerState, body: Any, mode: ToolMode | None = None) -> GrammarConstraint | None:
    """The grammar a request's output follows: its tool mode's, else its response_format's (None: free text).
    Compiled off the event loop and the engine's thread, and cached (`StructuredOutputs`, by the server's backend);
    a schema the backend refuses is a 400 naming what it refused."""
    try:
        if mode is not None:
            return await state.structured.compiled("tools:" + mode.cache_key, course=lambda: call_grammar(mode),
                                                   llguidance=lambda: call_lark(mode))
        return await state.structured.for_response_format(body.response_format)
    except ValueError as err:
        param = "tools" if mode is not None else "response_format"
        raise BadRequest(f"invalid {param}: {err}", param, "invalid_schema") from None


def sampling_of(body: Any, seed: int, logprobs: int | None, constraint: GrammarConstraint | None = None
                ) -> SamplingParams:
    """A choice's SamplingParams: the request's sampling and logits processing (penalties, logit_bias, grammar)."""
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = None if body.top_p is None or body.top_p >= 1.0 else body.top_p
    return SamplingParams(temperature=temperature, top_k=body.top_k, top_p=top_p, seed=seed, logprobs=logprobs,
                          presence_penalty=body.presence_penalty or 0.0,
                          frequency_penalty=body.frequency_penalty or 0.0, logit_bias=body.bias_pairs,
                          constraint=constraint)


class ChoiceStream:
    """The outputs of one HTTP request's engine requests, in the order the engine produced them, until every one
    has finished. `abort_unfinished()` aborts those not finished yet (once each; safe to call again)."""

    def __init__(self, engine: Any, queue: asyncio.Queue, request_ids: Sequence[Hashable]) -> None:
        self.engine, self.queue = engine, queue
        self.remaining = set(request_ids)
        self._aborted: set[Hashable] = set()

    def __aiter__(self) -> "ChoiceStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if not self.remaining:
            raise StopAsyncIteration
        out = await self.queue.get()
        if out.finished:
            self.remaining.discard(out.request_id)
        return out

    def abort_unfinished(self) -> None:
        for rid in self.remaining - self._aborted:
            self._aborted.add(rid)
            self.engine.abort_nowait(rid)


@dataclass
class ChoiceResult:
    """One engine request's whole result (one choice or candidate)."""

    prompt_index: int
    num_prompt_tokens: int = 0
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    def add(self, out: RequestOutput) -> None:
        self.num_prompt_tokens = out.num_prompt_tokens
        self.text.append(out.text)
        self.token_ids += out.new_token_ids
        self.logprobs += out.logprobs or []
        if out.finished:
            self.finish_reason, self.error = out.finish_reason, out.error

    @property
    def cumulative_logprob(self) -> float:
        return sum(lp.logprob for lp in self.logprobs)


@dataclass
class Generation:
    """A started request: its id, engine request ids (prompt-major: prompt p's candidates k at p * per_prompt + k),
    the merged stream and the exit stack holding its admission slot."""

    request_id: str
    created: int
    request_ids: list[str]
    per_prompt: int
    stream: ChoiceStream
    stack: AsyncExitStack
    logprobs: int | None                  # what the client asked for (None: none)
    num_prompt_tokens: list[int]

    def position(self, request_id: Hashable) -> int:
        return self.request_ids.index(request_id)


async def start_generation(state: ServerState, body: Any, prompts: Sequence[str | list[int]],
                           max_tokens: Callable[[list[int]], int], stop: list[str], prefix: str, *,
                           candidates: int, logprobs: int | None, rank: bool = False,
                           constraint: GrammarConstraint | None = None) -> Generation:
    """Validate every engine request (400; a bad request is never worth retrying), take an admission slot (429),
    queue them. `max_tokens(prompt_ids)` gives each prompt's budget; `rank`: best_of needs logprobs to rank;
    `constraint`: the grammar every choice follows (each choice keeps its own state of it)."""
    adapter = adapter_of(state, body.model)
    core = state.core
    seed = body.seed if body.seed is not None else secrets.randbits(63)
    internal_logprobs = logprobs if logprobs is not None else (0 if rank else None)
    request_id = f"{prefix}-{uuid.uuid4().hex[:16]}-{next(state.counter)}"
    jobs, prompt_lengths = [], []
    for p, prompt in enumerate(prompts):
        try:
            ids = core.encode(prompt)
            prompt_lengths.append(len(ids))
            budget = max_tokens(ids)
            for k in range(candidates):
                rid = f"{request_id}-{p}-{k}"
                sampling = sampling_of(body, (seed + k) % 2**63, internal_logprobs, constraint)
                core.validate(rid, ids, budget, sampling, stop=stop, adapter=adapter)
                jobs.append((rid, ids, budget, sampling))
        except ValueError as err:
            msg = str(err)
            param = ("logit_bias" if "logit_bias" in msg else
                     "max_tokens" if "max_tokens" in msg and "prompt" not in msg else "prompt")
            raise BadRequest(msg, param, "context_length_exceeded" if "context" in msg else "invalid_value") from None
    stack = AsyncExitStack()
    await stack.enter_async_context(state.admission(state.slots, state.retry_after_s))   # QueueFull -> 429
    queue: asyncio.Queue = asyncio.Queue()
    stream = ChoiceStream(state.engine, queue, [rid for rid, *_ in jobs])
    try:
        for rid, ids, budget, sampling in jobs:
            state.engine.stream(rid, ids, budget, sampling, stop=stop, adapter=adapter, queue=queue)
    except BaseException as err:
        stream.abort_unfinished()
        await stack.aclose()
        if isinstance(err, RuntimeError) and not state.engine.is_running:
            raise EngineUnavailable("the engine loop is not running", None, "engine_not_running") from None
        raise
    return Generation(request_id, int(time.time()), [rid for rid, *_ in jobs], candidates, stream, stack, logprobs,
                      prompt_lengths)


def usage_of(gen: Generation, results: Sequence[ChoiceResult]) -> dict[str, int]:
    """Prompt tokens counted once per prompt; completion tokens over every candidate generated."""
    prompt = sum(gen.num_prompt_tokens)
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _failure(results: Sequence[ChoiceResult]) -> JSONResponse | None:
    failed = [r for r in results if r.finish_reason == "abort"]
    if not failed:
        return None
    errors = [r.error for r in failed if r.error]
    if errors:
        return error_response(500, f"the engine could not finish this request: {errors[0]}", "server_error", None,
                              "engine_error")
    return error_response(503, "the request was aborted: the engine is shutting down", "server_error", None,
                          "aborted")


async def collect(request: Request, state: ServerState, gen: Generation, num_choices: int,
                  make_response: Callable[[Generation, list[tuple[int, ChoiceResult]], dict], dict]) -> Response:
    """Gather every choice (not streaming), watching the client: gone -> abort everything, free the slot at once.
    best_of: keep the `num_choices` candidates of each prompt with the highest cumulative logprob."""
    results = [ChoiceResult(i // gen.per_prompt) for i in range(len(gen.request_ids))]

    async def gather() -> None:
        async for out in gen.stream:
            results[gen.position(out.request_id)].add(out)

    task = asyncio.ensure_future(gather())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=state.disconnect_poll_s)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                return Response(status_code=CLIENT_CLOSED)
        task.result()
    finally:
        if not task.done():
            task.cancel()
        gen.stream.abort_unfinished()
        await gen.stack.aclose()                           # give the admission slot back
    if (fail := _failure(results)) is not None:
        return fail
    chosen: list[tuple[int, ChoiceResult]] = []
    for p in range(len(gen.num_prompt_tokens)):
        group = results[p * gen.per_prompt:(p + 1) * gen.per_prompt]
        if gen.per_prompt > num_choices:                   # best_of: the most likely candidates, best first
            group = sorted(group, key=lambda r: r.cumulative_logprob, reverse=True)
        chosen += [(p * num_choices + j, r) for j, r in enumerate(group[:num_choices])]
    return JSONResponse(make_response(gen, chosen, usage_of(gen, results)))


class _SSEResponse(StreamingResponse):
    """A StreamingResponse that, however the response ends (finished, client gone, cancelled before the first
    byte), closes its body iterator, so the handler's `finally` runs at once, and then calls `on_close`."""

    def __init__(self, content: AsyncIterator[str], *, on_close: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            except (RuntimeError, AttributeError):
                pass
            await self.on_close()


def error_chunk(out: RequestOutput) -> dict:
    """The last event of a stream whose choice the engine could not finish (instead of a finish_reason)."""
    if out.error:
        return error_body(f"the engine could not finish this request: {out.error}", "server_error", None,
                          "engine_error")
    return error_body("the request was aborted: the engine is shutting down", "server_error", None, "aborted")


def chunk_maker(gen: Generation, include_usage: bool, choice: Callable[[int, RequestOutput], dict | list[dict]],
                envelope: Callable[[list[dict], dict | None], dict]) -> Callable[[RequestOutput], list[dict]]:
    """`make_chunks` for stream_response, for either endpoint: an output of choice i that carries text, an end or
    logprobs becomes one chunk, envelope([choice(i, out)], None) (or one chunk per dict if `choice` returns a list:
    a streamed tool call, none while it holds text back); an aborted choice ends with an error chunk; after
    the last choice ends, envelope([], usage) when the client asked for usage."""
    results = [ChoiceResult(0) for _ in gen.request_ids]

    def make_chunks(out: RequestOutput) -> list[dict]:
        i = gen.position(out.request_id)
        results[i].add(out)
        if out.finished and out.finish_reason == "abort":
            return [error_chunk(out)]
        chunks = []
        if out.text or out.finished or (gen.logprobs is not None and out.logprobs):
            pieces = choice(i, out)
            chunks += [envelope([piece], None) for piece in (pieces if isinstance(pieces, list) else [pieces])]
        if out.finished and not gen.stream.remaining and include_usage:
            chunks.append(envelope([], usage_of(gen, results)))
        return chunks
    return make_chunks


def stream_response(state: ServerState, gen: Generation, make_chunks: Callable[[RequestOutput], list[dict]]
                    ) -> Response:
    """Server-sent events through the lab's stream handler; the slot is given back however the stream ends.
    With one choice the handler owns the abort (the lab's exercise: nothing here hides a handler that forgets it);
    with several, a handler that stops after some choice's finished output would leave the others running, so the
    server aborts whatever is unfinished too."""
    started = [False]

    async def events() -> AsyncIterator[str]:
        started[0] = True
        try:
            async for event in state.stream_handler(gen.stream, make_chunks, gen.stream.abort_unfinished):
                yield event
        finally:
            if len(gen.request_ids) > 1:
                gen.stream.abort_unfinished()
            await gen.stack.aclose()

    async def on_close() -> None:
        if not started[0]:                                 # the client left before the handler ever ran
            gen.stream.abort_unfinished()
        await gen.stack.aclose()                           # (a no-op if events() already did it)

    return _SSEResponse(events(), on_close=on_close, media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
