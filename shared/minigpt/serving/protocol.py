"""OpenAI-compatible request and response bodies (lab 08), as pydantic models.

Only what the course engine supports is accepted: one choice (n=1), text or token-id prompts, temperature,
top_p, top_k (an extension, as in vLLM), seed, stop strings, max_tokens, streaming with
`stream_options.include_usage`. Unknown fields OpenAI clients send (user, logprobs=None, ...) are ignored.
Bad values fail validation; the server answers them with 400 and an OpenAI-style error body.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

__all__ = ["StreamOptions", "CompletionRequest", "ChatMessage", "ChatCompletionRequest", "Usage", "ErrorBody",
           "error_body"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="only one choice per request is supported")
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: "StreamOptions | None" = None
    logprobs: bool | int | None = Field(None, description="not supported: only null / false / 0")
    echo: bool = Field(False, description="not supported: only false")

    @field_validator("logprobs", "echo")
    @classmethod
    def _unsupported(cls, v: object) -> object:
        if v:
            raise ValueError("is not supported by this server")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop must be up to 4 non-empty strings")
        return v

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(_Request):
    """POST /v1/completions: `prompt` is a string or a list of token ids (a batch of prompts is not supported)."""

    prompt: str | list[StrictInt]
    max_tokens: StrictInt | None = Field(16, ge=1)      # OpenAI's default for completions


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions; `max_completion_tokens` is the newer name of `max_tokens`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """{"error": {"message", "type", "param", "code"}}, OpenAI's error shape."""
    return {"error": ErrorBody(message=message, type=type, param=param, code=code).model_dump()}
