"""The router (lab 08): one OpenAI-compatible address in front of several engine replicas.

For each POST /v1/completions or /v1/chat/completions the router tokenizes the prompt (the course
tokenizer; chat messages through the server's chat template), asks the routing policy for a replica
(`routing.route`: prefix affinity on a hash ring, or `routing.RoundRobin`), and forwards the request
body unchanged with httpx. Streams pass through chunk by chunk; a client that disconnects closes the
upstream stream, so the replica aborts the request and frees its blocks. The replica's reply comes
back as is (status, body), with an `x-routed-to` header naming the replica.

GET /v1/models (the first replica's), GET /health, GET /stats (JSON: policy, requests and errors per replica) and GET /metrics
(Prometheus: `router_requests_total{replica}`, `router_errors_total{replica}`).

    python -m minigpt.serving.router --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002 \\
        --policy prefix --port 8000
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any, AsyncIterator, Callable, Sequence

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from minigpt.serving.chat_template import render_chat
from minigpt.serving.load_generator import check_loopback
from minigpt.serving.routing import RoundRobin, route

__all__ = ["create_router_app", "prompt_token_ids", "make_policy", "main"]

Policy = Callable[..., str]
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


def make_policy(policy: str | Policy) -> Policy:
    """"prefix" -> routing.route, "round_robin" -> a fresh RoundRobin; a callable is used as given (same signature
    as route: (prompt_token_ids, replicas, *, block_size, prefix_blocks) -> replica)."""
    if callable(policy):
        return policy
    if policy == "prefix":
        return route
    if policy == "round_robin":
        return RoundRobin()
    raise ValueError(f"unknown routing policy {policy!r}: use 'prefix', 'round_robin' or a function")


def prompt_token_ids(body: dict[str, Any], chat: bool) -> list[int]:
    """The token ids the replica will see first: the prompt (text or ids), or the chat-templated messages."""
    from minigpt.tokenizer import load_tokenizer

    enc = load_tokenizer()
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ValueError("'messages' must be a list of {role, content} objects")
        return enc.encode(render_chat(messages), disallowed_special=())
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return enc.encode(prompt, disallowed_special=())
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise ValueError("'prompt' must be a string or a list of token ids")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status)


def create_router_app(replicas: Sequence[str], *, policy: str | Policy = "prefix", block_size: int = 16,
                      prefix_blocks: int = 4, timeout: float = 300.0) -> FastAPI:
    """A FastAPI router in front of `replicas` (base URLs on loopback) with the given routing policy."""
    replicas = [check_loopback(r) for r in replicas]
    if not replicas or len(set(replicas)) != len(replicas):
        raise ValueError(f"need at least one replica, all distinct; got {replicas}")
    choose = make_policy(policy)
    policy_name = policy if isinstance(policy, str) else getattr(policy, "__name__", "custom")
    registry = CollectorRegistry()
    requests_total = Counter("router_requests", "Requests forwarded, by replica", ["replica"], registry=registry)
    errors_total = Counter("router_errors", "Requests whose replica failed or answered >= 400, by replica",
                           ["replica"], registry=registry)
    counts = {r: {"requests": 0, "errors": 0} for r in replicas}
    state: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), trust_env=False,
                                     limits=httpx.Limits(max_connections=256)) as client:
            state["client"] = client
            yield

    app = FastAPI(lifespan=lifespan)

    def failed(replica: str) -> None:
        counts[replica]["errors"] += 1
        errors_total.labels(replica).inc()

    async def forward(request: Request, path: str, chat: bool) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            ids = prompt_token_ids(body, chat)
        except (ValueError, TypeError, KeyError, AttributeError) as err:     # JSONDecodeError is a ValueError
            return _error(400, f"could not route the request: {type(err).__name__}: {err}")
        try:
            replica = choose(ids, list(replicas), block_size=block_size, prefix_blocks=prefix_blocks)
        except Exception as err:              # a broken policy must not take the router down
            return _error(500, f"the routing policy raised {type(err).__name__}: {err}", "server_error")
        if replica not in counts:
            return _error(500, f"the routing policy returned {replica!r}, which is not one of {replicas}",
                          "server_error")
        counts[replica]["requests"] += 1
        requests_total.labels(replica).inc()
        client = state["client"]
        upstream = client.build_request("POST", replica + path, content=raw,
                                        headers={"content-type": "application/json"})
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as err:
            failed(replica)
            return _error(502, f"replica {replica} did not answer: {type(err).__name__}: {err}", "server_error")
        if response.status_code >= 400:
            failed(replica)
        headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS}
        headers["x-routed-to"] = replica
        if not body.get("stream"):
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            return Response(content, status_code=response.status_code, headers=headers)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in response.aiter_raw():
                    yield piece
            except httpx.HTTPError:
                failed(replica)
            finally:                          # also when our client went away: the replica sees the disconnect
                await response.aclose()

        return StreamingResponse(relay(), status_code=response.status_code, headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models() -> Response:
        """The replicas serve the same models: the first replica's list."""
        try:
            r = await state["client"].get(replicas[0] + "/v1/models")
        except httpx.HTTPError as err:
            return _error(502, f"replica {replicas[0]} did not answer: {type(err).__name__}: {err}", "server_error")
        return Response(r.content, status_code=r.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {"policy": policy_name, "replicas": {r: dict(c) for r, c in counts.items()}}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minigpt.serving.router",
                                     description="Route OpenAI-compatible requests to engine replicas.")
    parser.add_argument("--replica", action="append", required=True, help="a replica's base URL (repeat)")
    parser.add_argument("--policy", choices=["prefix", "round_robin"], default="prefix")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prefix-blocks", type=int, default=4)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    check_loopback(f"http://{args.host}")
    import uvicorn

    app = create_router_app(args.replica, policy=args.policy, block_size=args.block_size,
                            prefix_blocks=args.prefix_blocks)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
