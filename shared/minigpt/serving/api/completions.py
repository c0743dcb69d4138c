"""POST /v1/completions (lab 08): text completion of one prompt or a list of prompts, n choices each; with a
`response_format` (json_object, json_schema: accepted here too, as vLLM does) each completion follows its grammar."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minigpt.serving.api.errors import ERROR_RESPONSES
from minigpt.serving.api.generation import ChoiceResult, Generation, chunk_maker, collect, constraint_of, \
    start_generation, stream_response
from minigpt.serving.api.logprobs import completion_logprobs
from minigpt.serving.api.schema import sse_content
from minigpt.serving.api.state import server_state
from minigpt.serving.outputs import RequestOutput
from minigpt.serving.protocol import CompletionRequest, CompletionResponse

__all__ = ["router"]

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=None, responses={
    200: {"model": CompletionResponse, "description": "The completion (or, with stream: true, an event stream of "
          "CompletionChunk)", "content": {"text/event-stream": sse_content("CompletionChunk")}}, **ERROR_RESPONSES})
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state = server_state(request)
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    constraint = await constraint_of(state, body)
    gen = await start_generation(state, body, body.prompts, lambda ids: max_tokens, body.stop_list, "cmpl",
                                 candidates=body.num_candidates, logprobs=body.logprobs,
                                 rank=body.num_candidates > body.num_choices, constraint=constraint)
    tokenizer = state.core.tokenizer

    def chunk(choices: list[dict], usage: dict | None = None) -> dict:
        out = {"id": gen.request_id, "object": "text_completion", "created": gen.created, "model": body.model,
               "choices": choices}
        return {**out, "usage": usage} if usage is not None else out

    if body.stream:
        offsets = [0] * len(gen.request_ids)          # each choice's text offset, for its logprobs' text_offset

        def text(i: int, out: RequestOutput) -> dict:
            logprobs = None
            if gen.logprobs is not None:
                logprobs, offsets[i] = completion_logprobs(tokenizer, out.logprobs or [], offsets[i])
            return {"index": i, "text": out.text, "logprobs": logprobs, "finish_reason": out.finish_reason}

        make_chunks = chunk_maker(gen, body.include_usage, text, chunk)
        return stream_response(state, gen, make_chunks)

    def make_response(gen: Generation, chosen: list[tuple[int, ChoiceResult]], usage: dict) -> dict:
        choices = []
        for index, r in chosen:
            logprobs = completion_logprobs(tokenizer, r.logprobs)[0] if gen.logprobs is not None else None
            choices.append({"index": index, "text": "".join(r.text), "logprobs": logprobs,
                            "finish_reason": r.finish_reason})
        return chunk(choices, usage)
    return await collect(request, state, gen, body.num_choices, make_response)
