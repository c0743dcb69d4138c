"""The llguidance backend of structured outputs: a JSON schema or a Lark grammar -> a `GrammarConstraint`, masks
from llguidance (Rust, a production library: vLLM's `guidance` backend) instead of the course's compiler.

    lltok = llguidance_tokenizer_of(tokenizer)                    # once per server (~20 ms for the course's 4k BPE)
    constraint = compile_grammar(json_schema_grammar(schema), lltok)     # ValueError naming what it refuses
    state = constraint.grammar.start_state()                      # a fresh matcher (a copy: microseconds)
    allowed = constraint.mask(state)                              # (V,) bool, the end token where it may stop
    state = constraint.grammar.walk(state, constraint.texts[token])      # the same matcher, advanced; None: refused

It plugs into `minigpt.engine.logits_processing` unchanged. There a `GrammarConstraint` is a grammar whose states
`walk` on each sampled token's entry in `texts`; llguidance matches token ids, not text, so `texts` is the identity
(`TokenIds`: entry i is i) and a state is an `LLMatcher` that `walk` advances in place. That is safe because every
sequence's `LogitsProcessor` starts from its own copy (`start_state`) and walks each token once.

Compiling (`compile_grammar`) builds the prototype matcher and computes its first mask, in the caller's thread (the
server's worker thread; llguidance drops the GIL meanwhile), so the engine's step only copies it. Later masks are
computed lazily by llguidance, tens of microseconds each.

The JSON is compact (no whitespace, "," and ":"), as the course's compiler writes it; and, as there, an object
schema that lists `properties` without saying `additionalProperties` admits no other property (`closed_objects`,
as XGrammar's strict mode and vLLM's `disable_additional_properties`); `additionalProperties: true` or a schema
opens it (so do the members of an `allOf`). Keywords llguidance cannot enforce (`uniqueItems`, `not`, `if`...)
make it refuse the schema, naming them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from minigpt.engine.logits_processing import GrammarConstraint

__all__ = ["JSON_OPTIONS", "llguidance_tokenizer_of", "json_schema_grammar", "lark_grammar", "lark_json",
           "compile_grammar",
           "closed_objects", "MatcherGrammar", "MatcherMask", "TokenIds"]

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_SCHEMA = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
           "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def llguidance_tokenizer_of(tokenizer: Any) -> Any:
    """llguidance's view of the server's tokenizer: a tiktoken Encoding (the course's) or a `minigpt.hf.HFTokenizer`
    (its tokenizer.json); ValueError for anything else."""
    import llguidance
    import llguidance.tiktoken

    if hasattr(tokenizer, "_mergeable_ranks"):
        return llguidance.tiktoken.lltokenizer_from_encoding(tokenizer)
    inner = getattr(tokenizer, "tokenizer", None)
    if hasattr(inner, "to_str") and getattr(tokenizer, "eos_token_ids", None):
        return llguidance.LLTokenizer(inner.to_str(), n_vocab=tokenizer.n_vocab,
                                      eos_token=list(tokenizer.eos_token_ids))
    raise ValueError("the llguidance backend needs a tiktoken Encoding or an HFTokenizer, not "
                     f"{type(tokenizer).__name__}")


def closed_objects(schema: Any, close: bool = True) -> Any:
    """A copy of `schema` where every subschema with `properties` and no `additionalProperties` gets
    `additionalProperties: false` (walking schema keywords only, never `const`/`enum` values), except the direct
    members of an `allOf`: each lists only part of the properties, so closing them would leave no document."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if close and isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(sub, close=key != "allOf") for sub in out[key]]
    return out


def _no_client_options(schema: Any) -> None:
    """ValueError when a client's schema carries llguidance's own options (`x-guidance`: `lenient` would make it
    skip the keywords it cannot enforce, a grammar looser than the schema)."""
    if isinstance(schema, dict) and "x-guidance" in schema:
        raise ValueError("the llguidance backend refuses it: the keyword 'x-guidance' (the server sets llguidance's "
                         "options itself)")


def json_schema_grammar(schema: Any) -> str:
    """llguidance's grammar (its JSON form) of compact JSON following `schema` (see the module docstring);
    ValueError if llguidance cannot read it (most refusals come later, from `compile_grammar`)."""
    import llguidance

    _no_client_options(schema)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(closed_objects(schema)), overrides=JSON_OPTIONS)
    except ValueError as err:
        raise ValueError(f"the llguidance backend refuses it: {_one_line(str(err))}") from None


def lark_grammar(text: str) -> str:
    """llguidance's grammar (its JSON form) of a Lark grammar's text (checked only by `compile_grammar`)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(text)


def lark_json(schema: Any) -> str:
    """`schema` as the body of a Lark rule (`rule: %json {...}`), compact as `json_schema_grammar`'s."""
    _no_client_options(schema)
    return "%json " + json.dumps({**closed_objects(schema), "x-guidance": JSON_OPTIONS})


def compile_grammar(grammar: str, lltok: Any) -> GrammarConstraint:
    """The constraint of an llguidance grammar (from `json_schema_grammar` or `lark_grammar`), its first mask
    computed here; ValueError with llguidance's message if it refuses the grammar."""
    import llguidance

    prototype = llguidance.LLMatcher(lltok, grammar, log_level=0)
    if prototype.is_error():
        raise ValueError(f"the llguidance backend refuses it: {_one_line(prototype.get_error())}")
    mask = MatcherMask(lltok.vocab_size)
    mask(prototype)                                  # warm llguidance's lexer here rather than in an engine step
    return GrammarConstraint(MatcherGrammar(prototype), mask, TokenIds(lltok.vocab_size))


def _one_line(message: str, limit: int = 400) -> str:
    """llguidance's (possibly multi-line) error as one line of at most `limit` characters."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip()) or "unknown error"
    return line if len(line) <= limit else line[:limit - 3] + "..."


class MatcherGrammar:
    """The `grammar` of a constraint: states are `LLMatcher`s, each sequence's a copy of the compiled one."""

    def __init__(self, prototype: Any) -> None:
        self.prototype = prototype

    def start_state(self) -> Any:
        return self.prototype.deep_copy()

    def walk(self, matcher: Any, token: int) -> Any | None:
        """`matcher` advanced on `token` (in place), or None if the grammar refuses it."""
        return matcher if matcher.consume_token(token) else None


class MatcherMask:
    """`mask(matcher)` -> the (V,) bool tensor of the tokens it allows next (llguidance's packed bits, unpacked)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def __call__(self, matcher: Any) -> Tensor:
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        return torch.from_numpy(np.unpackbits(bits, bitorder="little")[:self.vocab_size].astype(bool))


class TokenIds(Sequence):
    """`texts` of a library constraint: entry i is the token id i itself (what `MatcherGrammar.walk` reads)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, token: int) -> int:                    # type: ignore[override]
        if not 0 <= token < self.size:
            raise IndexError(token)
        return token
