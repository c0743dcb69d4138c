"""A copy of the course package with an exercise's reference taken out: the package of the witness.

A check that refuses the reference (`own_work`, `no_calls_into`, `watched` in autograder/checking/reference_guard.py)
names the reference it guards. When such a test cell passes against the learner's kernel, the judge has it
graded again against a *witness* (autograder/judging/witness.py): a fresh process whose `minigpt` is a copy of the
package in which each function of that reference has lost its body:

    def schedule(self, ...):                      def schedule(self, ...):
        ...the reference's code...        ->          raise RuntimeError("[removed for grading: ...] ...")

The reference's code is not in that process and not in its file system (the copy is bound over the package's
folder in the witness's sandbox), so whatever the learner's code does there (a subclass calling `super()`, a
wrapper, reading the package's source and running it, a rewritten serving loop) it cannot borrow the reference:
a thin wrapper stops working, and the check fails there.

    removals(guards) -> [(file, qualname, first line), ...]       in the judge, from what the checks guarded
    package_without(removals, dest) -> dest/shared                 in the grading process, before the witness
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Any, Iterable

from autograder.paths import SHARED_DIR

__all__ = ["MARKER", "removals", "package_without", "removed_name"]

MARKER = "[removed for grading: the course's reference]"


def removals(guards: Iterable[dict]) -> list[list[Any]]:
    """Every function the guarded references define in the course package, less the ones a guard allows:
    [relative file, qualified name, first line] each (decorators included in the first line)."""
    from autograder.checking import reference_guard, wire

    out: dict[tuple[str, str], int] = {}
    for guard in guards:
        refs = []
        for path in guard["refs"]:
            try:
                refs.append(wire.trusted_object(path))
            except ValueError:     # a library's function named as the reference (torch's): not the course's to remove
                continue
        allowed = set(guard.get("allow", ()))
        for code, name in reference_guard.code_objects(refs).items():
            path = Path(code.co_filename)
            if name in allowed or not path.is_absolute() or not path.resolve().is_relative_to(SHARED_DIR):
                continue           # generated code (a dataclass's __init__) or code outside the package
            out[(str(path.resolve().relative_to(SHARED_DIR)), code.co_qualname)] = code.co_firstlineno
    return [[file, qualname, line] for (file, qualname), line in sorted(out.items())]


def package_without(removed: list[list[Any]], dest: Path) -> Path:
    """A copy of the course package (SHARED_DIR) under dest/shared in which each removed function raises
    RuntimeError(MARKER ...) instead of running; returns dest/shared."""
    shadow = Path(dest) / "shared"
    shutil.copytree(SHARED_DIR, shadow, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    by_file: dict[str, dict[str, int]] = {}
    for file, qualname, line in removed:
        target = (shadow / file).resolve()
        if not target.is_relative_to(shadow.resolve()) or target.suffix != ".py":
            raise ValueError(f"not a module of the course package: {file!r}")
        by_file.setdefault(file, {})[qualname] = int(line)
    for file, targets in by_file.items():
        path = shadow / file
        path.write_text(_without(path.read_text(), targets, file))
    return shadow


def removed_name(text: str) -> str | None:
    """The qualified name a removed function's error names, if `text` quotes one."""
    if MARKER not in text:
        return None
    rest = text.split(MARKER, 1)[1].strip()
    return rest.split()[0].strip("'\".,:;)") if rest else "?"


def _without(source: str, targets: dict[str, int], file: str) -> str:
    """source with the body of each function in targets ({qualname: first line}) replaced by a raise."""
    tree = ast.parse(source)
    found: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                if qualname in targets and targets[qualname] in (first, child.lineno):
                    child.body = [_raise(qualname)]
                    found.add(qualname)
                visit(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    missing = set(targets) - found
    if missing:
        raise ValueError(f"{file}: no function {', '.join(sorted(missing))} at the line its code names")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _raise(qualname: str) -> ast.stmt:
    message = ast.Constant(f"{MARKER} {qualname}")
    return ast.Raise(exc=ast.Call(func=ast.Name("RuntimeError", ast.Load()), args=[message], keywords=[]),
                     cause=None)
