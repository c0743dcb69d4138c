"""The course package's code, function by function, as the similarity report compares it.

Every function, class and method of `minigpt` (shared/minigpt) is a unit: its source, the fingerprints of its
normal form, and the bytecode Python compiles it to (what `marshal` or `pickle` carries of a function, found in a
blob however it is encoded). Read from the package's files (SHARED_DIR) without importing it.
"""

from __future__ import annotations

import ast
import functools
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

from autograder.grading import normal_form
from autograder.grading.fingerprints import Fingerprints, fingerprints
from autograder.paths import SHARED_DIR

PACKAGE = "minigpt"
MIN_BYTECODE = 48         # bytes of bytecode: shorter code objects (a getter, a one-line property) name nothing


@dataclass(frozen=True)
class Unit:
    """One function, class or method of the package (a class: its methods' fingerprints together)."""
    name: str                 # dotted: minigpt.engine.scheduler.Scheduler.schedule
    source: str
    fingerprints: Fingerprints
    owner: str | None = None  # the class a method belongs to (its dotted name), else None


def package_root() -> Path:
    """The course package's folder (shared/minigpt, the one learners import)."""
    return SHARED_DIR / PACKAGE


def _modules() -> list[tuple[str, str]]:
    """(dotted module name, source) of every file of the package, in a stable order."""
    root = package_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path.read_text(encoding="utf-8")))
    return out


def _first_line(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _source(lines: list[str], node: ast.stmt) -> str:
    return textwrap.dedent("\n".join(lines[_first_line(node) - 1:node.end_lineno]))


def _function(name: str, lines: list[str], node: ast.stmt, owner: str | None = None) -> Unit:
    first = _first_line(node)
    return Unit(name, _source(lines, node), fingerprints(normal_form.serialise([node], first)), owner)


def _class(module: str, lines: list[str], node: ast.ClassDef) -> list[Unit]:
    """The class (the fingerprints of all its methods) and each of its methods."""
    name = f"{module}.{node.name}"
    methods = [(m, _function(f"{name}.{m.name}", lines, m, name)) for m in node.body
               if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    whole = Fingerprints()
    for m, unit in methods:
        whole = whole.merged(unit.fingerprints, _first_line(m) - _first_line(node))
    return [Unit(name, _source(lines, node), whole)] + [unit for _, unit in methods]


@functools.lru_cache(maxsize=1)
def units() -> tuple[Unit, ...]:
    """The package's functions, classes and the methods of its classes."""
    out = []
    for module, text in _modules():
        lines = text.splitlines()
        for node in normal_form.without_no_ops(ast.parse(text)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(_function(f"{module}.{node.name}", lines, node))
            elif isinstance(node, ast.ClassDef):
                out += _class(module, lines, node)
    return tuple(out)


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


@functools.lru_cache(maxsize=1)
def bytecode() -> dict[bytes, str]:
    """{bytecode of a function of the package: its dotted name}, for functions with MIN_BYTECODE bytes or more."""
    out: dict[bytes, str] = {}
    for module, text in _modules():
        for code in _code_objects(compile(text, f"<{module}>", "exec")):
            if code.co_name != "<module>" and len(code.co_code) >= MIN_BYTECODE:
                out.setdefault(code.co_code, f"{module}.{code.co_qualname}")
    return out
