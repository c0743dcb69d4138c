r"""How a character is spelled inside a JSON string, as grammar symbols (lab 10).

A character c of a JSON string is written raw (unless it is `"`, `\` or a control character, which must be escaped),
with a short escape (`\"`, `\\`, `\n`, ...) where it has one, or as `\uXXXX` of its code point, hex digits in either
case; a code point above U+FFFF takes two, the UTF-16 surrogate pair (😀 is `\ud83d\ude00`). A token mask only
allows tokens whose text the grammar reads, and the course tokenizer has no token for any non-ASCII character (it
writes é as two byte pieces, neither a character): a grammar that names é raw only would dead-end there, so every
non-ASCII character a grammar names gets its `\u` spellings beside the raw one:

    symbols, rules = spelled('"é"')       # ['"', 'U+00E9', '"'], {'U+00E9': [['é'], [*'\\u00e9'], [*'\\u00E9']]}
    escape_rules("esc", {'"', "\n"})      # {'esc': [['\\', 'esc.tail']],
                                          #  'esc.tail': [[CharSet('"n')], [*'u000', CharSet('aA')], [*'u0022']]}

Symbols are a grammar's (grammar.py): a one-character string is a terminal, a longer one a rule's name.
"""

from __future__ import annotations

from typing import Any, Iterable

from minigpt.structured.grammar import CharSet

__all__ = ["CONTROL", "MUST_ESCAPE", "SHORT_ESCAPES", "unicode_escapes", "char_rule", "spelled", "escape_rules"]

CONTROL = frozenset(chr(i) for i in range(0x20))
MUST_ESCAPE = CONTROL | {'"', "\\"}                      # RFC 8259: never raw inside a string
SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}


def _utf16(ch: str) -> list[int]:
    """The UTF-16 code units of one character: itself below U+10000, else the surrogate pair."""
    cp = ord(ch)
    if cp < 0x10000:
        return [cp]
    cp -= 0x10000
    return [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]


def unicode_escapes(ch: str) -> list[str]:
    r"""`ch` as \uXXXX escapes (a surrogate pair above U+FFFF), hex digits all lower case and all upper case."""
    lower = "".join(f"\\u{unit:04x}" for unit in _utf16(ch))
    return list(dict.fromkeys([lower, lower.replace("\\u", "\0").upper().replace("\0", "\\u")]))


def char_rule(ch: str) -> tuple[str, list[list[str]]]:
    """The rule reading one spelling of a non-ASCII character: its name (`U+00E9`) and its alternatives (raw, where
    it is a whole character, and its \\u escapes); every symbol a string, as `object_rules` returns them."""
    raw = [[ch]] if not 0xD800 <= ord(ch) <= 0xDFFF else []          # a lone surrogate has no raw UTF-8 spelling
    return f"U+{ord(ch):04X}", raw + [list(e) for e in unicode_escapes(ch)]


def spelled(text: str) -> tuple[list[str], dict[str, list[list[str]]]]:
    """The symbols of a compact JSON text (already escaped where JSON must escape, as `json.dumps` writes it): an ASCII
    character reads itself, a non-ASCII one is its `char_rule`; and those rules."""
    symbols, rules = [], {}
    for ch in text:
        if ord(ch) < 0x80:
            symbols.append(ch)
        else:
            name, alternatives = char_rule(ch)
            symbols.append(name)
            rules[name] = alternatives
    return symbols, rules


def _hex(unit: int) -> list[Any]:
    """A code unit's four hex digits, each a terminal that takes either case."""
    return [d if d.isdigit() else CharSet.of({d, d.upper()}) for d in f"{unit:04x}"]


def escape_rules(name: str, chars: Iterable[str]) -> dict[str, list[list[Any]]]:
    """Rule `name` reads one escaped spelling of any character of `chars`: `\\` then a short escape letter or `u` and
    the code units' hex digits (every control character at once: `u00` [01] hex)."""
    chars = set(chars)
    tail = f"{name}.tail"
    alternatives: list[list[Any]] = []
    if short := {SHORT_ESCAPES[c] for c in chars if c in SHORT_ESCAPES}:
        alternatives.append([CharSet.of(short)])
    if CONTROL <= chars:
        alternatives.append(["u", "0", "0", CharSet.of("01"), CharSet.of("0123456789abcdefABCDEF")])
        chars -= CONTROL
    for ch in sorted(chars):
        units = _utf16(ch)
        alternatives.append(["u", *_hex(units[0]), *(["\\", "u", *_hex(units[1])] if len(units) == 2 else [])])
    return {name: [["\\", tail]], tail: alternatives}
