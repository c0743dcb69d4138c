"""The package tree explains the engine: core modules at the top, one folder per concern, imports
pointing one way (no cycles; the model core imports none of the folders)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "shared" / "minigpt"
FOLDERS = ("cache", "engine", "kernels", "quant", "parallel", "longctx", "serving", "teaching", "training", "moe", "disagg",
           "costmodel")
# Engine code: it may price its work with minigpt.costmodel, never import the teaching aids.
ENGINE_SIDE = ("disagg", "longctx", "bench", "serving", "engine", "cache", "quant", "parallel", "kernels", "structured",
               "moe", "hf", "costmodel")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """{module: minigpt modules it imports (anywhere in the file, lazy imports included)}."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minigpt"):
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("minigpt"))
        graph[_module_name(path)] = deps
    known = set(graph)
    return {m: {d for d in deps if d in known and d != m} for m, deps in graph.items()}


def test_every_folder_is_a_documented_package():
    for folder in FOLDERS:
        init = PACKAGE / folder / "__init__.py"
        assert init.exists(), f"minigpt/{folder}/ has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"minigpt/{folder}/__init__.py needs a docstring saying what lives there"


def test_no_import_cycles():
    graph = _imports()
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if d == "minigpt" or m == "minigpt":       # the top-level re-exports are a leaf-ward edge only
                continue
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_model_core_imports_no_folder():
    graph = _imports()
    core = [m for m in graph if m.count(".") == 1 and m.split(".")[1] not in FOLDERS]
    for m in core:
        bad = sorted(d for d in graph[m] if d.count(".") >= 1 and d.split(".")[1] in FOLDERS)
        assert not bad, f"{m} is model core but imports {bad}; the folders build on the core, not the reverse"


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_engine_side_imports_no_teaching_aid():
    """The cost model sits below the engine folders and the teaching aids; engine code never imports the aids."""
    graph = _imports()
    assert any(_folder(d) == "costmodel" for m in graph if _folder(m) == "disagg" for d in graph[m])
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() if _folder(m) in ENGINE_SIDE
                 for d in deps if _folder(d) == "teaching")
    assert not bad, f"engine code imports minigpt.teaching (the cost model is minigpt.costmodel): {bad}"


@pytest.mark.parametrize("module", sorted(_imports()))
def test_module_imports(module):
    importlib.import_module(module)
