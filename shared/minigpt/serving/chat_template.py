"""A plain-text chat template for the course model (lab 08).

The course tokenizer has one special token (<|endoftext|>) and the models were trained on plain text,
so a chat is rendered as a transcript, one message per paragraph, ending with the assistant's cue:

    System: You are terse.\n\nUser: Hi!\n\nAssistant:

A `developer` message is rendered as a system one, a `tool` message (a tool's result sent back) as "Tool: ...";
content may be a string, a list of text parts ({"type": "text", "text": ...}, joined) or, for an assistant turn,
null (an empty turn). The reply is generated after "Assistant:" and stops at <|endoftext|>, at CHAT_STOP
("\n\nUser:", the model starting the next turn itself) or at max_tokens. Production models are fine-tuned on such a format with
dedicated special tokens (e.g. Llama 3's <|start_header_id|>); the engine does not care which.
"""

from __future__ import annotations

from typing import Iterable, Protocol

__all__ = ["ROLE_NAMES", "CHAT_STOP", "render_chat"]

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


def render_chat(messages: Iterable[_Message | dict]) -> str:
    """The prompt text of a conversation (messages with role and content), cueing the assistant's reply."""
    parts = []
    for m in messages:
        role, content = (m["role"], m.get("content")) if isinstance(m, dict) else (m.role, getattr(m, "content", None))
        if role not in ROLE_NAMES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(ROLE_NAMES)}")
        parts.append(f"{ROLE_NAMES[role]}: {_text(content).strip()}")
    if not parts:
        raise ValueError("a chat needs at least one message")
    return "\n\n".join(parts) + "\n\nAssistant:"
