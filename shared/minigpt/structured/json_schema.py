"""A useful subset of JSON Schema compiled to a character grammar (`grammar.Grammar`) of compact JSON (lab 10).

    g = compile_json_schema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    g.matches('{"n":12}')       # True: no whitespace, "," and ":" as separators, properties in the schema's order

Supported, and what each compiles to:

* `type`: string, integer (-?(0|[1-9][0-9]*)), number (with fraction and exponent), boolean, null, object, array,
  or a list of them (one of);
* objects: `properties` in the schema's order, `required`; no other property is allowed (`additionalProperties`
  absent or false, as strict structured-output modes do);
* strings: `enum`, `const` (any JSON values, for any type), `pattern` (a regular expression over the string's
  characters, through `RegexAutomaton`, matched against the whole string: JSON Schema's patterns are searched
  anywhere unless anchored, so a whole-string match is stricter, and `^`/`$` anchors are dropped where they only
  say "the whole string"; characters a JSON string must escape are left out of what it admits: the grammar may be
  stricter than the schema, never looser), `minLength` and `maxLength` (an escape counts as one);
* integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (either side or both);
* numbers: `minimum` and `maximum` that are whole numbers (either side or both); a bounded number is written without
  an exponent (`-?int(.digits)?`: stricter than JSON, never looser);
* arrays: `items`, `minItems`, `maxItems`;
* `{}` or `true`: any JSON value (`json_object_grammar()`: any JSON object, OpenAI's `json_object` mode);
* `anyOf`, `$ref` to `#/$defs/<name>` (recursion allowed), and annotations (`title`, `description`, `$schema`,
  `$id`, `default`, `examples`) ignored.

Anything else raises ValueError naming the keyword: a silently looser grammar would let invalid JSON through.
"""

from __future__ import annotations

import json
from typing import Any

from minigpt.structured.grammar import CharSet, Grammar
from minigpt.structured.regex_automaton import RegexAutomaton

__all__ = ["compile_json_schema", "json_object_grammar", "object_rules", "whole_string_pattern", "integer_range_pattern", "number_range_pattern"]

