"""OpenAI-compatible request and response bodies (lab 08), as pydantic models: what /openapi.json publishes.

Requests are validated strictly (`"temperature": "0.5"` or `"stream": "yes"` are refused, as are booleans for
integers); every optional field also accepts an explicit `null` (= its default). Unknown fields OpenAI clients send
(`user`, `metadata`, ...) are ignored; features the course model cannot honour are refused with a clear 400 rather
than ignored: `tools` / `functions`, a `response_format` other than text, `echo`, `suffix`.

Supported: `n` choices per prompt (choice i samples with seed + i), `best_of` (completions: the n of best_of
candidates with the highest cumulative logprob), `logprobs` (completions: an int <= 5; chat: `logprobs: true` and
`top_logprobs` <= 20; log-probabilities of the raw model output, before temperature and filtering, what vLLM
calls raw_logprobs), `prompt` as a string, a list of strings, a list of token ids or a list of token-id lists, chat
`content` as a string or a list of text parts, roles system, developer (= system), user, assistant (content may be
null) and tool. `top_k` is an extension, as in vLLM. Without a `seed` each request draws a fresh one, so sampling differs from call to call.

Responses: `finish_reason` is "stop" or "length", OpenAI's values. A request the engine could not finish is no
choice at all: a 500 error body (non-streaming) or, in a stream, a last event `data: {"error": {...}}` before
`data: [DONE]` (vLLM's OpenAI server ends a failed stream the same way, with `create_streaming_error_response`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

__all__ = ["StreamOptions", "CompletionRequest", "ChatCompletionRequest", "ChatMessage", "TextPart",
           "Usage", "ErrorBody", "ErrorResponse", "error_body", "CompletionLogprobs", "CompletionChoice",
           "CompletionResponse", "CompletionChunk", "ChatLogprob", "ChatLogprobs", "ChatCompletionResponse",
           "ChatCompletionChunk", "ModelCard", "ModelList", "HealthStatus", "MAX_CHOICES"]

MAX_CHOICES = 16                  # n, best_of, and prompts x n per request
MAX_COMPLETION_LOGPROBS = 5       # OpenAI's limit for the legacy completions `logprobs`
MAX_TOP_LOGPROBS = 20             # OpenAI's limit for chat `top_logprobs`
Nat = Annotated[StrictInt, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = False


class _Request(_Strict):
    model: str = Field(description="a served model: the base model or one of its LoRA adapters (GET /v1/models)")
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="default 1; 0 (or a value so small that "
                                      "it is its limit) is greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="default 1 (no nucleus filtering)")
    top_k: StrictInt | None = Field(None, ge=1, description="an extension (vLLM's): keep the k most likely tokens")
    n: StrictInt | None = Field(None, ge=1, le=MAX_CHOICES, description="choices per prompt (default 1)")
    seed: StrictInt | None = Field(None, ge=0, lt=2**63, description="default: a fresh seed per request")
    stop: str | list[str] | None = Field(None, description="up to 4 non-empty strings")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

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

    @property
    def num_choices(self) -> int:
        return self.n or 1


def _refuse(what: str) -> ValueError:
    return ValueError(f"{what} is not supported by this server")


class CompletionRequest(_Request):
    """POST /v1/completions."""

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(
        description="a string, a list of strings, a list of token ids, or a list of token-id lists (one completion "
                    "per prompt, n choices each)")
    max_tokens: StrictInt | None = Field(16, ge=1, description="default 16 (OpenAI's, for completions)")
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS,
                                       description="the sampled tokens' logprobs and this many alternatives each")
    best_of: StrictInt | None = Field(None, ge=1, le=MAX_CHOICES,
                                      description="candidates per prompt; the n with the highest cumulative logprob "
                                                  "are returned (not with stream)")
    echo: Literal[False] | None = Field(None, description="not supported: only false")
    suffix: None = Field(None, description="not supported: only null")

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or any(isinstance(p, (str, list)) and not p for p in v)):
            raise ValueError("the prompt must not be empty (nor any prompt of a list)")
        if isinstance(v, str) and not v:
            raise ValueError("the prompt must not be empty")
        return v

    @model_validator(mode="after")
    def _choices(self) -> "CompletionRequest":
        if self.best_of is not None:
            if self.best_of < self.num_choices:
                raise ValueError(f"best_of ({self.best_of}) must be >= n ({self.num_choices})")
            if self.stream and self.best_of > 1:
                raise ValueError("best_of > 1 cannot be streamed (the best candidates are known only at the end)")
        if len(self.prompts) * self.num_candidates > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} completions per request (prompts x max(n, best_of))")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: one string or one token-id list each."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)

    @property
    def num_candidates(self) -> int:
        return max(self.num_choices, self.best_of or 1)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


Content = Union[str, list[TextPart]]


class _Message(_Strict):
    name: str | None = None

    @property
    def text(self) -> str:
        content = getattr(self, "content", None)
        if content is None:
            return ""
        return content if isinstance(content, str) else "".join(p.text for p in content)


class SystemMessage(_Message):
    role: Literal["system"]
    content: Content


class DeveloperMessage(_Message):
    role: Literal["developer"]
    content: Content


class UserMessage(_Message):
    role: Literal["user"]
    content: Content


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: Content | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


ChatMessage = Annotated[Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage],
                        Field(discriminator="role")]


class ResponseFormat(_Strict):
    type: Literal["text"] = Field(description="only plain text: json_object / json_schema are refused")


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions; `max_completion_tokens` is the newer name of `max_tokens`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: bool | None = Field(None, description="return the sampled tokens' logprobs")
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                           description="alternatives per token (needs logprobs: true)")
    tools: list[Any] | None = Field(None, description="not supported: the course model cannot call tools",
                                    json_schema_extra={"maxItems": 0})
    functions: list[Any] | None = Field(None, description="not supported", json_schema_extra={"maxItems": 0})
    tool_choice: Literal["none"] | None = Field(None, description="not supported: only none")
    response_format: ResponseFormat | None = None

    @field_validator("tools", "functions", mode="before")
    @classmethod
    def _no_tools(cls, v: Any) -> Any:
        if v:
            raise _refuse("tool calling (`tools`, `functions`)")
        return v

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _no_tool_choice(cls, v: Any) -> Any:
        if v is not None and v != "none":
            raise _refuse("tool calling (`tool_choice`)")
        return v

    @field_validator("response_format", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("type") != "text":
            raise _refuse(f"response_format {v.get('type')!r} (only plain text)")
        return v

    @model_validator(mode="after")
    def _logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """None (no logprobs) or how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


# --- responses ------------------------------------------------------------------------------------

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


FinishReason = Literal["stop", "length"]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(BaseModel):
    """One `data:` event of a streamed completion (the last may carry only `usage`, with no choices)."""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatLogprob] | None


class AssistantReply(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantReply
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class HealthStatus(BaseModel):
    status: Literal["ok"]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """{"error": {"message", "type", "param", "code"}}, OpenAI's error shape."""
    return {"error": ErrorBody(message=message, type=type, param=param, code=code).model_dump()}
