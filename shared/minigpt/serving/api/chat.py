"""POST /v1/chat/completions (lab 08): the conversation rendered by `chat_template`, n choices; the reply follows
`response_format`'s grammar, or, with tools, the tool mode's (`minigpt.serving.tool_calls`: text or one call)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minigpt.serving.api.errors import ERROR_RESPONSES, BadRequest
from minigpt.serving.api.generation import ChoiceResult, Generation, chunk_maker, collect, constraint_of, \
    start_generation, stream_response
from minigpt.serving.api.logprobs import chat_logprobs
from minigpt.serving.api.schema import sse_content
from minigpt.serving.api.state import server_state
from minigpt.serving.outputs import RequestOutput
from minigpt.serving.protocol import ChatCompletionRequest, ChatCompletionResponse
from minigpt.serving.tool_calls import ToolCallReader, tool_mode

__all__ = ["router", "DEFAULT_CHAT_MAX_TOKENS"]

DEFAULT_CHAT_MAX_TOKENS = 128          # a chat request without max_tokens: at most this, within the context

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None, responses={
    200: {"model": ChatCompletionResponse, "description": "The reply (or, with stream: true, an event stream of "
          "ChatCompletionChunk)", "content": {"text/event-stream": sse_content("ChatCompletionChunk")}}, **ERROR_RESPONSES})
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = server_state(request)
    try:
        prompt = (state.chat_template.render(body.messages, body.tools) if body.tools
                  else state.chat_template.render(body.messages))
    except ValueError as err:
        raise BadRequest(str(err), "messages") from None
    mode = tool_mode(body.tools, body.tool_choice)
    constraint = await constraint_of(state, body, mode)
    context = state.core.max_model_len

    def max_tokens(ids: list[int]) -> int:
        if body.token_budget is not None:
            return body.token_budget
        return max(1, min(DEFAULT_CHAT_MAX_TOKENS, context - len(ids)))

    stop = [*body.stop_list, *state.chat_template.stop_strings]
    gen = await start_generation(state, body, [prompt], max_tokens, stop, "chatcmpl", candidates=body.num_choices,
                                 logprobs=body.num_logprobs, constraint=constraint)
    tokenizer = state.core.tokenizer

    def envelope(obj: str, choices: list[dict], usage: dict | None = None) -> dict:
        out = {"id": gen.request_id, "object": obj, "created": gen.created, "model": body.model, "choices": choices}
        return {**out, "usage": usage} if usage is not None else out

    if body.stream:
        sent_role = [False] * len(gen.request_ids)
        readers = [ToolCallReader(mode) for _ in gen.request_ids] if mode is not None else None

        def delta(i: int, out: RequestOutput) -> dict | list[dict]:
            logprobs = chat_logprobs(tokenizer, out.logprobs or []) if gen.logprobs is not None else None
            if readers is not None:
                return tool_deltas(i, out, logprobs)
            content = {"content": out.text}
            if not sent_role[i]:                       # the first chunk of each choice names the role
                content, sent_role[i] = {"role": "assistant", **content}, True
            return {"index": i, "delta": content, "logprobs": logprobs, "finish_reason": out.finish_reason}

        def tool_deltas(i: int, out: RequestOutput, logprobs: dict | None) -> list[dict]:
            """A tool mode's deltas: the role first, then text or the call (held-back text sends nothing)."""
            reader = readers[i]
            deltas = reader.feed(out.text) + (reader.close() if out.finished else [])
            if not sent_role[i]:
                deltas, sent_role[i] = [{"role": "assistant"}, *deltas], True
            if out.finished and not deltas:
                deltas = [{}]
            choices = [{"index": i, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
            if choices:
                choices[-1]["logprobs"] = logprobs
                choices[-1]["finish_reason"] = reader.finish_reason(out.finish_reason)
            return choices

        make_chunks = chunk_maker(gen, body.include_usage, delta,
                                  lambda choices, usage: envelope("chat.completion.chunk", choices, usage))
        return stream_response(state, gen, make_chunks)

    def make_response(gen: Generation, chosen: list[tuple[int, ChoiceResult]], usage: dict) -> dict:
        choices = []
        for index, r in chosen:
            message, finish_reason = {"role": "assistant", "content": "".join(r.text)}, r.finish_reason
            if mode is not None:
                reader = ToolCallReader(mode)
                reader.feed("".join(r.text))
                reader.close()
                message, finish_reason = reader.message, reader.finish_reason(r.finish_reason)
            choices.append({"index": index, "message": message, "finish_reason": finish_reason,
                            "logprobs": chat_logprobs(tokenizer, r.logprobs) if gen.logprobs is not None else None})
        return envelope("chat.completion", choices, usage)
    return await collect(request, state, gen, body.num_choices, make_response)
