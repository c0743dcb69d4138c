"""A useful subset of JSON Schema compiled to a character grammar (`grammar.Grammar`) of compact JSON (lab 10).

    g = compile_json_schema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    g.matches('{"n":12}')       # True: no whitespace, "," and ":" as separators, properties in the schema's order

Supported, and what each compiles to:

* `type`: string, integer (-?(0|[1-9][0-9]*)), number (with fraction and exponent), boolean, null, object, array,
  or a list of them (one of); a keyword of one type constrains that type only (`{"type": ["string", "null"],
  "maxLength": 20}` admits null), as JSON Schema says;
* objects: `properties` in the schema's order, `required`; no other property is allowed (`additionalProperties`
  absent or false, as strict structured-output modes do);
* strings: `pattern` (a regular expression over the string's characters, through `RegexAutomaton`, matched against
  the whole string: JSON Schema's patterns are searched anywhere unless anchored, so a whole-string match is
  stricter, and `^`/`$` anchors are dropped where they only say "the whole string"; a character JSON must escape,
  a quote, a backslash, a control character, is read in its escaped spelling), `minLength` and `maxLength` (counted
  in code points, as JSON Schema does: an escape is one, a surrogate pair `\\ud83d\\ude00` one);
* `enum`, `const` (any JSON values, beside any keywords: only the values the sibling keywords accept are kept,
  judged by `jsonschema`; none left is an error);
* integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (either side or both);
* numbers: `minimum` and `maximum` that are whole numbers (either side or both); a bounded number is written without
  an exponent (`-?int(.digits)?`: stricter than JSON, never looser);
* arrays: `items`, `minItems`, `maxItems`;
* `{}` or `true`: any JSON value (`json_object_grammar()`: any JSON object, OpenAI's `json_object` mode);
* `anyOf` and `$ref` to `#/$defs/<name>` (recursion allowed), each with sibling keywords merged into every branch
  (the referenced schema) as Draft 2020-12 applies both (schema_merge.py); annotations (`title`, `description`,
  `$schema`, `$id`, `default`, `examples`) ignored.

A non-ASCII character the grammar names (in a `const`, an enum value, a property name, a pattern) may also be
written as its `\\u` escape (json_text.py): the course tokenizer has no token for it raw.

Anything else raises ValueError naming the keyword: a silently looser grammar would let invalid JSON through. So does
a schema no document can satisfy in this subset (an empty enum, a required property that recurses forever): the
grammar's start rule derives no finite string (`Grammar.check`), and alternatives that derive none are pruned
(`Grammar.prune`), so a constrained decoder never enters a branch it cannot finish.
"""

from __future__ import annotations

import json
from typing import Any

from minigpt.structured.grammar import CharSet, Grammar
from minigpt.structured.json_text import MUST_ESCAPE, escape_rules, spelled
from minigpt.structured.regex_automaton import RegexAutomaton
from minigpt.structured.schema_merge import IGNORED_BESIDE, merge

__all__ = ["compile_json_schema", "json_object_grammar", "object_rules", "whole_string_pattern", "integer_range_pattern", "number_range_pattern"]

