"""Structured outputs in the server (lab 08 on lab 10's grammars): a request's `response_format` or tool choice
becomes a `GrammarConstraint` the engine masks every sampled token with.

    outputs = StructuredOutputs(tokenizer, backend="llguidance")       # one per server (ServerState.structured)
    constraint = await outputs.for_response_format(body.response_format)     # None for text; ValueError if the
    constraint = await outputs.compiled("key", course=build, llguidance=text)  # backend refuses the schema

Two backends compile the grammars (`--structured-outputs-backend`, as vLLM's `--structured-outputs-config.backend`):

* `llguidance` (the default): llguidance, a production library (`llguidance_backend.py`): wide JSON Schema
  coverage, ~1 ms to compile a schema, tens of microseconds per mask, and an explicit refusal naming each keyword
  it cannot enforce;
* `course`: the course's own compiler (`minigpt.structured.json_schema.compile_json_schema`, lab 10) and its
  `ContextCache`, which refuses more of JSON Schema and fills its mask cache one trie walk per new grammar position.

Either way:

* `{"type": "text"}` (or none): no constraint;
* `{"type": "json_object"}`: any compact JSON object;
* `{"type": "json_schema", "json_schema": {"schema": ...}}`: the schema's grammar (no schema: any JSON value);
  `strict` false or true alike, since the grammar always holds.

No request waits on another's grammar: compiling and the first mask run in a worker thread (`asyncio.to_thread`)
before the request reaches the engine (as vLLM holds such a request out of the batch until its grammar is ready),
so the engine's step only copies a compiled matcher (llguidance) or reads a warm cache (course). Compiled grammars
are kept in an LRU of `capacity` entries, keyed by the canonical JSON text of the schema (keys in the schema's own
order: the grammar writes properties in that order, so two orders are two grammars), shared by every request using
it (each sequence keeps its own state). The course backend's `ContextCache` lives as long as its grammar (only the
engine thread fills it, one new position at a time: the cost this backend still puts into the step); the
vocabulary's trie (course) or llguidance's tokenizer is built once, on the first structured request.

A client's schema is checked against a budget before it is compiled (`check_schema_budget`): at most
`MAX_SCHEMA_CHARS` of JSON on either backend; and, for the course's compiler, which makes one rule per count of a
bounded repetition and a pattern per digit of a numeric bound (`"maxLength": 1000000` alone would cost seconds and a
million rules), counts and bounds too. Larger schemas are refused (400) rather than served slowly.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from typing import Any, Callable, Literal

from minigpt.engine.logits_processing import GrammarConstraint
from minigpt.serving import llguidance_backend
from minigpt.structured.grammar import Grammar
from minigpt.structured.json_schema import compile_json_schema, json_object_grammar
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import TokenTrie, Vocabulary

__all__ = ["StructuredOutputs", "Backend", "BACKENDS", "DEFAULT_BACKEND", "canonical", "check_schema_budget",
           "DEFAULT_CAPACITY", "MAX_SCHEMA_CHARS", "MAX_REPEAT", "MAX_BOUND"]

Backend = Literal["llguidance", "course"]
BACKENDS: tuple[Backend, ...] = ("llguidance", "course")
DEFAULT_BACKEND: Backend = "llguidance"

DEFAULT_CAPACITY = 64
MAX_SCHEMA_CHARS = 64_000           # a schema's compact JSON text
MAX_REPEAT = 1024                   # minLength, maxLength, minItems, maxItems
MAX_BOUND = 10**15                  # |minimum|, |maximum| and the exclusive ones
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def canonical(value: Any) -> str:
    """The compact JSON text of a schema, keys in their given order (the cache key)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_schema_budget(schema: Any, where: str = "schema", backend: Backend = "course") -> None:
    """ValueError if compiling `schema` with `backend` could cost too much (see the module docstring)."""
    if len(canonical(schema)) > MAX_SCHEMA_CHARS:
        raise ValueError(f"{where}: the schema is longer than {MAX_SCHEMA_CHARS} characters")
    if backend != "course":
        return
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
    """Grammars compiled once per schema by one backend, and what masks them (see the module docstring)."""

    def __init__(self, tokenizer: Any, capacity: int = DEFAULT_CAPACITY, backend: Backend = DEFAULT_BACKEND) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"structured outputs backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.tokenizer, self.capacity, self.backend = tokenizer, capacity, backend
        self._grammars: OrderedDict[str, GrammarConstraint] = OrderedDict()
        self._trie: TokenTrie | None = None
        self._lltok: Any = None
        self._vocab_lock = threading.Lock()
        self.num_compiled = 0

    # --- queries -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._grammars)

    async def for_response_format(self, response_format: Any | None) -> GrammarConstraint | None:
        """The constraint of a request's validated `response_format` (None: free text)."""
        kind = getattr(response_format, "type", "text")
        if kind == "json_object":
            return await self.compiled("json_object", course=json_object_grammar,
                                       llguidance=lambda: llguidance_backend.json_schema_grammar({"type": "object"}))
        if kind == "json_schema":
            schema = response_format.json_schema.schema_
            schema = {} if schema is None else schema
            check_schema_budget(schema, "json_schema.schema", self.backend)
            return await self.compiled("json_schema:" + canonical(schema), course=lambda: compile_json_schema(schema),
                                       llguidance=lambda: llguidance_backend.json_schema_grammar(schema))
        return None

    async def compiled(self, key: str, *, course: Callable[[], Grammar], llguidance: Callable[[], str]
                       ) -> GrammarConstraint:
        """The cached constraint under `key`, else compiled in a worker thread from this backend's builder: `course()`
        (a course `Grammar`) or `llguidance()` (an llguidance grammar, `llguidance_backend`). ValueError: what the backend refused."""
        if key in self._grammars:
            self._grammars.move_to_end(key)
            return self._grammars[key]
        build = self._compile_course if self.backend == "course" else self._compile_llguidance
        constraint = await asyncio.to_thread(build, course if self.backend == "course" else llguidance)
        self._grammars[key] = constraint
        while len(self._grammars) > self.capacity:
            self._grammars.popitem(last=False)
        return constraint

    # --- worker thread -----------------------------------------------------------------------------

    def _compile_course(self, build: Callable[[], Grammar]) -> GrammarConstraint:
        self._need_tokenizer()
        grammar = build()
        trie = self._token_trie()
        cache = ContextCache(grammar, trie)
        cache.mask(grammar.start_state())                # warm the first mask here rather than in an engine step
        self.num_compiled += 1
        return GrammarConstraint(grammar, cache.mask, trie.vocab.texts)

    def _compile_llguidance(self, build: Callable[[], str]) -> GrammarConstraint:
        self._need_tokenizer()
        constraint = llguidance_backend.compile_grammar(build(), self._llguidance_tokenizer())
        self.num_compiled += 1
        return constraint

    def _need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer (this engine has none)")

    def _token_trie(self) -> TokenTrie:
        with self._vocab_lock:
            if self._trie is None:
                try:
                    vocab = Vocabulary.from_tokenizer(self.tokenizer)
                except (AttributeError, TypeError) as err:
                    raise ValueError(f"structured outputs need a tiktoken-style tokenizer: {err}") from None
                self._trie = TokenTrie(vocab)
            return self._trie

    def _llguidance_tokenizer(self) -> Any:
        with self._vocab_lock:
            if self._lltok is None:
                self._lltok = llguidance_backend.llguidance_tokenizer_of(self.tokenizer)
            return self._lltok
