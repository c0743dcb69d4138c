"""Tool calls in the chat server (lab 08): what `tool_choice` constrains the reply to, and how the generated text
becomes OpenAI's `tool_calls`, whole or streamed.

The course model was never trained on a tool-call format (no special token announces a call), so a call is a
grammar's choice, and the rule for each `tool_choice` is:

* "none" (or no tools): free text, as without tools (the tools are still shown in the prompt);
* a named function `{"type": "function", "function": {"name": f}}`: the reply is f's arguments, constrained to its
  `parameters` schema, returned as one call of f;
* "required": the reply is `{"name":<a tool's name>,"arguments":<that tool's arguments>}`: one alternative per tool
  (its name as a constant, then its own schema), turned into one call;
* "auto" (the default with tools): the grammar allows either that call object or free text that does not start with
  "{": the model decides with its first token ("{" = a call). A small model rarely opens with "{", so auto mostly
  answers in text; that is its honest choice, not a rule of this server.

A reply is one call at most (`parallel_tool_calls` is accepted, and one call satisfies it). A call's reply has
`content: null`, `tool_calls: [{"id": "call_...", "type": "function", "function": {"name", "arguments": "<JSON>"}}]`
and finish_reason "tool_calls" ("length" if max_tokens cut it: its arguments are then the unfinished JSON). Streamed,
as OpenAI streams them: a delta with the role, a delta naming the call (`index` 0, `id`, `type`, `function.name`,
`arguments` ""), then deltas with pieces of `function.arguments`, the finish_reason in the last chunk.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from minigpt.serving.llguidance_backend import json_schema_grammar, lark_grammar, lark_json
from minigpt.serving.structured_outputs import check_schema_budget
from minigpt.structured.grammar import CharSet, Grammar, literal
from minigpt.structured.json_schema import compile_json_schema

__all__ = ["ToolMode", "tool_mode", "call_grammar", "call_lark", "call_prefix", "ToolCallReader", "new_call_id"]

NO_ARGUMENTS = {"type": "object", "properties": {}}       # a function without `parameters`


@dataclass(frozen=True)
class ToolMode:
    """How a request's reply may call its tools: `kind` and the candidate tools' (name, parameters schema)."""

    kind: Literal["named", "required", "auto"]
    tools: tuple[tuple[str, Any], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.tools]

    @property
    def cache_key(self) -> str:
        return json.dumps([self.kind, self.tools], separators=(",", ":"), ensure_ascii=False)


def tool_mode(tools: Sequence[Any] | None, tool_choice: Any) -> ToolMode | None:
    """The mode of a validated chat request's `tools` / `tool_choice` (None: free text)."""
    if not tools or tool_choice == "none":
        return None
    defs = tuple((t.function.name, t.function.parameters if t.function.parameters is not None else NO_ARGUMENTS)
                 for t in tools)
    if tool_choice is None or tool_choice == "auto":
        return ToolMode("auto", defs)
    if tool_choice == "required":
        return ToolMode("required", defs)
    return ToolMode("named", tuple(d for d in defs if d[0] == tool_choice.function.name))


def call_prefix(name: str) -> str:
    """What a call object starts with, up to its arguments (the grammar writes compact JSON, name first)."""
    return '{"name":' + json.dumps(name, ensure_ascii=False) + ',"arguments":'


def _parameters_grammar(name: str, schema: Any) -> Grammar:
    try:
        check_schema_budget(schema, "parameters")
        return compile_json_schema(schema)
    except ValueError as err:
        raise ValueError(f"the parameters of tool {name!r} cannot be used: {err}") from None


def _renamed(grammar: Grammar, prefix: str) -> dict[str, list[tuple]]:
    """`grammar`'s rules with every rule name prefixed, so that several grammars can live in one."""
    def rename(symbol: Any) -> Any:
        return prefix + symbol if isinstance(symbol, str) and len(symbol) > 1 else symbol
    return {prefix + rule: [tuple(rename(s) for s in alt) for alt in alts] for rule, alts in grammar.rules.items()}


def call_grammar(mode: ToolMode) -> Grammar:
    """The grammar of a reply in `mode` (ValueError naming the tool whose parameters do not compile)."""
    if mode.kind == "named":
        return _parameters_grammar(*mode.tools[0])
    grammar = Grammar("reply")
    calls = []
    for i, (name, schema) in enumerate(mode.tools):
        part = _parameters_grammar(name, schema)
        grammar.rules.update(_renamed(part, f"tool{i}:"))
        calls.append([*literal(call_prefix(name)), f"tool{i}:{part.start}", "}"])
    if mode.kind == "auto":                              # or free text that does not open with "{"
        grammar.rule("text.rest", [CharSet.but(()), "text.rest"], [])
        calls += [[CharSet.but("{"), "text.rest"], []]
    grammar.rule("reply", *calls)
    grammar.check()
    return grammar


