"""OpenAI-compatible request and response bodies (lab 08), as pydantic models: what /openapi.json publishes.

Requests are validated strictly (`"temperature": "0.5"` or `"stream": "yes"` are refused, as are booleans for
integers; a whole number written `2.0` is an integer, as JSON Schema says); every optional field also accepts an
explicit `null` (= its default). Unknown fields OpenAI clients send (`user`, `metadata`, ...) are ignored; features
the course model cannot honour are refused with a clear 400 rather than ignored: the legacy `functions`, `echo`,
`suffix`.

Supported: `n` choices per prompt (choice i samples with seed + i), `best_of` (completions: the n of best_of
candidates with the highest cumulative logprob), `logprobs` (completions: an int <= 5; chat: `logprobs: true` and
`top_logprobs` <= 20; log-probabilities of the raw model output, before penalties, bias, grammar, temperature and
filtering, what vLLM calls raw_logprobs), `presence_penalty` / `frequency_penalty` (in [-2, 2]) and `logit_bias`
(token id -> [-100, 100]), `prompt` as a string, a list of strings, a list of token ids or a list of token-id lists,
chat `content` as a string or a list of text parts, roles system, developer (= system), user, assistant (content
may be null, `tool_calls` given back) and tool. `top_k` is an extension, as in vLLM. Without a `seed` each request
draws a fresh one, so sampling differs from call to call.

Structured outputs (`minigpt.serving.structured_outputs`, on chat and, as vLLM, completions): `response_format`
text, json_object (any JSON object) or json_schema (what the server's backend takes, llguidance or the course's
compiler; a schema it refuses is a 400 naming the problem). Tools (chat; `minigpt.serving.tool_calls`): `tools` with
`tool_choice` none, auto, required or a named function; at most one call per reply.

Responses: `finish_reason` is "stop" or "length" (chat also "tool_calls"), OpenAI's values. A request the engine
could not finish is no choice at all: a 500 error body (non-streaming) or, in a stream, a last event
`data: {"error": {...}}` before `data: [DONE]` (vLLM's OpenAI server ends a failed stream the same way, with
`create_streaming_error_response`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

__all__ = ["StreamOptions", "CompletionRequest", "ChatCompletionRequest", "ChatMessage", "TextPart",
           "ResponseFormat", "JSONSchemaFormat", "ChatTool", "FunctionDefinition", "NamedToolChoice", "ToolCall",
           "Usage", "ErrorBody", "ErrorResponse", "error_body", "CompletionLogprobs", "CompletionChoice",
           "CompletionResponse", "CompletionChunk", "ChatLogprob", "ChatLogprobs", "ChatCompletionResponse",
           "ChatCompletionChunk", "ModelCard", "ModelList", "HealthStatus", "MAX_CHOICES", "MAX_TOOLS"]

MAX_CHOICES = 16                  # n, best_of, and prompts x n per request
MAX_COMPLETION_LOGPROBS = 5       # OpenAI's limit for the legacy completions `logprobs`
MAX_TOP_LOGPROBS = 20             # OpenAI's limit for chat `top_logprobs`
MAX_TOOLS = 128                   # OpenAI's limit for `tools`
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"      # OpenAI's rule for function (and json_schema) names
TOKEN_ID_KEY = r"^(0|[1-9][0-9]*)$"          # a logit_bias key; /openapi.json narrows it to the served vocabulary


def _whole(v: Any) -> Any:
    """2.0 is the integer 2 (JSON Schema: an integer is a number without a fraction); 2.5, "2" and true stay refused."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return v


def _whole_ids(v: Any) -> Any:
    """A prompt's token ids (a list, or a list of lists) with whole numbers written 2.0 read as integers."""
    if isinstance(v, list):
        return [_whole_ids(x) if isinstance(x, list) else _whole(x) for x in v]
    return v


