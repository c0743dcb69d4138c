"""Exercise 3: the grammar rules of a JSON object with required and optional properties.

    check_object_rules(object_rules)    object_rules(name, members) -> {rule: [alternative, ...]}, plain data; the
                                        judge adds the rules to its own grammar (whose value rules the members
                                        name), and the documents it accepts are compared with the reference's on
                                        every subset of the optional members and on the near misses (a required
                                        member left out, members out of order or twice, an extra property, a
                                        comma too many or too few)

The learner's rules arrive as data (lists of strings) and are run by the judge's recognizer: nothing of the
learner's runs when documents are accepted or refused.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Callable

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.harness import call_learner
from minigpt.structured import json_schema
from minigpt.structured.grammar import Grammar

WHAT = "Exercise 3 (object_rules)"
REFERENCES = (json_schema.object_rules, json_schema.compile_json_schema)
# the value schemas the members use, and sample values of each (valid ones first)
VALUES = {"name": ({"type": "string", "maxLength": 6}, ["Ada", ""]),
          "age": ({"type": "integer", "minimum": 0, "maximum": 130}, [36, 0]),
          "ok": ({"type": "boolean"}, [True, False]),
          "tags": ({"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}, [["a", "bc"], []])}
CASES = {
    "two required": [("name", "name", True), ("age", "age", True)],
    "required and optional": [("id", "age", True), ("note", "name", False), ("tags", "tags", False), ("ok", "ok", True)],
    "all optional": [("a", "age", False), ("b", "ok", False), ("c", "name", False)],
    "no property": [],
    "a key to escape": [('say "hi"', "name", True), ("é", "ok", False)],
}


def _judge_grammar() -> tuple[Grammar, Any, dict[str, str]]:
    """A grammar holding the value rules (compiled by the package), and the rule name of each value schema."""
    compiler = json_schema._Compiler({})
    rules = {kind: compiler.value(schema, f"value.{kind}") for kind, (schema, _) in VALUES.items()}
    return compiler.grammar, compiler, rules


def _documents(members: list[tuple[str, str, bool]]) -> list[str]:
    """Compact documents: every subset of the optional members in order, then the near misses."""
    def dump(pairs: list[tuple[str, Any]]) -> str:
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + json.dumps(v, separators=(",", ":"),
                                                                                ensure_ascii=False)
                              for k, v in pairs) + "}"
    valid = lambda key, kind, i=0: (key, VALUES[kind][1][i % 2])
    optional = [i for i, m in enumerate(members) if not m[2]]
    docs = []
    for r in range(len(optional) + 1):
        for chosen in itertools.combinations(optional, r):
            pairs = [valid(k, kind, r) for i, (k, kind, req) in enumerate(members) if req or i in chosen]
            docs.append(dump(pairs))
    full = [valid(k, kind) for k, kind, _ in members]
    if full:
        docs += [dump(full[1:]), dump(full[:-1]), dump(full[::-1]), dump(full + full[-1:]), dump(full + [("extra", 1)]),
                 dump([full[0], ("extra", 1), *full[1:]])]
        body = dump(full)[1:-1]
        docs += ["{" + body + ",}", "{," + body + "}", "{" + body.replace(",", ",,", 1) + "}",
                 "{" + body.replace(",", "", 1) + "}", "{" + body.replace(":", " : ", 1) + "}", body]
    docs += ["{}", "{,}", '{"":1}', '{"extra":1}', "[]"]
    return list(dict.fromkeys(docs))


def _validate(rules: Any, name: str, known: set[str], where: str) -> None:
    if not isinstance(rules, dict):
        raise AssertionError(f"{where}: return a dict {{rule name: [alternative, ...]}}, got {type(rules).__name__}")
    if name not in rules:
        raise AssertionError(f"{where}: the rules must define the object's own rule {name!r} (the name you were given)")
    for rule, alternatives in rules.items():
        if not isinstance(rule, str) or len(rule) < 2:
            raise AssertionError(f"{where}: rule names are strings of two characters or more, got {rule!r}")
        if rule in known:
            raise AssertionError(f"{where}: {rule!r} is already a rule of the grammar (a value's); pick names "
                                 f"that start with {name!r}")
        if not isinstance(alternatives, list) or not all(isinstance(a, list) for a in alternatives):
            raise AssertionError(f"{where}: rule {rule!r} must map to a list of alternatives, each a list of symbols")
        for alt in alternatives:
            for symbol in alt:
                if not isinstance(symbol, str) or not symbol:
                    raise AssertionError(f"{where}: rule {rule!r} has symbol {symbol!r}; a symbol is a one-character "
                                         "string (a terminal) or a rule's name")
                if len(symbol) > 1 and symbol not in rules and symbol not in known:
                    raise AssertionError(f"{where}: rule {rule!r} uses {symbol!r}, which is neither a rule you "
                                         "returned nor a value rule you were given (write a key's characters as "
                                         "one terminal each: [*'\"name\":'])")


def _hint(doc: str, accepted: bool, members: list[tuple[str, str, bool]]) -> str:
    if accepted and "extra" in doc:
        return "no property outside `members` may appear (additionalProperties: false)"
    if accepted and any(req and json.dumps(k, ensure_ascii=False) + ":" not in doc for k, _, req in members):
        return "a required member may not be left out"
    if accepted:
        return "members come in the given order, once each, separated by single commas, with no whitespace"
    return ("every optional member may be left out, whichever others are written (and the comma before a member "
            "depends on whether any member came before it, not on its position)")


def check_object_rules(rules_fn: Callable) -> None:
    """rules_fn(name, members) -> {rule: [[symbol, ...], ...]}: the compact object `name` with `members` =
    [(key, value rule, required)] in that order, each optional one skippable, nothing else."""
    own_work(rules_fn, REFERENCES, what=WHAT)
    for case, spec in CASES.items():
        grammar, _, value_rules = _judge_grammar()
        members = [(key, value_rules[kind], required) for key, kind, required in spec]
        name = f"obj.{case.replace(' ', '_')}"
        where = f"{WHAT}, {case}: members {[(k, kind, r) for k, kind, r in spec]}"
        with no_calls_into(*REFERENCES, what=WHAT):
            got = call_learner(WHAT, rules_fn, name, [list(m) for m in members])
        _validate(got, name, set(grammar.rules), where)
        theirs = Grammar("root", {k: list(v) for k, v in grammar.rules.items()})
        for rule, alternatives in got.items():
            theirs.rule(rule, *alternatives)
        theirs.rule("root", [name])
        try:
            theirs.check()
        except ValueError as err:
            raise AssertionError(f"{where}: {err}") from None
        ours, _, _ = _judge_grammar()
        for rule, alternatives in json_schema.object_rules(name, members).items():
            ours.rule(rule, *alternatives)
        ours.rule("root", [name])
        for doc in _documents(spec):
            want, have = ours.matches(doc), theirs.matches(doc)
            if want != have:
                raise AssertionError(f"{where}: your grammar {'accepts' if have else 'refuses'} {doc}, which it must "
                                     f"{'accept' if want else 'refuse'}: {_hint(doc, have, spec)}")