ANNOTATIONS = {"title", "description", "$schema", "$id", "default", "examples", "$comment"}
SUPPORTED = {"type", "properties", "required", "additionalProperties", "enum", "const", "pattern", "minLength",
             "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "items", "minItems", "maxItems", "anyOf", "$ref", "$defs"} | ANNOTATIONS
CONTROL = {chr(i) for i in range(0x20)}
UNESCAPED = CharSet.but({'"', "\\"} | CONTROL)            # a string character that needs no escape
DIGIT, NONZERO = CharSet.of("0123456789"), CharSet.of("123456789")
KEYWORDS_OF_TYPE = {"string": {"pattern", "minLength", "maxLength"},
                    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
                    "number": {"minimum", "maximum"},
                    "object": {"properties", "required", "additionalProperties"},
                    "array": {"items", "minItems", "maxItems"}}
TYPE_SPECIFIC = set().union(*KEYWORDS_OF_TYPE.values())


def compile_json_schema(schema: dict[str, Any]) -> Grammar:
    """The grammar of the compact JSON documents `schema` accepts (see the module docstring for the subset)."""
    compiler = _Compiler(schema)
    compiler.grammar.rule("root", [compiler.value(schema, "root")])
    compiler.grammar.check()
    return compiler.grammar


def json_object_grammar() -> Grammar:
    """Any compact JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
    compiler = _Compiler({})
    compiler.grammar.rule("root", ["any.object"])
    compiler.grammar.check()
    return compiler.grammar


class _Compiler:
    def __init__(self, root: dict[str, Any]) -> None:
        self.grammar = Grammar("root")
        self.defs: dict[str, Any] = root.get("$defs", {})
        self.refs: dict[str, str] = {}
        self.count = 0
        self._shared()

    def new(self, hint: str) -> str:
        self.count += 1
        return f"{hint}#{self.count}"

    def _shared(self) -> None:
        g = self.grammar
        g.rule("escape", ["\\", CharSet.of('"\\/bfnrt')], ["\\", "u", *[CharSet.of("0123456789abcdefABCDEF")] * 4])
        g.rule("char", [UNESCAPED], ["escape"])
        g.rule("digits", [DIGIT, "digits"], [])
        g.rule("uint", ["0"], [NONZERO, "digits"])
        g.rule("integer", ["-", "uint"], ["uint"])
        g.rule("fraction", [".", DIGIT, "digits"], [])
        g.rule("exponent", [CharSet.of("eE"), CharSet.of("+-"), DIGIT, "digits"], [CharSet.of("eE"), DIGIT, "digits"], [])
        g.rule("number", ["integer", "fraction", "exponent"])
        g.rule("boolean", "true", "false")
        g.rule("null", "null")
        # any JSON value: what `{}` or `true` accepts
        g.rule("any", ["any.string"], ["number"], ["boolean"], ["null"], ["any.object"], ["any.array"])
        g.rule("any.string", ['"', "any.chars", '"'])
        g.rule("any.chars", ["char", "any.chars"], [])
        g.rule("any.object", ["{", "any.member", "any.members", "}"], "{}")
        g.rule("any.member", ["any.string", ":", "any"])
        g.rule("any.members", [",", "any.member", "any.members"], [])
        g.rule("any.array", ["[", "any", "any.items", "]"], "[]")
        g.rule("any.items", [",", "any", "any.items"], [])

    def value(self, schema: Any, hint: str) -> str:
        """A rule matching the JSON values `schema` accepts."""
        if schema is True or schema == {}:
            return "any"
        if not isinstance(schema, dict):
            raise ValueError(f"{hint}: a schema must be an object, got {schema!r}")
        if unknown := sorted(set(schema) - SUPPORTED):
            raise ValueError(f"{hint}: unsupported keyword {unknown[0]!r} (supported: {', '.join(sorted(SUPPORTED))})")
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            return self.grammar.rule(self.new(hint + ".enum"),
                                     *[json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in values])
        if "anyOf" in schema:
            return self.grammar.rule(self.new(hint + ".anyOf"),
                                     *[[self.value(s, f"{hint}.anyOf[{i}]")] for i, s in enumerate(schema["anyOf"])])
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.grammar.rule(self.new(hint + ".type"), *[[self.value({**schema, "type": k}, hint)] for k in kind])
        builders = {"string": self.string, "integer": self.integer, "number": self.number, "object": self.object,
                    "array": self.array, "boolean": lambda s, h: "boolean", "null": lambda s, h: "null"}
        if kind not in builders:
            raise ValueError(f"{hint}: type must be one of {sorted(builders)} (or a list of them), got {kind!r}")
        self._refuse(schema, hint, kind)
        return builders[kind](schema, hint)

    def _refuse(self, schema: dict[str, Any], hint: str, kind: str) -> None:
        """Keywords that do not apply to `kind`: an error rather than a grammar that ignores them."""
        if wrong := sorted((set(schema) & TYPE_SPECIFIC) - KEYWORDS_OF_TYPE.get(kind, set())):
            raise ValueError(f"{hint}: keyword {wrong[0]!r} is not supported on type {kind!r}")

    def ref(self, ref: str) -> str:
        prefix = "#/$defs/"
        if not isinstance(ref, str) or not ref.startswith(prefix) or ref[len(prefix):] not in self.defs:
            raise ValueError(f"$ref {ref!r}: only references to #/$defs/<name> with that name defined are supported")
        name = ref[len(prefix):]
        if name not in self.refs:
            self.refs[name] = rule = f"def:{name}"
            self.grammar.rule(rule, [self.value(self.defs[name], rule)])
        return self.refs[name]

    def string(self, schema: dict[str, Any], hint: str) -> str:
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise ValueError(f"{hint}: pattern together with minLength/maxLength is not supported")
            body = self.automaton(RegexAutomaton.compile(whole_string_pattern(schema["pattern"])), hint + ".pattern")
        else:
            low, high = schema.get("minLength", 0), schema.get("maxLength")
            body = self.repeat(["char"], low, high, hint + ".chars", separator=None)
        return self.grammar.rule(self.new(hint + ".string"), ['"', body, '"'])

    def automaton(self, dfa: RegexAutomaton, hint: str) -> str:
        """A right-linear rule per live state of `dfa`, on unescaped characters only."""
        listed = frozenset(dfa.symbols)
        names = {q: f"{hint}@{q}#{self.count + 1}" for q in dfa.live_states}
        self.count += 1
        for q, name in names.items():
            alternatives: list[list[Any]] = [[]] if dfa.accepting(q) else []
            for symbol, nxt in dfa.transitions[q].items():
                if nxt not in names:
                    continue
                chars = {c for c, s in dfa.symbols.items() if s == symbol}
                allowed = (CharSet.but(listed) if symbol == dfa.other else CharSet.of(chars)) & UNESCAPED
                if allowed.negated or allowed.chars:
                    alternatives.append([allowed, names[nxt]])
            self.grammar.rule(name, *alternatives)
        return names[dfa.start]

    def repeat(self, item: list[Any], low: int, high: int | None, hint: str, separator: str | None) -> str:
        """item{low,high} (high None: no bound), `separator` between items; one rule per count up to the bound."""
        if low < 0 or (high is not None and high < low):
            raise ValueError(f"{hint}: bounds [{low}, {high}] are not a range")
        sep = [separator] if separator else []
        top = high if high is not None else max(low, 1)
        names = [self.new(f"{hint}{{{k}}}") for k in range(top + 1)]     # names[k]: k items read so far
        for k, name in enumerate(names):
            alternatives: list[list[Any]] = [[]] if k >= low else []
            if high is None and k == top:
                alternatives.append([*sep, *item, name])                 # unbounded: loop at the last count
            elif k < top:
                alternatives.append([*(sep if k else []), *item, names[k + 1]])
            self.grammar.rule(name, *alternatives)
        return names[0]

    def integer(self, schema: dict[str, Any], hint: str) -> str:
        low, high = _bound(schema, "minimum", hint), _bound(schema, "maximum", hint)
        if (ex := _bound(schema, "exclusiveMinimum", hint)) is not None:
            low = max(low, ex + 1) if low is not None else ex + 1
        if (ex := _bound(schema, "exclusiveMaximum", hint)) is not None:
            high = min(high, ex - 1) if high is not None else ex - 1
        if low is None and high is None:
            return "integer"
        if low is not None and high is not None and low > high:
            raise ValueError(f"{hint}: no integer lies in [{low}, {high}]")
        return self.automaton(RegexAutomaton.compile(integer_range_pattern(low, high)), hint + ".range")

    def number(self, schema: dict[str, Any], hint: str) -> str:
        low, high = _bound(schema, "minimum", hint), _bound(schema, "maximum", hint)
        if low is None and high is None:
            return "number"
        if low is not None and high is not None and low > high:
            raise ValueError(f"{hint}: no number lies in [{low}, {high}]")
        return self.automaton(RegexAutomaton.compile(number_range_pattern(low, high)), hint + ".range")

    def object(self, schema: dict[str, Any], hint: str) -> str:
        if schema.get("additionalProperties", False) is not False:
            raise ValueError(f"{hint}: additionalProperties other than false is not supported")
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        if missing := sorted(required - set(props)):
            raise ValueError(f"{hint}: required property {missing[0]!r} is not in properties")
        members = [(key, self.value(props[key], f"{hint}.{key}"), key in required) for key in props]
        name = self.new(hint + ".object")
        for rule, alternatives in object_rules(name, members).items():
            self.grammar.rule(rule, *alternatives)
        return name

    def array(self, schema: dict[str, Any], hint: str) -> str:
        if "items" not in schema:
            raise ValueError(f"{hint}: an array needs `items` (a schema for its elements)")
        item = self.value(schema["items"], hint + "[]")
        body = self.repeat([item], schema.get("minItems", 0), schema.get("maxItems"), hint + ".items", separator=",")
        return self.grammar.rule(self.new(hint + ".array"), ["[", body, "]"])


def object_rules(name: str, members: list[tuple[str, str, bool]]) -> dict[str, list[list[str]]]:
    """The rules of a compact JSON object, rule `name`: `members` = [(key, the value's rule, required)], written in
    this order, each optional one may be left out, nothing else admitted. A symbol is a one-character terminal or a
    rule's name.

    Two rules per position i: first_i (no member written yet; the next one needs no comma) and rest_i (some
    written; the next one starts with ","); a required member has no alternative that skips it."""
    first = [f"{name}.first{i}" for i in range(len(members) + 1)]
    rest = [f"{name}.rest{i}" for i in range(len(members) + 1)]
    rules: dict[str, list[list[str]]] = {name: [["{", first[0], "}"]], first[-1]: [[]], rest[-1]: [[]]}
    for i, (key, value, required) in enumerate(members):
        member = [*json.dumps(key, ensure_ascii=False), ":", value]
        rules[first[i]] = [[*member, rest[i + 1]], *([] if required else [[first[i + 1]]])]
        rules[rest[i]] = [[",", *member, rest[i + 1]], *([] if required else [[rest[i + 1]]])]
    return rules


def whole_string_pattern(pattern: str) -> str:
    """`pattern` for a whole-string match: a leading `^` and a trailing unescaped `$` of each top-level alternative
    dropped (a whole-string match already says it; `interegular` has no anchors). `^a|b$` becomes `a|b`, whole
    strings: stricter than "starts with a or ends with b", as everything here."""
    alternatives, start, depth, escaped, in_class = [], 0, 0, False, False
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch == "|" and depth == 0:
            alternatives.append(pattern[start:i])
            start = i + 1
    alternatives.append(pattern[start:])
    out = []
    for alt in alternatives:
        alt = alt[1:] if alt.startswith("^") else alt
        trailing_backslashes = len(alt[:-1]) - len(alt[:-1].rstrip("\\"))
        alt = alt[:-1] if alt.endswith("$") and trailing_backslashes % 2 == 0 else alt
        out.append(alt)
    return "|".join(out)


def _bound(schema: dict[str, Any], keyword: str, hint: str) -> int | None:
    """A bound that is a whole number (5 or 5.0), as an int; None when absent."""
    value = schema.get(keyword)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ValueError(f"{hint}: {keyword} must be a whole number here, got {value!r}")
    return int(value)


def integer_range_pattern(low: int | None, high: int | None) -> str:
    """A regular expression for the decimal integers in [low, high] (None: unbounded on that side; no leading
    zeros, "-" for negatives, no "-0")."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"empty range [{low}, {high}]")
    parts = []
    if low is None or low < 0:                  # -m for m in [max(1, -high), -low]
        m_low, m_high = max(1, -high) if high is not None else 1, -low if low is not None else None
        if m_high is None or m_low <= m_high:
            parts.append("-(" + _positive_range(m_low, m_high) + ")")
    if high is None or high >= 0:
        parts.append(_natural_range(max(0, low) if low is not None else 0, high))
    return "|".join(f"({p})" for p in parts)


def number_range_pattern(low: int | None, high: int | None) -> str:
    """A regular expression for the decimals -?int(.digits)? in [low, high], whole-number bounds (None: unbounded).

    With integer bounds, int.frac >= a iff int >= a, and int.frac <= b iff int < b or (int == b and frac is all
    zeros); a negative -m lies in [low, high] iff m lies in [max(0, -high), -low]."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"empty range [{low}, {high}]")
    parts = []
    if low is None or low < 0:
        parts += ["-(" + p + ")" for p in [_magnitudes(max(0, -high) if high is not None else 0,
                                                       -low if low is not None else None)] if p]
    if high is None or high >= 0:
        parts += [p for p in [_magnitudes(max(0, low) if low is not None else 0, high)] if p]
    return "|".join(f"({p})" for p in parts)


def _magnitudes(low: int, high: int | None) -> str:
    """Decimals int(.digits)? in [low, high], 0 <= low, whole-number bounds; "" if none."""
    any_fraction, zero_fraction = r"(\.[0-9]+)?", r"(\.0+)?"
    if high is None:
        return f"({_natural_range(low, None)}){any_fraction}"
    out = [f"({_natural_range(low, high - 1)}){any_fraction}"] if low <= high - 1 else []
    out += [f"{high}{zero_fraction}"] if low <= high else []
    return "|".join(out)


def _natural_range(low: int, high: int | None) -> str:
    """[low, high] for 0 <= low (high None: unbounded)."""
    if low > 0:
        return _positive_range(low, high)
    return "0|" + _positive_range(1, high) if high is None or high >= 1 else "0"


def _positive_range(low: int, high: int | None) -> str:
    """Alternatives for [low, high], 1 <= low (high None: every larger number too), split at powers of ten and
    then digit by digit."""
    out = []
    while high is None or low <= high:
        digits = len(str(low))
        if high is None and low == 10 ** (digits - 1):
            return "|".join(out + [f"[1-9][0-9]{{{digits - 1},}}"])      # every number of `digits` digits or more
        top = min(high, 10 ** digits - 1) if high is not None else 10 ** digits - 1
        out += _same_length(str(low), str(top))
        low = top + 1
    return "|".join(out)


def _same_length(lo: str, hi: str) -> list[str]:
    """Patterns for the numbers from lo to hi, both of the same number of digits."""
    if lo == hi:
        return [lo]
    if len(lo) == 1:
        return [f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + p for p in _group(_same_length(lo[1:], hi[1:]))]
    n = len(lo) - 1
    out = []
    if lo[1:] != "0" * n:
        out += [lo[0] + p for p in _group(_same_length(lo[1:], "9" * n))]
        first = int(lo[0]) + 1
    else:
        first = int(lo[0])
    last = int(hi[0]) - 1 if hi[1:] != "9" * n else int(hi[0])
    if first <= last:
        out.append(f"[{first}-{last}][0-9]{{{n}}}")
    if hi[1:] != "9" * n:
        out += [hi[0] + p for p in _group(_same_length("0" * n, hi[1:]))]
    return out


def _group(patterns: list[str]) -> list[str]:
    return [f"({'|'.join(patterns)})"] if len(patterns) > 1 else patterns
