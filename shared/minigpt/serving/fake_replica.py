"""A fake OpenAI-compatible replica (lab 08): no model, deterministic, for fast router and load-generator tests.

It answers POST /v1/completions and /v1/chat/completions (streaming or not, OpenAI's shapes, usage,
`data: [DONE]`) with `max_tokens` tokens " t0 t1 ...", GET /v1/models ("fake"), GET /health, and GET /stats with its counts.
Every response names the replica in `system_fingerprint`, so a test behind a router sees who served it.

It also simulates a prefix cache, so routing policies can be compared in milliseconds: the chained
hashes of the prompt's full blocks (`block_hashes`, course tokenizer) are remembered, and a request's
hit blocks are the longest run of them already seen. `prefill_delay` seconds per UNCACHED prompt token
delay the first token, `token_delay` seconds separate later tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from minigpt.cache.prefix_cache import block_hashes
from minigpt.serving.chat_template import render_chat

__all__ = ["create_fake_app"]


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    """The prompt as the real server sees it: the text, or the messages through the server's chat template."""
    if chat:
        return render_chat(body.get("messages") or [])
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def create_fake_app(name: str, *, token_delay: float = 0.0, prefill_delay: float = 0.0,
                    block_size: int = 16) -> FastAPI:
    """A fake replica called `name` (see the module docstring)."""
    from minigpt.tokenizer import load_tokenizer

    enc = load_tokenizer()
    app = FastAPI()
    seen: set[int] = set()
    stats = {"name": name, "requests": 0, "prompt_tokens": 0, "prefix_hit_tokens": 0, "running": 0}

    async def handle(request: Request, chat: bool) -> Any:
        try:
            body = await request.json()
            ids = enc.encode(_prompt_text(body, chat), disallowed_special=())
        except (ValueError, TypeError, AttributeError, KeyError) as err:
            return JSONResponse({"error": {"message": f"bad request: {err}", "type": "invalid_request_error",
                                           "param": None, "code": None}}, status_code=400)
        hashes = block_hashes(ids, block_size)
        hits = 0
        while hits < len(hashes) and hashes[hits] in seen:
            hits += 1
        seen.update(hashes)
        stats["requests"] += 1
        stats["prompt_tokens"] += len(ids)
        stats["prefix_hit_tokens"] += hits * block_size
        n = int(body.get("max_tokens") or 16)
        pieces = [f" t{i}" for i in range(n)]
        usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
        kind = "chat.completion" if chat else "text_completion"
        rid = f"{name}-{stats['requests']}"
        prefill = prefill_delay * (len(ids) - hits * block_size)

        def chunk(piece: str | None, finish: str | None) -> dict[str, Any]:
            choice = ({"index": 0, "delta": {"content": piece} if piece is not None else {}, "finish_reason": finish}
                      if chat else {"index": 0, "text": piece or "", "finish_reason": finish})
            return {"id": rid, "object": kind + (".chunk" if chat else ""), "created": int(time.time()),
                    "model": body.get("model", "fake"), "system_fingerprint": name, "choices": [choice]}

        if not body.get("stream"):
            stats["running"] += 1
            try:
                await asyncio.sleep(prefill + token_delay * max(0, n - 1))
            finally:
                stats["running"] -= 1
            text = "".join(pieces)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            return {"id": rid, "object": kind, "created": int(time.time()), "model": body.get("model", "fake"),
                    "system_fingerprint": name, "choices": [choice], "usage": usage}

        async def events() -> AsyncIterator[str]:
            stats["running"] += 1
            try:
                await asyncio.sleep(prefill)
                for i, piece in enumerate(pieces):
                    if i:
                        await asyncio.sleep(token_delay)
                    yield f"data: {json.dumps(chunk(piece, 'length' if i == n - 1 else None))}\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    last = chunk(None, None) | {"choices": [], "usage": usage}
                    yield f"data: {json.dumps(last)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                stats["running"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await handle(request, chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": name}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    async def get_stats() -> dict[str, Any]:
        hit = stats["prefix_hit_tokens"] / stats["prompt_tokens"] if stats["prompt_tokens"] else 0.0
        return stats | {"prefix_cache_hit_rate": hit}

    return app
