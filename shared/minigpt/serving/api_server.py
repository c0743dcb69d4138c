"""The OpenAI-compatible HTTP server (lab 08), FastAPI over an AsyncLLMEngine.

    app = create_app(AsyncLLMEngine(LLMEngine.from_checkpoint("target")), max_queue=64)
    uvicorn.run(app, host="127.0.0.1", port=8000)             # or: python -m minigpt.serving

Routes: POST /v1/completions, POST /v1/chat/completions (`stream: true` -> server-sent events in OpenAI's chunk
format, ending with `data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus text).

Errors use OpenAI's body {"error": {"message", "type", "param", "code"}}: 400 for invalid JSON, a body that
fails validation (FastAPI's 422 becomes 400), an unknown model, a prompt that does not fit the context with
max_tokens, bad sampling values; 429 with `Retry-After` when every admission slot is taken (`admission.py`).

The request's `model` picks the weights: the served model name -> the base model (adapter -1), a name in the
engine's `adapter_names` -> that LoRA adapter's index.
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minigpt.sampling import SamplingParams
from minigpt.serving.admission import AdmissionSlots, QueueFull, admitted
from minigpt.serving.async_engine import AsyncLLMEngine, RequestStream
from minigpt.serving.chat_template import chat_template_for
from minigpt.serving.outputs import RequestOutput
from minigpt.serving.prometheus_metrics import CONTENT_TYPE, ServingMetrics
from minigpt.serving.protocol import ChatCompletionRequest, CompletionRequest, error_body
from minigpt.serving.streaming import sse_stream

__all__ = ["create_app", "DEFAULT_CHAT_MAX_TOKENS", "StreamHandler", "Admission"]

DEFAULT_CHAT_MAX_TOKENS = 128          # a chat request without max_tokens: at most this, within the context
StreamHandler = Callable[[AsyncIterator[RequestOutput], Callable[[RequestOutput], list[dict]], Callable[[], None]],
                         AsyncIterator[str]]
Admission = Callable[[AdmissionSlots, float], Any]


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def _param_name(loc: tuple) -> str | None:
    """pydantic's error location as OpenAI's `param`: ('body', 'messages', 0, 'role') -> 'messages.0.role';
    the member names of a union ('prompt', 'list[int]', 0) are dropped -> 'prompt'."""
    parts = []
    for x in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(x, int) or (isinstance(x, str) and x.isidentifier() and x not in ("str", "int", "float", "bool")):
            parts.append(str(x))
        else:
            break
    return ".".join(parts) or None


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


def create_app(engine: AsyncLLMEngine, *, max_queue: int = 64, retry_after_s: float = 1.0,
               stream_handler: StreamHandler = sse_stream, admission: Admission = admitted,
               shutdown_engine: bool = True) -> FastAPI:
    """The FastAPI app. It starts the engine loop on startup if needed (and stops it on shutdown when
    `shutdown_engine`). At most `max_queue` requests are held at once (queued or running); past it, 429."""
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"max_queue must be a positive int, got {max_queue!r}")
    core = engine.engine
    chat_template = chat_template_for(core.tokenizer)      # the model's own (HF) template, or the course's transcript
    slots = AdmissionSlots(max_queue)
    metrics = ServingMetrics(engine, in_flight=lambda: slots.in_use)
    counter = itertools.count()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started = not engine.is_running
        if started:
            engine.start()
        try:
            yield
        finally:
            if started or shutdown_engine:
                engine.shutdown()

    app = FastAPI(title="minigpt OpenAI-compatible server", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.slots, app.state.max_queue = engine, metrics, slots, max_queue

    # --- errors ------------------------------------------------------------------------------------

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.refused("invalid")
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return _error(400, f"the request body is not valid JSON: {first.get('msg', '')}", "invalid_request_error",
                          None, "invalid_json")
        param = _param_name(first.get("loc", ()))
        msg = first.get("msg", "invalid")
        if param == "prompt" and first.get("type") != "missing":
            msg = "the prompt must be a string or a list of integer token ids"
        return _error(400, f"invalid value for {param or 'the request body'}: {msg}", "invalid_request_error", param,
                      "invalid_value")

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest) -> JSONResponse:
        metrics.refused("invalid")
        return _error(400, exc.message, "invalid_request_error", exc.param, exc.code)

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull) -> JSONResponse:
        metrics.refused("rejected")
        retry = getattr(exc, "retry_after", None)
        headers = {"Retry-After": str(max(1, math.ceil(retry)))} if retry is not None else None
        return _error(429, str(exc), "rate_limit_error", None, "queue_full", headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:                     # e.g. a body that cannot be parsed at all
            metrics.refused("invalid")
        return _error(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500 else "server_error")

    # --- helpers -----------------------------------------------------------------------------------

    def adapter_of(model: str) -> int:
        if model == core.model_name:
            return -1
        if model in core.adapter_names:
            return core.adapter_names.index(model)
        served = [core.model_name, *core.adapter_names]
        raise BadRequest(f"the model {model!r} does not exist; this server serves {served}", "model", "model_not_found")

    def sampling_of(body: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
        return SamplingParams(temperature=body.temperature, top_k=body.top_k,
                              top_p=body.top_p if body.top_p < 1.0 else None, seed=body.seed or 0)

    def usage(out: RequestOutput) -> dict[str, int]:
        return {"prompt_tokens": out.num_prompt_tokens, "completion_tokens": out.num_output_tokens,
                "total_tokens": out.num_prompt_tokens + out.num_output_tokens}

    async def start(body: Any, prompt: str | list[int], max_tokens: int, stop: list[str], prefix: str
                    ) -> tuple[str, RequestStream, AsyncExitStack]:
        """Validate (400: a bad request is never worth retrying), then admission (429), then queue it in the engine."""
        adapter = adapter_of(body.model)
        sampling = sampling_of(body)
        request_id = f"{prefix}-{uuid.uuid4().hex[:16]}-{next(counter)}"
        try:
            ids = core.validate(request_id, prompt, max_tokens, sampling, stop=stop, adapter=adapter)
        except ValueError as err:
            msg = str(err)
            param = "max_tokens" if "max_tokens" in msg and "prompt" not in msg else "prompt"
            raise BadRequest(msg, param, "context_length_exceeded" if "context" in msg else "invalid_value") from None
        stack = AsyncExitStack()
        await stack.enter_async_context(admission(slots, retry_after_s))        # QueueFull -> 429
        try:
            stream = engine.stream(request_id, ids, max_tokens, sampling, stop=stop, adapter=adapter)
        except BaseException:
            await stack.aclose()
            raise
        return request_id, stream, stack

    async def respond(request_id: str, stream: RequestStream, stack: AsyncExitStack, body: Any,
                      make_chunks: Callable[[RequestOutput], list[dict]],
                      make_response: Callable[[str, RequestOutput], dict]) -> Response:
        if body.stream:
            started = [False]

            async def events() -> AsyncIterator[str]:
                started[0] = True
                try:
                    async for event in stream_handler(stream, make_chunks, lambda: engine.abort_nowait(request_id)):
                        yield event
                finally:
                    await stack.aclose()                # give the admission slot back

            async def on_close() -> None:
                if not started[0]:                      # the client left before the handler ever ran
                    engine.abort_nowait(request_id)
                await stack.aclose()                    # (a no-op if events() already did it)
            return _SSEResponse(events(), on_close=on_close, media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        parts: list[str] = []
        last: RequestOutput | None = None
        try:
            async for out in stream:
                parts.append(out.text)
                last = out
        finally:
            if last is None or not last.finished:
                engine.abort_nowait(request_id)
            await stack.aclose()
        if last.finish_reason == "abort":
            return _error(500, "the request was aborted by the engine", "server_error", None, "aborted")
        return JSONResponse(make_response("".join(parts), last))

    # --- routes ------------------------------------------------------------------------------------

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        max_tokens = body.max_tokens if body.max_tokens is not None else 16
        request_id, stream, stack = await start(body, body.prompt, max_tokens, body.stop_list, "cmpl")
        created = int(time.time())

        def chunk(text: str, reason: str | None) -> dict:
            return {"id": request_id, "object": "text_completion", "created": created, "model": body.model,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

        def make_chunks(out: RequestOutput) -> list[dict]:
            chunks = [chunk(out.text, out.finish_reason)] if out.text or out.finished else []
            if out.finished and body.include_usage:
                chunks.append({**chunk("", None), "choices": [], "usage": usage(out)})
            return chunks

        def make_response(text: str, out: RequestOutput) -> dict:
            return {**chunk(text, out.finish_reason), "usage": usage(out)}

        return await respond(request_id, stream, stack, body, make_chunks, make_response)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        try:
            prompt = chat_template.render(body.messages)
        except ValueError as err:
            raise BadRequest(str(err), "messages") from None
        max_tokens = body.token_budget
        if max_tokens is None:
            n_prompt = len(core.encode(prompt))
            max_tokens = max(1, min(DEFAULT_CHAT_MAX_TOKENS, core.max_model_len - n_prompt))
        stop = [*body.stop_list, *chat_template.stop_strings]
        request_id, stream, stack = await start(body, prompt, max_tokens, stop, "chatcmpl")
        created = int(time.time())
        sent_role = [False]

        def chunk(delta: dict, reason: str | None) -> dict:
            return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": body.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}

        def make_chunks(out: RequestOutput) -> list[dict]:
            chunks = []
            if out.text or out.finished:
                delta = {"content": out.text}
                if not sent_role[0]:
                    delta, sent_role[0] = {"role": "assistant", **delta}, True
                chunks.append(chunk(delta, out.finish_reason))
            if out.finished and body.include_usage:
                chunks.append({**chunk({}, None), "choices": [], "usage": usage(out)})
            return chunks

        def make_response(text: str, out: RequestOutput) -> dict:
            return {"id": request_id, "object": "chat.completion", "created": created, "model": body.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                 "finish_reason": out.finish_reason}], "usage": usage(out)}

        return await respond(request_id, stream, stack, body, make_chunks, make_response)

    @app.get("/v1/models")
    async def models() -> dict:
        created = int(time.time())
        names = [core.model_name, *core.adapter_names]
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "minigpt",
             "root": core.model_name, "parent": None if i == 0 else core.model_name} for i, name in enumerate(names)]}

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_running:
            return _error(503, "the engine loop is not running", "server_error")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
