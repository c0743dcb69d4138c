"""A plain-text chat template for the course model (lab 08).

The course tokenizer has one special token (<|endoftext|>) and the models were trained on plain text,
so a chat is rendered as a transcript, one message per paragraph, ending with the assistant's cue:

    System: You are terse.\n\nUser: Hi!\n\nAssistant:

A `developer` message is rendered as a system one, a `tool` message (a tool's result sent back) as "Tool: ...";
content may be a string, a list of text parts ({"type": "text", "text": ...}, joined) or, for an assistant turn,
null (an empty turn). Tools (`render(messages, tools)`, OpenAI's function definitions) open the transcript with one
"Tools:" paragraph, a line per function with its JSON argument schema; an assistant turn's `tool_calls` are written
after its text as the call objects a reply in a tool mode is made of (`{"name":...,"arguments":...}`, see
`minigpt.serving.tool_calls`). Without tools or calls the transcript is unchanged. The reply is generated after "Assistant:" and stops at <|endoftext|>, at CHAT_STOP
("\n\nUser:", the model starting the next turn itself) or at max_tokens. Production models are fine-tuned on such a format with
dedicated special tokens (e.g. Llama 3's <|start_header_id|>); the engine does not care which.

An imported Hugging Face model brings its own template (tokenizer_config.json's `chat_template` or
chat_template.jinja), rendered with jinja2 in a sandbox as transformers' `apply_chat_template` does:
`chat_template_for(tokenizer)` returns `jinja_chat_template(...)` for it and `PLAIN_CHAT` (the transcript above)
for the course tokenizer. Its replies end at the model's end-of-turn token (an EOS id), so it needs no
stop string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

__all__ = ["ROLE_NAMES", "CHAT_STOP", "render_chat", "ChatTemplate", "PLAIN_CHAT", "jinja_chat_template",
           "chat_template_for"]

ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
CHAT_STOP = "\n\nUser:"


class _Message(Protocol):
    role: str
    content: object


def _text(content: object) -> str:
    """A message's content as text: a string, a list of text parts (objects or dicts), or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p["text"] if isinstance(p, dict) else p.text for p in content)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _as_plain(obj: Any) -> Any:
    """A pydantic model as a dict (by alias), anything else as it is."""
    return obj.model_dump(by_alias=True, exclude_none=True) if hasattr(obj, "model_dump") else obj


def _tools_paragraph(tools: Sequence[Any]) -> str:
    lines = ['Tools (to call one, answer {"name": <its name>, "arguments": <its arguments>}):']
    for tool in tools:
        fn = _as_plain(_field(tool, "function") or tool)
        description = f" {fn['description'].strip()}" if fn.get("description") else ""
        arguments = json.dumps(fn.get("parameters") or {}, separators=(",", ":"), ensure_ascii=False)
        lines.append(f"- {fn['name']}:{description} Arguments: {arguments}")
    return "\n".join(lines)


def _calls_text(calls: Sequence[Any] | None) -> str:
    """An assistant turn's tool calls as the call objects a reply is made of, one per line."""
    out = []
    for call in calls or []:
        fn = _as_plain(_field(call, "function"))
        out.append('{"name":' + json.dumps(fn["name"], ensure_ascii=False) + ',"arguments":' + fn["arguments"] + "}")
    return "\n".join(out)


def render_chat(messages: Iterable[_Message | dict], tools: Sequence[Any] | None = None) -> str:
    """The prompt text of a conversation (messages with role and content; `tools`: function definitions the
    assistant may call), cueing the assistant's reply."""
    parts = [_tools_paragraph(tools)] if tools else []
    for m in messages:
        role, content = _field(m, "role"), _field(m, "content")
        if role not in ROLE_NAMES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(ROLE_NAMES)}")
        text = _text(content).strip()
        if calls := _calls_text(_field(m, "tool_calls")):
            text = f"{text}\n{calls}" if text else calls
        parts.append(f"{ROLE_NAMES[role]}: {text}")
    if len(parts) == bool(tools):
        raise ValueError("a chat needs at least one message")
    return "\n\n".join(parts) + "\n\nAssistant:"


def _as_dicts(messages: Iterable[_Message | dict]) -> list[dict[str, Any]]:
    """Messages as the dicts HF templates read: role and content text, plus tool_calls / tool_call_id if any."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": _field(m, "role"), "content": _text(_field(m, "content"))}
        if calls := _field(m, "tool_calls"):
            d["tool_calls"] = [_as_plain(c) for c in calls]
        if call_id := _field(m, "tool_call_id"):
            d["tool_call_id"] = call_id
        out.append(d)
    if not out:
        raise ValueError("a chat needs at least one message")
    return out


@dataclass(frozen=True)
class ChatTemplate:
    """How the server turns chat messages into prompt text, and the stop strings that end a reply."""

    render: Callable[..., str]          # render(messages) or render(messages, tools)
    stop_strings: tuple[str, ...] = ()


PLAIN_CHAT = ChatTemplate(render_chat, (CHAT_STOP,))


def jinja_chat_template(source: str, *, bos_token: str | None = None, eos_token: str | None = None) -> ChatTemplate:
    """A Hugging Face chat template (jinja2 source), rendered with add_generation_prompt=True.

    A leading BOS the template writes is dropped from the text, since the tokenizer adds it when encoding."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)
    bos = bos_token or ""

    def render(messages: Iterable[_Message | dict], tools: Sequence[Any] | None = None) -> str:
        extra = {"tools": [_as_plain(t) for t in tools]} if tools else {}
        try:
            text = template.render(messages=_as_dicts(messages), add_generation_prompt=True, bos_token=bos,
                                   eos_token=eos_token or "", **extra)
        except TemplateError as err:               # the template refuses the conversation (e.g. roles out of order)
            raise ValueError(f"the model's chat template refused the messages: {err}") from None
        return text[len(bos):] if bos and text.startswith(bos) else text

    return ChatTemplate(render, ())


def chat_template_for(tokenizer: Any | None) -> ChatTemplate:
    """The template of the model the tokenizer belongs to: its own HF template if it has one, else PLAIN_CHAT."""
    source = getattr(tokenizer, "chat_template", None)
    if not source:
        return PLAIN_CHAT
    return jinja_chat_template(source, bos_token=getattr(tokenizer, "bos_token", None),
                             eos_token=getattr(tokenizer, "eos_token", None))