def _parameters_json(name: str, schema: Any) -> str:
    """llguidance's grammar of a tool's arguments (ValueError naming the tool if llguidance refuses its schema)."""
    import llguidance

    try:
        grammar = json_schema_grammar(schema)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ValueError("the llguidance backend refuses it: " + " ".join(" ".join(messages).split())[:400])
    except ValueError as err:
        raise ValueError(f"the parameters of tool {name!r} cannot be used: {err}") from None
    return grammar


def call_lark(mode: ToolMode) -> str:
    """The same reply as `call_grammar`, for the llguidance backend: a JSON schema grammar for a named tool, else a
    Lark grammar (each call's literal prefix, its arguments as `%json`, and for "auto" the free-text branch)."""
    if mode.kind == "named":
        return _parameters_json(*mode.tools[0])
    rules = []
    for i, (name, schema) in enumerate(mode.tools):
        _parameters_json(name, schema)                   # refused: a 400 naming the tool
        rules.append(f"call{i}: {json.dumps(call_prefix(name))} args{i} \"}}\"\nargs{i}: {lark_json(schema)}")
    choices = [f"call{i}" for i in range(len(mode.tools))]
    if mode.kind == "auto":                              # or free text that does not open with "{" (or nothing)
        rules.append('text: /[^{][\\s\\S]*/ | ""')
        choices.append("text")
    return lark_grammar("\n".join(["start: " + " | ".join(choices), *rules]) + "\n")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallReader:
    """One choice's reply in a tool mode, read piece by piece: text, or one call (see the module docstring).

    `feed(text)` / `close()` return the deltas to stream; `message` and `finish_reason(...)` give the whole reply."""

    def __init__(self, mode: ToolMode, call_id: str | None = None) -> None:
        self.mode, self.call_id = mode, call_id or new_call_id()
        self.text = ""                                   # everything generated so far
        self.kind: Literal["text", "call"] | None = "call" if mode.kind == "named" else None    # None: undecided
        self.name: str | None = mode.names[0] if mode.kind == "named" else None
        self.start = 0                                   # where the arguments begin in `text`
        self.num_sent = 0                                # characters of content / arguments given out
        self.announced = False
        self.closed = False

    # --- changes -----------------------------------------------------------------------------------

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        self._decide()
        return self._deltas()

    def close(self) -> list[dict]:
        """The reply ended: what is left to send (held-back characters; a reply cut before a call's name is text)."""
        self.closed = True
        if self.kind is None and self.text:
            self.kind = "text"
        return self._deltas()

    def _decide(self) -> None:
        if self.kind is not None or not self.text:
            return
        if self.mode.kind == "auto" and not self.text.startswith("{"):
            self.kind = "text"
            return
        for name in self.mode.names:
            prefix = call_prefix(name)
            if self.text.startswith(prefix):
                self.kind, self.name, self.start = "call", name, len(prefix)
                return
        if not any(call_prefix(n).startswith(self.text) for n in self.mode.names):
            self.kind = "text"                           # not a call after all (the grammar never lets this happen)

    def _deltas(self) -> list[dict]:
        if self.kind == "text":
            piece, self.num_sent = self.text[self.num_sent:], len(self.text)
            return [{"content": piece}] if piece else []
        if self.kind != "call":
            return []
        out = []
        if not self.announced:
            self.announced = True
            out.append({"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                        "function": {"name": self.name, "arguments": ""}}]})
        arguments = self.arguments
        piece, self.num_sent = arguments[self.num_sent:], max(self.num_sent, len(arguments))
        if piece:
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        return out

    # --- queries -----------------------------------------------------------------------------------

    @property
    def arguments(self) -> str:
        """The call's arguments so far; while open, a call object's last character is held back (it may be the
        object's closing brace), and once closed that brace is dropped if the object is complete."""
        body = self.text[self.start:]
        if self.mode.kind == "named":
            return body
        if not self.closed or self._complete():
            return body[:-1]
        return body

    def _complete(self) -> bool:
        try:
            json.loads(self.text)
        except ValueError:
            return False
        return True

    @property
    def is_call(self) -> bool:
        return self.kind == "call"

    @property
    def message(self) -> dict:
        """The whole reply as OpenAI's assistant message (after `close`)."""
        if not self.is_call:
            return {"role": "assistant", "content": self.text}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}]}

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """"tool_calls" for a call that ended on its own; the engine's reason otherwise."""
        return "tool_calls" if self.is_call and engine_reason == "stop" else engine_reason
