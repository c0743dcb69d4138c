"""Keywords beside `anyOf` or `$ref` (lab 10): JSON Schema (Draft 2020-12) applies them too, so a value must satisfy
the siblings and a branch (the referenced schema) at once. The compiler writes that conjunction as one schema:

    merge({"type": "string", "maxLength": 3}, {"type": ["string", "null"], "pattern": "[a-z]+"}, "root.anyOf[0]")
    # {"type": "string", "maxLength": 3, "pattern": "[a-z]+"}

A keyword in one of them only is copied. A keyword in both: equal values stay; `type` becomes the intersection (an
integer is a number); `required` the union; a lower bound the larger, an upper bound the smaller; `enum` (or `const`)
the values in both. Anything else in both raises ValueError naming the keyword (the conjunction of two `properties`
or `items` is not one of them). None: the types do not meet, no value satisfies both.
"""

from __future__ import annotations

from typing import Any

__all__ = ["merge", "types_of", "IGNORED_BESIDE"]

TYPES = ("string", "integer", "number", "boolean", "null", "object", "array")
LOWER = {"minimum", "exclusiveMinimum", "minLength", "minItems"}
UPPER = {"maximum", "exclusiveMaximum", "maxLength", "maxItems"}
IGNORED_BESIDE = {"title", "description", "$schema", "$id", "default", "examples", "$comment", "$defs"}


def types_of(schema: dict[str, Any]) -> set[str] | None:
    """The types `schema` names (None: no `type`, any type)."""
    kind = schema.get("type")
    if kind is None:
        return None
    return set(kind) if isinstance(kind, list) else {kind}


def _meet(a: set[str], b: set[str]) -> set[str]:
    """Types in both: an integer is a number, so number and integer meet at integer."""
    out = a & b
    if "integer" in a and "number" in b or "number" in a and "integer" in b:
        out.add("integer")
    return out


def _enum(schema: dict[str, Any]) -> list[Any] | None:
    return [schema["const"]] if "const" in schema else schema.get("enum")


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True is not 1."""
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                             and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def merge(siblings: dict[str, Any], branch: Any, where: str) -> dict[str, Any] | None:
    """One schema for "`siblings` and `branch`" (see the module docstring); None where their types do not meet."""
    if branch is True or branch == {}:
        return dict(siblings)
    if not isinstance(branch, dict):
        raise ValueError(f"{where}: a schema must be an object, got {branch!r}")
    out = dict(branch)
    for key, value in siblings.items():
        if key in ("enum", "const"):
            continue
        if key in IGNORED_BESIDE or key not in out or out[key] == value:
            out.setdefault(key, value)
        elif key == "type":
            kinds = _meet(types_of(siblings), types_of(branch))
            if not kinds:
                return None
            out["type"] = sorted(kinds, key=TYPES.index) if len(kinds) > 1 else kinds.pop()
        elif key == "required":
            out["required"] = list(dict.fromkeys([*out["required"], *value]))
        elif key in LOWER:
            out[key] = max(out[key], value)
        elif key in UPPER:
            out[key] = min(out[key], value)
        else:
            raise ValueError(f"{where}: keyword {key!r} both beside anyOf/$ref and in the branch, with another value: "
                             "their conjunction is not supported")
    if (values := _enum(siblings)) is not None:
        mine = _enum(branch)
        out.pop("const", None)
        out["enum"] = values if mine is None else [v for v in mine if any(_same(v, w) for w in values)]
    return out
