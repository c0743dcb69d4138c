"""A copy of the course package with an exercise's reference taken out: the package of the witness.

A check that refuses the reference (`own_work`, `no_calls_into`, `watched` in autograder/checking/reference_guard.py)
names the reference it guards. When such a test cell passes against the learner's kernel, the judge has it
graded again against a *witness* (autograder/judging/witness.py): a fresh process whose `minigpt` is a copy of the
package in which each function of that reference, and each of the reference's own helpers, has lost its body:

    def schedule(self, ...):                      def schedule(self, ...):
        ...the reference's code...        ->          raise RuntimeError("[removed for grading: ...] ...")

The reference's code is not in that process and not in its file system (the copy is bound over the package's
folder in the witness's sandbox), so whatever the learner's code does there (a subclass calling `super()`, a
wrapper, reading the package's source and running it, a rewritten serving loop, or the reference's body typed again
as calls of the helpers it calls) it cannot borrow the reference: it stops working, and the check fails there.

Which functions go (the rule):

    removed = the reference's functions (of a class: its methods), less those the guard allows
            + its helpers: the module-level functions of the reference's own module (file) that these name, by a
              call or passed on, transitively (lab 07: shard_parameter -> shard_slices -> _heads_to_rows, ...)
            - what the learner may use, and every function of the package that it names in turn:
                * every reference the course offers to continue with (autograder/exercise_map.json), so that an
                  exercise may build on an earlier one's reference;
                * what the guard allows (a constructor the exercise's API needs);
                * what the module runs when it is imported (decorators, defaults, class bodies);
                * a helper the lab hands the learner: named in the released notebook of the lab whose check
                  refused the reference (labs/NN_topic/*.ipynb: its instructions, setup, stubs and demos; lab 09's
                  `ra.ring_pass`, lab 08's `ring_hash`, lab 07's `sharding.query_heads`, never its `shard_slices`).
                  The grading process reads that notebook (the judge, sandboxed, cannot): a guard without a lab, or
                  a lab without a released notebook, hands none over.

Functions of other modules stay (the model, the caches, configs, another module's tools: lab 07's `make_tp_cache`
uses `sharding.kv_heads`, which its reference also calls), and so do classes, which lose only the guarded class's own
methods. A function reached through an object (`self.pool.allocate()`) is not followed.

    removals(guards) -> [[file, qualname, first line, helper], ...]   in the judge, from what the checks guarded
    package_without(removals, dest) -> dest/shared                     in the grading process, before the witness

`helper` is None for the reference's own functions, and {"labs": [...], "reaches": [...]} for a helper (the labs whose
checks refused the reference, the other helpers it names, transitively): kept with it when the lab hands it over.
"""

from __future__ import annotations

import ast
import dis
import importlib
import inspect
import json
import re
import shutil
import sys
from functools import lru_cache
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, Iterable, Iterator

from autograder.paths import REPO_ROOT, SHARED_DIR

__all__ = ["MARKER", "removals", "package_without", "removed_name"]

MARKER = "[removed for grading: the course's reference]"
HELPER_NOTE = "(a helper of the reference)"     # after a removed helper's name in its error
LABS_DIR = REPO_ROOT / "labs"                   # the released notebooks, labs/NN_topic/*.ipynb

_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def removals(guards: Iterable[dict]) -> list[list[Any]]:
    """Every function the guarded references define in the course package, less the ones a guard allows, and the
    reference's helpers (the module docstring's rule): [relative file, qualified name, first line (decorators
    included), helper] each."""
    from autograder.checking import reference_guard, wire

    refused: set[CodeType] = set()
    allowed: set[CodeType] = set()
    labs: set[str] = set()
    for guard in {json.dumps(g, sort_keys=True): g for g in guards}.values():     # a watch per call: many the same
        refs = []
        for path in guard["refs"]:
            try:
                refs.append(wire.trusted_object(path))
            except ValueError:     # a library's function named as the reference (torch's): not the course's to remove
                continue
        allow = set(guard.get("allow", ()))
        for code, name in reference_guard.code_objects(refs).items():
            if _in_package(code):  # not generated code (a dataclass's __init__) or code outside the package
                (allowed if name in allow else refused).add(code)
        if guard.get("lab"):
            labs.add(guard["lab"])
    seeds = (_continue_with() | allowed | _run_on_import(refused)) - refused
    helpers = _helpers(refused) - _reachable(seeds, avoid=refused)
    out = [_entry(code, None) for code in refused]
    for code in helpers:
        reaches = sorted(c.co_qualname for c in _reachable({code}, avoid=refused) & helpers if c is not code)
        out.append(_entry(code, {"labs": sorted(labs), "reaches": reaches}))
    return sorted(out, key=lambda entry: entry[:3])


def _entry(code: CodeType, helper: dict | None) -> list[Any]:
    return [str(Path(_real(code.co_filename)).relative_to(SHARED_DIR)), code.co_qualname, code.co_firstlineno, helper]


