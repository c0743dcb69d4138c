"""/openapi.json made exact (lab 08): what the server really accepts and answers, so a client generator or a fuzzer
(schemathesis) can be driven by it.

FastAPI's default schema documents 422 for validation errors (this server answers 400) and knows nothing of the
served models. Here: `model` in every request body is an enum of the served names (base model and adapters); token
ids (a prompt's, logit_bias's keys) are bounded by the served vocabulary;
422 and its schemas are removed (every route lists its real statuses: 400, 404, 429, 500, 503); the streamed chunk
models are published beside the responses.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from minigpt.serving.protocol import ChatCompletionChunk, CompletionChunk
from minigpt.structured.json_schema import integer_range_pattern

__all__ = ["exact_openapi", "sse_content"]

REQUEST_SCHEMAS = ("CompletionRequest", "ChatCompletionRequest")


def sse_content(chunk: str) -> dict[str, Any]:
    """The `text/event-stream` entry of a streaming route's 200: each event (OpenAPI < 3.2: `schema` describes one
    event, as schemathesis reads it) has `data` = "[DONE]" (the last) or a JSON `chunk` / an error body."""
    payload = {"anyOf": [{"$ref": f"#/components/schemas/{chunk}"}, {"$ref": "#/components/schemas/ErrorResponse"}]}
    data = {"type": "string", "if": {"const": "[DONE]"}, "then": True,
            "else": {"contentMediaType": "application/json", "contentSchema": payload}}
    return {"schema": {"type": "object", "required": ["data"], "description": f"one server-sent event: `data: <{chunk}>` "
                       "(or an error body if the engine could not finish), the last one `data: [DONE]`",
                       "properties": {"data": data, "event": {"type": "string"}}}}


def _bound_token_ids(request: dict[str, Any], vocab_size: int) -> None:
    """Token ids in [0, vocab_size): the prompt's items and logit_bias's keys (a pattern over their decimal text)."""
    props = request["properties"]
    for branch in props.get("prompt", {}).get("anyOf", []):
        items = branch.get("items", {})
        ints = items.get("items", items)
        if ints.get("type") == "integer":
            ints["maximum"] = vocab_size - 1
    for branch in props.get("logit_bias", {}).get("anyOf", []):
        if branch.get("type") == "object":
            values = next(iter(branch.pop("patternProperties").values()))
            branch["propertyNames"] = {"pattern": f"^{integer_range_pattern(0, vocab_size - 1)}$"}
            branch["additionalProperties"] = values


def exact_openapi(app: FastAPI, served_models: list[str], vocab_size: int | None = None
                  ) -> Callable[[], dict[str, Any]]:
    """A replacement for `app.openapi` (built once, then cached like FastAPI's)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name in REQUEST_SCHEMAS:
            if name in components:
                components[name]["properties"]["model"]["enum"] = list(served_models)
                if vocab_size is not None:
                    _bound_token_ids(components[name], vocab_size)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        for model in (CompletionChunk, ChatCompletionChunk):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(js.pop("$defs", {}))
            components[model.__name__] = js
        app.openapi_schema = schema
        return schema
    return openapi
