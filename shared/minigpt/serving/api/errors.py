"""Errors in OpenAI's body {"error": {"message", "type", "param", "code"}} and the app's exception handlers.

400 invalid request (bad JSON, a body that fails validation: FastAPI's 422 becomes 400, a prompt that does not fit
the context), 404 unknown model (code "model_not_found", as OpenAI), 405 with `Allow`, 429 with `Retry-After` when
every admission slot is taken, 500 a request the engine could not finish (its own failure), 503 engine stopped.
"""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minigpt.serving.admission import QueueFull
from minigpt.serving.protocol import ErrorResponse, error_body

__all__ = ["APIError", "BadRequest", "ModelNotFound", "EngineUnavailable", "error_response", "install_error_handlers", "ERROR_RESPONSES"]

_UNION_MEMBERS = {"system", "developer", "user", "assistant", "tool"}      # tags of the chat message union


class APIError(Exception):
    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class BadRequest(APIError):
    pass


class ModelNotFound(APIError):
    status = 404

    def __init__(self, model: str, served: list[str]) -> None:
        super().__init__(f"the model {model!r} does not exist; this server serves {served}", "model",
                         "model_not_found")


class EngineUnavailable(APIError):
    status = 503
    type = "server_error"


def error_response(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def param_name(loc: tuple) -> str | None:
    """pydantic's error location as OpenAI's `param`: ('body', 'messages', 0, 'user', 'content') ->
    'messages.0.content'; a union's member names ('prompt', 'list[int]', 0) end it -> 'prompt'."""
    parts = []
    for x in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(x, str) and x in _UNION_MEMBERS and parts and parts[-1].isdigit():
            continue
        if isinstance(x, int) or (isinstance(x, str) and x.isidentifier() and x not in ("str", "int", "float", "bool")):
            parts.append(str(x))
        else:
            break
    return ".".join(parts) or None


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    request.app.state.server.metrics.refused("invalid")
    errs = exc.errors()
    first = errs[0] if errs else {}
    if first.get("type") == "json_invalid":
        return error_response(400, f"the request body is not valid JSON: {first.get('msg', '')}",
                              "invalid_request_error", None, "invalid_json")
    param = param_name(first.get("loc", ()))
    msg = first.get("msg", "invalid")
    if first.get("type") == "union_tag_invalid":
        param = f"{param}.role" if param else "role"
    elif param == "prompt" and first.get("type") not in ("missing", "value_error"):
        msg = "the prompt must be a string, a list of strings, a list of token ids or a list of token-id lists"
    return error_response(400, f"invalid value for {param or 'the request body'}: {msg}", "invalid_request_error",
                          param, "invalid_value")


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    if exc.status < 500:
        request.app.state.server.metrics.refused("invalid")
    return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)


async def _full(request: Request, exc: QueueFull) -> JSONResponse:
    request.app.state.server.metrics.refused("rejected")
    retry = getattr(exc, "retry_after", None)
    headers = {"Retry-After": str(max(1, math.ceil(retry)))} if retry is not None else None
    return error_response(429, str(exc), "rate_limit_error", None, "queue_full", headers)


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400:                       # e.g. a body that cannot be parsed at all
        request.app.state.server.metrics.refused("invalid")
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error_response(exc.status_code, str(exc.detail), kind, None, code, headers=getattr(exc, "headers", None))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(QueueFull, _full)
    app.add_exception_handler(StarletteHTTPException, _http)


def _err(description: str, **extra: object) -> dict:
    return {"model": ErrorResponse, "description": description, **extra}


# The error statuses a generation route can answer, for its `responses=` (and /openapi.json).
ERROR_RESPONSES: dict[int | str, dict] = {
    400: _err("Invalid request: bad JSON, a field that fails validation, a prompt that does not fit the context, "
              "a response_format or tool schema that cannot be compiled, an unsupported feature (legacy functions)"),
    404: _err("Unknown model (code model_not_found)"),
    429: _err("Every admission slot is taken; retry after Retry-After seconds",
              headers={"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}}),
    500: _err("The engine could not finish this request (its own failure; other requests are unaffected)"),
    503: _err("The engine is not running (shutting down)"),
}