# ----------------------------------------------------------------------------- the call graph, in the judge

def _helpers(roots: set[CodeType]) -> set[CodeType]:
    """The module-level functions of the roots' own files that the roots name, transitively."""
    found: set[CodeType] = set()
    todo = list(roots)
    while todo:
        code = todo.pop()
        for callee in _callees(code):
            if (callee not in found and callee not in roots and callee.co_filename == code.co_filename
                    and callee.co_qualname == callee.co_name and not callee.co_name.startswith("<")):
                found.add(callee)
                todo.append(callee)
    return found


def _reachable(seeds: set[CodeType], avoid: set[CodeType]) -> set[CodeType]:
    """seeds and every function of the package they name, transitively, not entering `avoid`."""
    found = set(seeds)
    todo = list(seeds)
    while todo:
        for callee in _callees(todo.pop()):
            if callee not in found and callee not in avoid:
                found.add(callee)
                todo.append(callee)
    return found


@lru_cache(maxsize=None)
def _callees(code: CodeType) -> frozenset[CodeType]:
    """Code of the package's functions that `code` names (functions and comprehensions defined inside included):
    a global, an attribute of a module or class it names, a name it imports; a class named brings its methods."""
    namespace = _namespace(code.co_filename)
    return frozenset(c for chain in _name_chains(code) for c in _resolved(chain, namespace))


def _resolved(chain: list[str], namespace: dict[str, Any]) -> set[CodeType]:
    """The package's functions along a chain of names (["sharding", "shard_slices"]) looked up from `namespace`."""
    from autograder.checking.reference_guard import code_objects

    head = chain[0]
    obj = sys.modules.get(head[len("import "):]) if head.startswith("import ") else namespace.get(head)
    out: set[CodeType] = set()
    for attr in [*chain[1:], None]:
        if inspect.isclass(obj):
            out |= {c for c in code_objects([obj]) if _in_package(c)}
        fn = _function(obj)
        if fn is not None and _in_package(fn.__code__):
            out.add(fn.__code__)
        if attr is None or not (inspect.ismodule(obj) or inspect.isclass(obj)):
            break
        obj = inspect.getattr_static(obj, attr, None)
    return out


def _name_chains(code: CodeType, functions: bool = True) -> Iterator[list[str]]:
    """Each global `code` loads with the attributes read from it in a row (["sharding", "shard_slices"]), and each
    name it imports (["import minigpt.cache", "KVCache"]). functions: also in the functions defined inside (else only
    in class bodies and comprehensions, which run where they are defined)."""
    chain: list[str] | None = None
    module = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain:
            chain.append(ins.argval)
            continue
        if chain:
            yield chain
        chain = [ins.argval] if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") else None
        if ins.opname == "IMPORT_NAME":
            module = ins.argval
        elif ins.opname == "IMPORT_FROM" and module:
            yield [f"import {module}", ins.argval]
    if chain:
        yield chain
    for const in code.co_consts:
        if isinstance(const, CodeType) and (functions or not const.co_flags & inspect.CO_OPTIMIZED
                                            or const.co_name in _COMPREHENSIONS):
            yield from _name_chains(const, functions)


def _run_on_import(codes: set[CodeType]) -> set[CodeType]:
    """The package's functions that the modules of `codes` name at their top level (decorators, defaults, class
    bodies, constants): without them the module would not import."""
    return set().union(*(_named_on_import(filename) for filename in {c.co_filename for c in codes}))


@lru_cache(maxsize=None)
def _named_on_import(filename: str) -> frozenset[CodeType]:
    module_code = compile(Path(filename).read_text(), filename, "exec")
    namespace = _namespace(filename)
    return frozenset(c for chain in _name_chains(module_code, functions=False) for c in _resolved(chain, namespace)
                     if c.co_qualname == c.co_name)


def _continue_with() -> set[CodeType]:
    """The functions of every reference the course offers to continue with (autograder/exercise_map.json)."""
    from autograder.checking.reference_guard import code_objects

    refs = [obj for obj in map(_dotted, _continue_with_paths()) if obj is not None]
    return {c for c in code_objects(refs) if _in_package(c)}


@lru_cache(maxsize=1)
def _continue_with_paths() -> tuple[str, ...]:
    from autograder.checking.learner_errors import exercise_map

    return tuple(sorted({info["reference"] for info in exercise_map()["learner"].values() if info.get("reference")}))


def _dotted(path: str) -> Any:
    """The object at a dotted path of the course package ("minigpt.cache.block_table.slot_of"), or None."""
    module, _, name = path.rpartition(".")
    if module != "minigpt" and not module.startswith("minigpt."):
        return None
    try:
        return getattr(importlib.import_module(module), name, None)
    except Exception:      # a module that cannot load here (a library missing): nothing of it to keep
        return None


