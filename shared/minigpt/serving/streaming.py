"""Server-sent events for a streamed completion (lab 08, learner piece 1).

OpenAI's streaming format: one event per chunk, `data: <json>` and a blank line, and a last event
`data: [DONE]`. The handler owns the request while it streams: if the client goes away before the end,
the server cancels the generator (CancelledError / GeneratorExit at its `yield` or `await`), and the
`finally` must abort the request in the engine so that its KV blocks are freed at once, instead of
generating on for nobody until max_tokens.

    async def sse_stream(outputs, make_chunks, abort) -> AsyncIterator[str]
        outputs:     the request's RequestOutputs (AsyncLLMEngine.stream), the last with finished=True
        make_chunks: RequestOutput -> list of chunk dicts to send for it (maybe none)
        abort:       () -> None, aborts the request in the engine without waiting
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Callable

from minigpt.serving.outputs import RequestOutput

__all__ = ["sse_event", "sse_stream", "DONE_EVENT"]

DONE_EVENT = "data: [DONE]\n\n"


def sse_event(chunk: dict) -> str:
    """One server-sent event carrying a JSON chunk."""
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


async def sse_stream(outputs: AsyncIterator[RequestOutput], make_chunks: Callable[[RequestOutput], list[dict]],
                     abort: Callable[[], None]) -> AsyncIterator[str]:
    """Yield one event per chunk of every output, then [DONE]; abort the request if we stop before its end."""
    finished = False
    try:
        async for out in outputs:
            for chunk in make_chunks(out):
                yield sse_event(chunk)
            finished = out.finished
        yield DONE_EVENT
    finally:
        if not finished:
            abort()
