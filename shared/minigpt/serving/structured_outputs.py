"""Structured outputs in the server (lab 08 on lab 10's grammars): a request's `response_format` or tool choice
becomes a `GrammarConstraint` the engine masks every sampled token with.

    outputs = StructuredOutputs(tokenizer)                              # one per server (ServerState.structured)
    constraint = await outputs.for_response_format(body.response_format)     # None for text; ValueError if the
    constraint = await outputs.compiled("key", build_grammar)                # schema cannot be compiled

* `{"type": "text"}` (or none): no constraint;
* `{"type": "json_object"}`: any compact JSON object (`json_object_grammar()`);
* `{"type": "json_schema", "json_schema": {"schema": ...}}`: `compile_json_schema(schema)` (no schema: any JSON
  value); `strict` false or true alike, since the grammar always holds.

Compiling a grammar and warming its mask cache cost milliseconds to seconds: both run in a worker thread
(`asyncio.to_thread`), so the event loop keeps serving the other requests meanwhile. Compiled grammars are kept in an
LRU of `capacity` entries, keyed by the canonical JSON text of the schema (keys in the schema's own order: the grammar
writes properties in that order, so two orders are two grammars), each with its `ContextCache`: the cache is what
makes a mask cheap once warm, so it lives as long as the grammar and is shared by every request using it (only the
engine thread computes masks). The vocabulary's trie is built once, on the first structured request.

A client's schema is checked against a budget before it is compiled (`check_schema_budget`): the compiler makes one
rule per count of a bounded repetition and a pattern per digit of a numeric bound, so `"maxLength": 1000000` alone
would cost seconds and a million rules. Larger schemas are refused (400) rather than served slowly.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from typing import Any, Callable

from minigpt.engine.logits_processing import GrammarConstraint
from minigpt.structured.grammar import Grammar
from minigpt.structured.json_schema import compile_json_schema, json_object_grammar
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import TokenTrie, Vocabulary

__all__ = ["StructuredOutputs", "canonical", "check_schema_budget", "DEFAULT_CAPACITY", "MAX_SCHEMA_CHARS",
           "MAX_REPEAT", "MAX_BOUND"]

DEFAULT_CAPACITY = 64
MAX_SCHEMA_CHARS = 64_000           # a schema's compact JSON text
MAX_REPEAT = 1024                   # minLength, maxLength, minItems, maxItems
MAX_BOUND = 10**15                  # |minimum|, |maximum| and the exclusive ones
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def canonical(value: Any) -> str:
    """The compact JSON text of a schema, keys in their given order (the cache key)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_schema_budget(schema: Any, where: str = "schema") -> None:
    """ValueError if compiling `schema` could cost too much (see the module docstring); nothing otherwise."""
    if len(canonical(schema)) > MAX_SCHEMA_CHARS:
        raise ValueError(f"{where}: the schema is longer than {MAX_SCHEMA_CHARS} characters")
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                if key in _COUNTS and numeric and value > MAX_REPEAT:
                    raise ValueError(f"{where}: {key} {value} is over this server's limit of {MAX_REPEAT}")
                if key in _BOUNDS and numeric and abs(value) > MAX_BOUND:
                    raise ValueError(f"{where}: {key} {value} is over this server's limit of {MAX_BOUND:.0e} in size")
                todo.append(value)


class StructuredOutputs:
    """Grammars compiled once per schema and their mask caches (see the module docstring)."""

    def __init__(self, tokenizer: Any, capacity: int = DEFAULT_CAPACITY) -> None:
        self.tokenizer, self.capacity = tokenizer, capacity
        self._grammars: OrderedDict[str, GrammarConstraint] = OrderedDict()
        self._trie: TokenTrie | None = None
        self._trie_lock = threading.Lock()
        self.num_compiled = 0

    # --- queries -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._grammars)

    async def for_response_format(self, response_format: Any | None) -> GrammarConstraint | None:
        """The constraint of a request's validated `response_format` (None: free text)."""
        kind = getattr(response_format, "type", "text")
        if kind == "json_object":
            return await self.compiled("json_object", json_object_grammar)
        if kind == "json_schema":
            schema = response_format.json_schema.schema_
            schema = {} if schema is None else schema
            check_schema_budget(schema, "json_schema.schema")
            return await self.compiled("json_schema:" + canonical(schema), lambda: compile_json_schema(schema))
        return None

    async def compiled(self, key: str, build: Callable[[], Grammar]) -> GrammarConstraint:
        """The cached constraint under `key`, else `build()` compiled in a worker thread (ValueError: its message)."""
        if key in self._grammars:
            self._grammars.move_to_end(key)
            return self._grammars[key]
        constraint = await asyncio.to_thread(self._compile, build)
        self._grammars[key] = constraint
        while len(self._grammars) > self.capacity:
            self._grammars.popitem(last=False)
        return constraint

    # --- worker thread -----------------------------------------------------------------------------

    def _compile(self, build: Callable[[], Grammar]) -> GrammarConstraint:
        if self.tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer (this engine has none)")
        grammar = build()
        trie = self._token_trie()
        cache = ContextCache(grammar, trie)
        cache.mask(grammar.start_state())                # warm the first mask here rather than in an engine step
        self.num_compiled += 1
        return GrammarConstraint(grammar, cache.mask, trie.vocab.texts)

    def _token_trie(self) -> TokenTrie:
        with self._trie_lock:
            if self._trie is None:
                try:
                    vocab = Vocabulary.from_tokenizer(self.tokenizer)
                except (AttributeError, TypeError) as err:
                    raise ValueError(f"structured outputs need a tiktoken-style tokenizer: {err}") from None
                self._trie = TokenTrie(vocab)
            return self._trie
