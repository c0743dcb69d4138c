"""autograder/'s imports run one way: no module imports itself back through others, and labs never import each other.

Every import counts, the ones inside functions too (a deferred import still closes a circle when it runs); only
those under `if TYPE_CHECKING:` are left out. grimp parses them. Importing `a.b.c` also runs the `__init__` of `a.b`,
so that package counts as imported too (unless the importer is inside it, where it is already running).

To see a cycle's modules: `python -m pytest tests/autograder/test_import_graph.py`; its message names each one.
"""

from __future__ import annotations

import re
from collections import deque

import grimp
import pytest

PACKAGE = "autograder"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=True)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imports(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """{module: the modules importing it runs}: what it imports, and the packages above those it is not inside."""
    out: dict[str, set[str]] = {m: set() for m in graph.modules}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            parts = imported.split(".")
            packages = {".".join(parts[:i]) for i in range(1, len(parts))}
            out[importer] |= {imported} | {p for p in packages if p in out and not _inside(importer, p)}
    return out


def shortest_path(edges: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports start -> ... -> goal, or None."""
    came_from: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        module = todo.popleft()
        if module == goal:
            path = [module]
            while (module := came_from[module]) is not None:
                path.append(module)
            return path[::-1]
        for nxt in sorted(edges[module] - came_from.keys()):
            came_from[nxt] = module
            todo.append(nxt)
    return None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each import that closes one: [a, b, ..., a]."""
    found = []
    for importer in sorted(edges):
        for imported in sorted(edges[importer]):
            back = shortest_path(edges, imported, importer)
            if back is not None:
                found.append([importer, *back])
    return found


def _lab(module: str) -> str | None:
    m = re.match(rf"{PACKAGE}\.(lab\d\d)\b", module)
    return m[1] if m else None


def test_the_graph_sees_imports_inside_functions(graph):
    """calibrate imports the labs' speed checks inside its functions (to defer torch): they must be in the graph."""
    assert "autograder.lab01" in graph.find_modules_directly_imported_by("autograder.gpu_tier.calibrate")


def test_a_cycle_is_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c", "a"], ["b", "c", "a", "b"], ["c", "a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_importing_a_module_runs_its_package():
    graph = grimp.ImportGraph()
    for module in ("p", "p.lab", "p.lab.x", "p.lab.y", "p.tool"):
        graph.add_module(module)
    graph.add_import(importer="p.tool", imported="p.lab.x")
    graph.add_import(importer="p.lab.y", imported="p.lab.x")
    edges = imports(graph)
    assert edges["p.tool"] == {"p.lab.x", "p.lab"}          # p.lab's __init__ runs first
    assert edges["p.lab.y"] == {"p.lab.x"}                   # inside p.lab: its __init__ is already running


def test_type_checking_imports_are_left_out(tmp_path, monkeypatch):
    """A cycle closed only under `if TYPE_CHECKING:` never runs; one closed inside a function does."""
    package = tmp_path / "planted_cycles"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from planted_cycles import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted_cycles import a\n")
    (package / "c.py").write_text("def f():\n    from planted_cycles import a\n")
    (package / "d.py").write_text("from planted_cycles import c\n")
    (package / "e.py").write_text("from planted_cycles import d\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    planted = grimp.build_graph("planted_cycles", cache_dir=None, exclude_type_checking_imports=True)
    assert cycles(imports(planted)) == []
    (package / "a.py").write_text("from planted_cycles import b, e\n")      # a -> e -> d -> c -(in f)-> a
    planted = grimp.build_graph("planted_cycles", cache_dir=None, exclude_type_checking_imports=True)
    assert ["planted_cycles.a", "planted_cycles.e", "planted_cycles.d", "planted_cycles.c",
            "planted_cycles.a"] in cycles(imports(planted))


def test_no_import_cycle(graph):
    found = cycles(imports(graph))
    modules = sorted({m for cycle in found for m in cycle})
    assert not found, (f"{len(modules)} modules of autograder/ are in import cycles: {modules}; "
                       f"the shortest: {' -> '.join(min(found, key=len))}. Move what both sides need down into a "
                       "module that imports neither (a function-level import does not break a circle).")


def test_labs_never_import_each_other(graph):
    crossings = [f"{importer} -> {imported} (line {detail['line_number']}: {detail['line_contents']})"
                 for importer in sorted(graph.modules) if _lab(importer)
                 for imported in sorted(graph.find_modules_directly_imported_by(importer))
                 if _lab(imported) and _lab(imported) != _lab(importer)
                 for detail in graph.get_import_details(importer=importer, imported=imported)]
    assert not crossings, ("labs are siblings: what several labs share belongs in autograder.checking (public "
                           "names), not in another lab. Found:\n" + "\n".join(crossings))


# Floors, lowest first: a module imports only its own floor and the floors below (`autograder` itself, the
# package's __init__, is not a floor: every module runs it, and it imports one module of checking).
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("autograder.paths", "autograder.machine", "autograder.processes")),
    ("checking", ("autograder.checking",)),
    ("harness", ("autograder.harness", "autograder.gpu_bench", "autograder.launches")),
    ("labs", ("autograder.lab", "autograder.interview")),
    ("judging", ("autograder.judging", "autograder.interactive")),
    ("grading and the class hub", ("autograder.grading", "autograder.preprocessors", "autograder.hub")),
    ("gpu tier, learner and mutation", ("autograder.gpu_tier", "autograder.learner", "autograder.mutation")),
    ("commands", ("autograder.cli", "autograder.commands", "autograder.doctor", "autograder.__main__")),
]


def floor_of(module: str) -> int | None:
    for level, (_, prefixes) in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") or (p.endswith(".lab") and re.match(r"autograder\.lab\d\d", module))
               for p in prefixes):
            return level
    return None


def test_every_module_has_a_floor(graph):
    assert [m for m in sorted(graph.modules) if m != PACKAGE and floor_of(m) is None] == []


def upward_imports(graph: grimp.ImportGraph) -> list[str]:
    """"importer (floor) -> imported (floor)" for each import of a higher floor."""
    return [f"{importer} ({FLOORS[floor_of(importer)][0]}) -> {imported} ({FLOORS[floor_of(imported)][0]})"
            for importer, targets in sorted(imports(graph).items()) if importer != PACKAGE
            for imported in sorted(targets) if imported != PACKAGE and floor_of(imported) > floor_of(importer)]


def test_an_upward_import_is_found():
    graph = grimp.ImportGraph()
    for module in ("autograder", "autograder.checking", "autograder.checking.wire", "autograder.judging",
                   "autograder.judging.judge", "autograder.lab03", "autograder.lab03.speed"):
        graph.add_module(module)
    graph.add_import(importer="autograder.judging.judge", imported="autograder.checking.wire")
    assert upward_imports(graph) == []
    graph.add_import(importer="autograder.lab03.speed", imported="autograder.judging.judge")
    assert upward_imports(graph) == ["autograder.lab03.speed (labs) -> autograder.judging (judging)",
                                     "autograder.lab03.speed (labs) -> autograder.judging.judge (judging)"]


def test_no_floor_imports_a_higher_one(graph):
    upward = upward_imports(graph)
    assert not upward, ("autograder/ is built in floors (base < checking < harness < labs < judging < grading < "
                        "gpu tier, learner < commands): a lower floor imported a higher one:\n" + "\n".join(upward))