def _namespace(filename: str) -> dict[str, Any]:
    """The globals of the loaded module of the package whose file is `filename` ({} when none is)."""
    module = _modules_by_file(len(sys.modules)).get(_real(filename))
    return vars(module) if module is not None else {}


@lru_cache(maxsize=4)
def _modules_by_file(loaded: int) -> dict[str, ModuleType]:
    """{real file: module} of the package's loaded modules (`loaded`: len(sys.modules), to see new ones)."""
    modules = [m for name, m in list(sys.modules.items()) if name == "minigpt" or name.startswith("minigpt.")]
    return {_real(m.__file__): m for m in modules if isinstance(getattr(m, "__file__", None), str)}


@lru_cache(maxsize=None)
def _real(filename: str) -> str:
    return str(Path(filename).resolve())


def _function(obj: Any) -> Any:
    """The plain function behind obj (a staticmethod, classmethod, bound method, functools wrapper), or None."""
    from autograder.checking.reference_guard import _unwrap

    fn = _unwrap(obj)
    return fn if inspect.isfunction(fn) else None


def _in_package(code: CodeType) -> bool:
    return Path(code.co_filename).is_absolute() and Path(_real(code.co_filename)).is_relative_to(SHARED_DIR)


# ----------------------------------------------------------------- what a lab hands over, in the grading process

def handed_over(removed: list[list[Any]], labs_dir: Path = LABS_DIR) -> set[tuple[str, str]]:
    """(file, qualname) of the helpers in `removed` that stay: those the released notebook of a lab whose check
    refused the reference names, and the helpers these reach."""
    kept: set[tuple[str, str]] = set()
    for file, qualname, _, *rest in removed:
        helper = rest[0] if rest else None
        if helper and any(qualname in _released_names(lab, labs_dir) for lab in helper.get("labs", ())):
            kept |= {(file, qualname)} | {(file, other) for other in helper.get("reaches", ())}
    return kept


@lru_cache(maxsize=None)
def _released_names(lab: str, labs_dir: Path) -> frozenset[str]:
    """Every identifier in the code cells of lab `lab`'s released notebooks and in their Markdown's code."""
    names: set[str] = set()
    if not re.fullmatch(r"\d\d", lab):
        return frozenset()
    for path in sorted(Path(labs_dir).glob(f"{lab}_*/*.ipynb")):
        try:
            cells = json.loads(path.read_text())["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for cell in cells:
            text = "".join(cell.get("source", ""))
            if cell.get("cell_type") == "markdown":
                text = " ".join(re.findall(r"`+([^`]+)`+", text))
            names |= set(re.findall(r"[A-Za-z_]\w*", text))
    return frozenset(names)


# ----------------------------------------------------------------------------- the copy, in the grading process

def package_without(removed: list[list[Any]], dest: Path) -> Path:
    """A copy of the course package (SHARED_DIR) under dest/shared in which each removed function raises
    RuntimeError(MARKER ...) instead of running, but for the helpers the lab hands over; returns dest/shared."""
    shadow = Path(dest) / "shared"
    shutil.copytree(SHARED_DIR, shadow, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
    kept = handed_over(removed)
    by_file: dict[str, dict[str, tuple[int, bool]]] = {}
    for file, qualname, line, *rest in removed:
        target = (shadow / file).resolve()
        if not target.is_relative_to(shadow.resolve()) or target.suffix != ".py":
            raise ValueError(f"not a module of the course package: {file!r}")
        if (file, qualname) not in kept:
            by_file.setdefault(file, {})[qualname] = (int(line), bool(rest and rest[0]))
    for file, targets in by_file.items():
        path = shadow / file
        path.write_text(_without(path.read_text(), targets, file))
    return shadow


def removed_name(text: str) -> str | None:
    """The qualified name a removed function's error names, if `text` quotes one ("shard_slices, a helper of the
    reference" for a helper)."""
    if MARKER not in text:
        return None
    rest = text.split(MARKER, 1)[1].strip()
    if not rest:
        return "?"
    name = rest.split()[0].strip("'\".,:;)")
    return f"{name}, {HELPER_NOTE.strip('()')}" if rest[len(name):].lstrip().startswith(HELPER_NOTE) else name


def _without(source: str, targets: dict[str, tuple[int, bool]], file: str) -> str:
    """source with the body of each function in targets ({qualname: (first line, helper)}) replaced by a raise."""
    tree = ast.parse(source)
    found: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                if qualname in targets and targets[qualname][0] in (first, child.lineno):
                    child.body = [_raise(qualname, targets[qualname][1])]
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


def _raise(qualname: str, helper: bool) -> ast.stmt:
    message = ast.Constant(f"{MARKER} {qualname}" + (f" {HELPER_NOTE}" if helper else ""))
    return ast.Raise(exc=ast.Call(func=ast.Name("RuntimeError", ast.Load()), args=[message], keywords=[]),
                     cause=None)
