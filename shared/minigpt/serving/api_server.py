"""The OpenAI-compatible HTTP server (lab 08), FastAPI over an AsyncLLMEngine.

    app = create_app(AsyncLLMEngine(LLMEngine.from_checkpoint("target")), max_queue=64)
    uvicorn.run(app, host="127.0.0.1", port=8000)             # or: python -m minigpt.serving

Routes, one module per endpoint family in `minigpt.serving.api` (as vLLM's entrypoints): POST /v1/completions
(`api.completions`), POST /v1/chat/completions (`api.chat`; `stream: true` -> server-sent events in OpenAI's chunk
format, ending with `data: [DONE]`), GET /v1/models and /v1/models/{model} (`api.models`), GET /health and
GET /metrics (Prometheus text) (`api.health`). Handlers sit at module level on `APIRouter`s and read the engine and
the settings from `request.app.state.server` (`api.state.ServerState`); this module only assembles the app.

Errors use OpenAI's body {"error": {"message", "type", "param", "code"}} (`api.errors`): 400 for invalid JSON, a body
that fails validation (FastAPI's 422 becomes 400), a prompt that does not fit the context with max_tokens, bad
sampling values, unsupported features; 404 model_not_found; 405 with `Allow`; 429 with `Retry-After` when every
admission slot is taken (`admission.py`); 500 for a request whose own engine step failed (it fails alone: the other
requests go on). /openapi.json is exact (`api.schema`): served models as an enum, every status, the stream's type.

The request's `model` picks the weights: the served model name -> the base model (adapter -1), a name in the
engine's `adapter_names` -> that LoRA adapter's index.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI

from minigpt.serving.admission import AdmissionSlots, admitted
from minigpt.serving.api import chat, completions, health, models
from minigpt.serving.api.chat import DEFAULT_CHAT_MAX_TOKENS
from minigpt.serving.api.errors import install_error_handlers
from minigpt.serving.api.schema import exact_openapi
from minigpt.serving.api.state import Admission, ServerState, StreamHandler
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.chat_template import chat_template_for
from minigpt.serving.prometheus_metrics import ServingMetrics
from minigpt.serving.streaming import sse_stream
from minigpt.serving.structured_outputs import DEFAULT_BACKEND, Backend, StructuredOutputs

__all__ = ["create_app", "DEFAULT_CHAT_MAX_TOKENS", "StreamHandler", "Admission"]


def create_app(engine: AsyncLLMEngine, *, max_queue: int = 64, retry_after_s: float = 1.0,
               stream_handler: StreamHandler = sse_stream, admission: Admission = admitted,
               shutdown_engine: bool = True, disconnect_poll_s: float = 0.2,
               structured_outputs_backend: Backend = DEFAULT_BACKEND) -> FastAPI:
    """The FastAPI app. It starts the engine loop on startup if needed (and stops it on shutdown when
    `shutdown_engine`). At most `max_queue` requests are held at once (queued or running); past it, 429.
    A non-streaming request checks every `disconnect_poll_s` seconds that its client is still connected.
    `structured_outputs_backend` compiles response_format and tool grammars: "llguidance" or "course"."""
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"max_queue must be a positive int, got {max_queue!r}")
    slots = AdmissionSlots(max_queue)
    structured = StructuredOutputs(engine.engine.tokenizer, backend=structured_outputs_backend)
    state = ServerState(engine, slots, ServingMetrics(engine, in_flight=lambda: slots.in_use), stream_handler,
                        admission, retry_after_s, disconnect_poll_s,
                        chat_template=chat_template_for(engine.engine.tokenizer), structured=structured)

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

    app = FastAPI(title="minigpt OpenAI-compatible server", version="1.0", lifespan=lifespan)
    app.state.server = state
    app.state.engine, app.state.metrics, app.state.slots, app.state.max_queue = engine, state.metrics, slots, max_queue
    install_error_handlers(app)
    for module in (completions, chat, models, health):
        app.include_router(module.router)
    app.openapi = exact_openapi(app, state.served_models, engine.engine.model.config.vocab_size)
    return app