WholeInt = StrictInt             # fields of this type also read 2.0 as 2 (`_Request._whole_numbers`)
INTEGER_FIELDS = ("max_tokens", "top_k", "n", "seed", "logprobs", "best_of", "top_logprobs", "max_completion_tokens")
Nat = Annotated[StrictInt, Field(ge=0)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Nat], Field(min_length=1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenIdKey = Annotated[str, Field(pattern=TOKEN_ID_KEY)]
Bias = Annotated[Finite, Field(ge=-100.0, le=100.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = False


class ResponseFormatText(_Strict):
    type: Literal["text"]


class ResponseFormatJSONObject(_Strict):
    type: Literal["json_object"] = Field(description="any JSON object")


class JSONSchemaFormat(_Strict):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description=(
        "a JSON Schema the server's structured-outputs backend takes (one it refuses is a 400 naming the keyword); "
        "absent: any JSON value"))
    strict: bool | None = Field(None, description="outputs always follow the schema here, strict or not")


class ResponseFormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = Annotated[Union[ResponseFormatText, ResponseFormatJSONObject, ResponseFormatJSONSchema],
                           Field(discriminator="type")]


class _Request(_Strict):
    model: str = Field(description="a served model: the base model or one of its LoRA adapters (GET /v1/models)")
    max_tokens: WholeInt | None = Field(None, ge=1)
    temperature: Finite | None = Field(None, ge=0.0, le=2.0, description="default 1; 0 (or a value so small that "
                                       "it is its limit) is greedy")
    top_p: Finite | None = Field(None, gt=0.0, le=1.0, description="default 1 (no nucleus filtering)")
    top_k: WholeInt | None = Field(None, ge=1, description="an extension (vLLM's): keep the k most likely tokens")
    n: WholeInt | None = Field(None, ge=1, le=MAX_CHOICES, description="choices per prompt (default 1)")
    seed: WholeInt | None = Field(None, ge=0, description="default: a fresh seed per request; any integer >= 0 "
                                  "(taken modulo 2^63: a bound at 2^63 reads as a float in JSON tools and is blurred)")
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=4)] | None = Field(
        None, description="up to 4 non-empty strings")
    presence_penalty: Finite | None = Field(None, ge=-2.0, le=2.0, description="logits[j] -= p if token j was "
                                            "generated (in this choice)")
    frequency_penalty: Finite | None = Field(None, ge=-2.0, le=2.0, description="logits[j] -= f * (times token j "
                                             "was generated in this choice)")
    logit_bias: dict[TokenIdKey, Bias] | None = Field(None, description="token id (a string, inside the vocabulary) -> a bias in [-100, 100] added to "
                                  "its logit")
    response_format: ResponseFormat | None = Field(None, description="text (default), json_object or json_schema: "
                                                   "the output is constrained to it")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator(*INTEGER_FIELDS, mode="before", check_fields=False)
    @classmethod
    def _whole_numbers(cls, v: Any) -> Any:
        return _whole(v)

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        stops = [v] if isinstance(v, str) else v if isinstance(v, list) else []
        if len(stops) > 4 or any(s == "" for s in stops):
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

    @property
    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs."""
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())


def _refuse(what: str) -> ValueError:
    return ValueError(f"{what} is not supported by this server")


class CompletionRequest(_Request):
    """POST /v1/completions."""

    prompt: NonEmptyStr | Annotated[list[NonEmptyStr], Field(min_length=1)] | TokenIds | \
        Annotated[list[TokenIds], Field(min_length=1)] = Field(
            description="a string, a list of strings, a list of token ids, or a list of token-id lists (one "
                        "completion per prompt, n choices each); none of them empty")
    max_tokens: WholeInt | None = Field(16, ge=1, description="default 16 (OpenAI's, for completions)")
    logprobs: WholeInt | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS,
                                      description="the sampled tokens' logprobs and this many alternatives each")
    best_of: WholeInt | None = Field(None, ge=1, le=MAX_CHOICES,
                                     description="candidates per prompt; the n with the highest cumulative logprob "
                                                 "are returned (not with stream)")
    echo: Literal[False] | None = Field(None, description="not supported: only false")
    suffix: None = Field(None, description="not supported: only null")

    @field_validator("echo", mode="before")
    @classmethod
    def _echo_false(cls, v: Any) -> Any:
        if v is not None and v is not False:          # Literal[False] alone would take 0 (0 == False in Python)
            raise ValueError("echo is not supported: only false")
        return v

    @field_validator("prompt", mode="before")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if v == "" or v == [] or (isinstance(v, list) and any(isinstance(p, (str, list)) and not p for p in v)):
            raise ValueError("the prompt must not be empty (nor any prompt of a list)")
        return _whole_ids(v)

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


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(description="the arguments as a JSON text")


class ToolCall(_Strict):
    """A tool call, in an assistant message given back (and, in the same shape, in a reply)."""
    id: str
    type: Literal["function"]
    function: FunctionCall


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
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


ChatMessage = Annotated[Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage],
                        Field(discriminator="role")]


class FunctionDefinition(_Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description=(
        "its arguments' JSON Schema (what the server's structured-outputs backend takes; absent: no arguments)"))
    strict: bool | None = Field(None, description="arguments always follow the schema here, strict or not")


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


# The published schema says what the validators below enforce (schemathesis generates from it): top_logprobs only
# with logprobs: true; tool_choice "required" or a named function only with tools.
_CHAT_RULES = {"allOf": [
    {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
     "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
    {"if": {"required": ["tool_choice"], "properties": {"tool_choice": {"anyOf": [{"const": "required"},
                                                                                  {"type": "object"}]}}},
     "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}},
]}


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions; `max_completion_tokens` is the newer name of `max_tokens`."""

    model_config = ConfigDict(extra="ignore", strict=True, json_schema_extra=_CHAT_RULES)

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: WholeInt | None = Field(None, ge=1)
    logprobs: bool | None = Field(None, description="return the sampled tokens' logprobs")
    top_logprobs: WholeInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                          description="alternatives per token (needs logprobs: true)")
    tools: list[ChatTool] | None = Field(None, max_length=MAX_TOOLS, description="functions the model may call "
                                         "(names unique)")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(None, description=(
        "none: text; auto (the default with tools): text or one call; required: one call to some tool; a named "
        "function (one of `tools`): one call to it"))
    parallel_tool_calls: bool | None = Field(None, description="accepted; a reply makes at most one call")
    functions: list[Any] | None = Field(None, description="not supported (the legacy form): use tools",
                                        json_schema_extra={"maxItems": 0})

    @field_validator("functions", mode="before")
    @classmethod
    def _no_functions(cls, v: Any) -> Any:
        if v:
            raise _refuse("the legacy `functions` (use `tools` and `tool_choice`)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        choice = self.tool_choice
        if (choice == "required" or isinstance(choice, NamedToolChoice)) and not names:
            raise ValueError("tool_choice 'required' or a named function needs `tools`")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names the function {choice.function.name!r}, which is not in tools "
                             f"({names})")
        if self.calls_tools and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("response_format json_object / json_schema together with tools is not supported "
                             "(use tool_choice none, or leave response_format out)")
        return self

    @property
    def calls_tools(self) -> bool:
        """Whether the reply may be a tool call (tools given and tool_choice not none)."""
        return bool(self.tools) and self.tool_choice != "none"

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
ChatFinishReason = Literal["stop", "length", "tool_calls"]


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
    content: str | None = Field(description="the reply's text; null when it is a tool call")
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantReply
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A piece of a streamed tool call: the first names it (id, type, function.name), the others add arguments."""
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinishReason | None


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
