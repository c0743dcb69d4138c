"""What every route reads from `request.app.state.server`: the engine, the admission slots, metrics, settings."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from fastapi import Request

from minigpt.serving.admission import AdmissionSlots
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.base import EngineBase
from minigpt.serving.chat_template import PLAIN_CHAT, ChatTemplate
from minigpt.serving.outputs import RequestOutput
from minigpt.serving.prometheus_metrics import ServingMetrics
from minigpt.serving.structured_outputs import StructuredOutputs

__all__ = ["ServerState", "StreamHandler", "Admission", "server_state"]

StreamHandler = Callable[[AsyncIterator[RequestOutput], Callable[[RequestOutput], list[dict]], Callable[[], None]],
                         AsyncIterator[str]]
Admission = Callable[[AdmissionSlots, float], Any]


@dataclass
class ServerState:
    """engine: the async engine (its `.engine` is the core one); slots: admission (at most `capacity` requests held);
    stream_handler / admission: the lab's two learner pieces; disconnect_poll_s: how often a non-streaming request
    checks that its client is still there; chat_template: the model's own (an imported HF model's) or the course's
    plain transcript; structured: the grammars of response_format and tools, compiled once per schema (by the
    llguidance backend unless one is given)."""

    engine: AsyncLLMEngine
    slots: AdmissionSlots
    metrics: ServingMetrics
    stream_handler: StreamHandler
    admission: Admission
    retry_after_s: float = 1.0
    disconnect_poll_s: float = 0.2
    counter: itertools.count = field(default_factory=itertools.count)
    chat_template: ChatTemplate = PLAIN_CHAT
    structured: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        if self.structured is None:
            self.structured = StructuredOutputs(self.core.tokenizer)

    @property
    def core(self) -> EngineBase:
        return self.engine.engine

    @property
    def served_models(self) -> list[str]:
        """The base model's name, then its LoRA adapters' (a request's `model` picks one)."""
        return [self.core.model_name, *self.core.adapter_names]


def server_state(request: Request) -> ServerState:
    return request.app.state.server