ANNOTATIONS = {"title", "description", "$schema", "$id", "default", "examples", "$comment"}
SUPPORTED = {"type", "properties", "required", "additionalProperties", "enum", "const", "pattern", "minLength",
             "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "items", "minItems", "maxItems", "anyOf", "$ref", "$defs"} | ANNOTATIONS
UNESCAPED = CharSet.but(MUST_ESCAPE)                      # a string character that needs no escape
DIGIT, NONZERO = CharSet.of("0123456789"), CharSet.of("123456789")
HEX = CharSet.of("0123456789abcdefABCDEF")
KEYWORDS_OF_TYPE = {"string": {"pattern", "minLength", "maxLength"},
                    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
                    "number": {"minimum", "maximum"},
                    "object": {"properties", "required", "additionalProperties"},
                    "array": {"items", "minItems", "maxItems"}}
TYPE_SPECIFIC = set().union(*KEYWORDS_OF_TYPE.values())
APPLIES_TO = {k: {t for t, ks in KEYWORDS_OF_TYPE.items() if k in ks} for k in TYPE_SPECIFIC}
APPLIES_TO.update({k: {"integer", "number"} for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")})


def compile_json_schema(schema: dict[str, Any]) -> Grammar:
    """The grammar of the compact JSON documents `schema` accepts (see the module docstring for the subset); a
    ValueError where the schema uses what the subset lacks, or where no document can finish."""
    compiler = _Compiler(schema)
    compiler.grammar.rule("root", [compiler.value(schema, "root")])
    compiler.grammar.check()
    compiler.grammar.prune()
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
        self.defs: dict[str, Any] = root.get("$defs", {}) if isinstance(root, dict) else {}
        self.refs: dict[str, str] = {}
        self.inlining: set[str] = set()          # $refs being merged with their siblings (a cycle of them is refused)
        self.escapes: dict[frozenset[str], str] = {}
        self.count = 0
        self._shared()

    def new(self, hint: str) -> str:
        self.count += 1
        return f"{hint}#{self.count}"

    def define(self, rules: dict[str, list[list[Any]]]) -> None:
        """Add rules not defined yet (a character's spelling rule is shared by every text that names it)."""
        for name, alternatives in rules.items():
            if name not in self.grammar.rules:
                self.grammar.rule(name, *alternatives)

    def _shared(self) -> None:
        g = self.grammar
        # a string character: raw, or one escape; a surrogate pair is one escape (one code point, as maxLength
        # counts), a lone surrogate none (it is no character)
        g.rule("escape", ["\\", "escape.tail"])
        g.rule("escape.tail", [CharSet.of('"\\/bfnrt')], ["u", "u.bmp"], ["u", "u.high", "\\", "u", "u.low"])
        g.rule("u.bmp", [CharSet.of("0123456789abcefABCEF"), HEX, HEX, HEX],
               [CharSet.of("dD"), CharSet.of("01234567"), HEX, HEX])
        g.rule("u.high", [CharSet.of("dD"), CharSet.of("89abAB"), HEX, HEX])
        g.rule("u.low", [CharSet.of("dD"), CharSet.of("cdefCDEF"), HEX, HEX])
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
        if "const" in schema or "enum" in schema:
            return self.enum(schema, hint)
        if "$ref" in schema:
            return self.ref(schema, hint)
        if "anyOf" in schema:
            return self.any_of(schema, hint)
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise ValueError(f"{hint}: keyword 'type' is an empty list: no value has none of the types")
            return self.grammar.rule(self.new(hint + ".type"),
                                     *[[self.value({**schema, "type": k}, hint)] for k in kind])
        builders = {"string": self.string, "integer": self.integer, "number": self.number, "object": self.object,
                    "array": self.array, "boolean": lambda s, h: "boolean", "null": lambda s, h: "null"}
        if kind not in builders:
            raise ValueError(f"{hint}: keyword 'type' must be one of {sorted(builders)} (or a list of them), "
                             f"got {kind!r}")
        self._refuse(schema, hint, kind)
        return builders[kind]({k: v for k, v in schema.items() if kind in APPLIES_TO.get(k, {kind})}, hint)

    def _refuse(self, schema: dict[str, Any], hint: str, kind: str) -> None:
        """Keywords that apply to `kind` (JSON Schema's: a string keyword constrains strings only) and that this
        compiler does not support on it: an error rather than a grammar that ignores them. A keyword of another type
        constrains nothing here (`{"type": ["string", "null"], "maxLength": 20}`: null is valid) and is dropped."""
        applying = {k for k in set(schema) & TYPE_SPECIFIC if kind in APPLIES_TO[k]}
        if wrong := sorted(applying - KEYWORDS_OF_TYPE.get(kind, set())):
            raise ValueError(f"{hint}: keyword {wrong[0]!r} is not supported on type {kind!r}")

    def enum(self, schema: dict[str, Any], hint: str) -> str:
        """One alternative per value of `enum` (or the `const`) that the sibling keywords accept, checked by the
        `jsonschema` validator (a finite set is exact whatever the siblings say); none left is an error."""
        import jsonschema

        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list):
            raise ValueError(f"{hint}: keyword 'enum' must be a list, got {values!r}")
        siblings = {k: v for k, v in schema.items() if k not in ANNOTATIONS and k not in ("const", "$defs")}
        if set(siblings) - {"enum"}:
            validator = jsonschema.Draft202012Validator({**siblings, "$defs": self.defs})
            values = [v for v in values if validator.is_valid(v)]
        if not values:
            keyword = "const" if "const" in schema else "enum"
            beside = f" that its sibling keywords ({', '.join(sorted(set(siblings) - {'enum'}))}) accept" \
                if set(siblings) - {"enum"} else ""
            raise ValueError(f"{hint}: keyword {keyword!r} leaves no value{beside}: no document can match")
        alternatives = []
        for v in values:
            symbols, rules = spelled(json.dumps(v, separators=(",", ":"), ensure_ascii=False))
            self.define(rules)
            alternatives.append(symbols)
        return self.grammar.rule(self.new(hint + ".enum"), *alternatives)

    def any_of(self, schema: dict[str, Any], hint: str) -> str:
        """One alternative per branch, each merged with the keywords beside `anyOf` (schema_merge.merge); a branch
        whose types do not meet the siblings' is dropped."""
        branches = schema["anyOf"]
        if not isinstance(branches, list) or not branches:
            raise ValueError(f"{hint}: keyword 'anyOf' must be a non-empty list of schemas")
        siblings = {k: v for k, v in schema.items() if k != "anyOf" and k not in IGNORED_BESIDE}
        alternatives = []
        for i, branch in enumerate(branches):
            where = f"{hint}.anyOf[{i}]"
            merged = merge(siblings, branch, where) if siblings else branch
            if merged is not None:
                alternatives.append([self.value(merged, where)])
        if not alternatives:
            raise ValueError(f"{hint}: keyword 'type' beside anyOf meets no branch's type: no document can match")
        return self.grammar.rule(self.new(hint + ".anyOf"), *alternatives)

    def ref(self, schema: dict[str, Any], hint: str) -> str:
        """`$ref` to `#/$defs/<name>`: the definition's rule (one per name, so recursion is a cycle of rules); with
        sibling keywords, the definition merged with them, inline."""
        ref = schema["$ref"]
        prefix = "#/$defs/"
        if not isinstance(ref, str) or not ref.startswith(prefix) or ref[len(prefix):] not in self.defs:
            raise ValueError(f"{hint}: keyword '$ref' {ref!r}: only references to #/$defs/<name> with that name defined are "
                             "supported")
        name = ref[len(prefix):]
        siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in IGNORED_BESIDE}
        if siblings:
            if name in self.inlining:
                raise ValueError(f"{hint}: keyword '$ref' {ref!r} with siblings refers back to itself")
            merged = merge(siblings, self.defs[name], f"{hint}.$ref")
            if merged is None:
                raise ValueError(f"{hint}: keyword 'type' beside $ref {ref!r} meets none of its types")
            self.inlining.add(name)
            try:
                return self.value(merged, f"{hint}.$ref")
            finally:
                self.inlining.discard(name)
        if name not in self.refs:
            self.refs[name] = rule = f"def:{name}"
            self.grammar.rule(rule, [self.value(self.defs[name], rule)])
        return self.refs[name]

    def string(self, schema: dict[str, Any], hint: str) -> str:
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise ValueError(f"{hint}: keyword 'pattern' together with 'minLength'/'maxLength' is not supported")
            try:
                dfa = RegexAutomaton.compile(whole_string_pattern(schema["pattern"]))
            except ValueError as err:
                raise ValueError(f"{hint}: keyword 'pattern': {err}") from None
            body = self.automaton(dfa, hint + ".pattern")
        else:
            low, high = schema.get("minLength", 0), schema.get("maxLength")
            body = self.repeat(["char"], low, high, hint + ".chars", separator=None, keywords="'minLength'/'maxLength'")
        return self.grammar.rule(self.new(hint + ".string"), ['"', body, '"'])

    def automaton(self, dfa: RegexAutomaton, hint: str) -> str:
        """A right-linear rule per live state of `dfa`, a string's characters spelled as JSON writes them: raw where
        they may be, escaped where they must be (a quote, a backslash, a control character), and a non-ASCII
        character the pattern names also as its \\u escape (json_text.py)."""
        if not dfa.live(dfa.start):
            raise ValueError(f"{hint}: keyword 'pattern' {dfa.pattern!r} matches no string")
        listed = frozenset(dfa.symbols)
        names = {q: f"{hint}@{q}#{self.count + 1}" for q in dfa.live_states}
        self.count += 1
        for q, name in names.items():
            alternatives: list[list[Any]] = [[]] if dfa.accepting(q) else []
            for symbol, nxt in dfa.transitions[q].items():
                if nxt not in names:
                    continue
                chars = {c for c, s in dfa.symbols.items() if s == symbol}
                read = CharSet.but(listed) if symbol == dfa.other else CharSet.of(chars)
                allowed = read & UNESCAPED
                if allowed.negated or allowed.chars:
                    alternatives.append([allowed, names[nxt]])
                escaped = {c for c in MUST_ESCAPE if c in read} | {c for c in chars if ord(c) >= 0x80}
                if escaped:
                    alternatives.append([self.escaped(frozenset(escaped)), names[nxt]])
            self.grammar.rule(name, *alternatives)
        return names[dfa.start]

    def escaped(self, chars: frozenset[str]) -> str:
        """A rule reading one escaped spelling of any character of `chars` (one per set, shared)."""
        if chars not in self.escapes:
            self.escapes[chars] = name = self.new("escaped")
            self.define(escape_rules(name, chars))
        return self.escapes[chars]

    def repeat(self, item: list[Any], low: int, high: int | None, hint: str, separator: str | None,
               keywords: str) -> str:
        """item{low,high} (high None: no bound), `separator` between items; one rule per count up to the bound
        (`keywords`: the bounds' names, for the error where they are not a range)."""
        if low < 0 or (high is not None and high < low):
            raise ValueError(f"{hint}: keywords {keywords}: bounds [{low}, {high}] are not a range")
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
            raise ValueError(f"{hint}: keywords 'minimum'/'maximum': no integer lies in [{low}, {high}]")
        return self.automaton(RegexAutomaton.compile(integer_range_pattern(low, high)), hint + ".range")

    def number(self, schema: dict[str, Any], hint: str) -> str:
        low, high = _bound(schema, "minimum", hint), _bound(schema, "maximum", hint)
        if low is None and high is None:
            return "number"
        if low is not None and high is not None and low > high:
            raise ValueError(f"{hint}: keywords 'minimum'/'maximum': no number lies in [{low}, {high}]")
        return self.automaton(RegexAutomaton.compile(number_range_pattern(low, high)), hint + ".range")

    def object(self, schema: dict[str, Any], hint: str) -> str:
        if schema.get("additionalProperties", False) is not False:
            raise ValueError(f"{hint}: keyword 'additionalProperties' other than false is not supported")
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        if missing := sorted(required - set(props)):
            raise ValueError(f"{hint}: keyword 'required' names {missing[0]!r}, which is not in properties")
        members = [(key, self.value(props[key], f"{hint}.{key}"), key in required) for key in props]
        name = self.new(hint + ".object")
        self.define(object_rules(name, members))
        return name

    def array(self, schema: dict[str, Any], hint: str) -> str:
        if "items" not in schema:
            raise ValueError(f"{hint}: an array needs keyword 'items' (a schema for its elements)")
        item = self.value(schema["items"], hint + "[]")
        body = self.repeat([item], schema.get("minItems", 0), schema.get("maxItems"), hint + ".items", separator=",",
                           keywords="'minItems'/'maxItems'")
        return self.grammar.rule(self.new(hint + ".array"), ["[", body, "]"])


def object_rules(name: str, members: list[tuple[str, str, bool]]) -> dict[str, list[list[str]]]:
    """The rules of a compact JSON object, rule `name`: `members` = [(key, the value's rule, required)], written in
    this order, each optional one may be left out, nothing else admitted. A symbol is a one-character terminal or a
    rule's name.

    Two rules per position i: first_i (no member written yet; the next one needs no comma) and rest_i (some
    written; the next one starts with ","); a required member has no alternative that skips it. A non-ASCII character
    of a key is a rule of its own (`U+00E9`: raw or its \\u escapes, json_text.char_rule), returned with the others:
    the course tokenizer has no token that writes it raw."""
    first = [f"{name}.first{i}" for i in range(len(members) + 1)]
    rest = [f"{name}.rest{i}" for i in range(len(members) + 1)]
    rules: dict[str, list[list[str]]] = {name: [["{", first[0], "}"]], first[-1]: [[]], rest[-1]: [[]]}
    for i, (key, value, required) in enumerate(members):
        key_symbols, char_rules = spelled(json.dumps(key, ensure_ascii=False))
        rules.update(char_rules)
        member = [*key_symbols, ":", value]
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
        raise ValueError(f"{hint}: keyword {keyword!r} must be a whole number here, got {value!r}")
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
