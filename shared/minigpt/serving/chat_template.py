"""A plain-text chat template for the course model (lab 08).

The course tokenizer has one special token (<|endoftext|>) and the models were trained on plain text,
so a chat is rendered as a transcript, one message per paragraph, ending with the assistant's cue:

    System: You are terse.\n\nUser: Hi!\n\nAssistant:

The reply is generated after "Assistant:" and stops at <|endoftext|>, at CHAT_STOP ("\n\nUser:", the model
starting the next turn itself) or at max_tokens. Production models are fine-tuned on such a format with
dedicated special tokens (e.g. Llama 3's <|start_header_id|>); the engine does not care which.
"""

from __future__ import annotations

from typing import Iterable, Protocol

__all__ = ["ROLE_NAMES", "CHAT_STOP", "render_chat"]

ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant"}
CHAT_STOP = "\n\nUser:"


class _Message(Protocol):
    role: str
    content: str


def render_chat(messages: Iterable[_Message | dict]) -> str:
    """The prompt text of a conversation (messages with role and content), cueing the assistant's reply."""
    parts = []
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else (m.role, m.content)
        if role not in ROLE_NAMES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(ROLE_NAMES)}")
        parts.append(f"{ROLE_NAMES[role]}: {content.strip()}")
    if not parts:
        raise ValueError("a chat needs at least one message")
    return "\n\n".join(parts) + "\n\nAssistant:"
