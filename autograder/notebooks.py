"""Notebooks are stored normalized so that diffs stay readable.

Normalized means: nbformat 4, no outputs, execution_count null, no per-run metadata (execution
timings, widget state, collapsed/scrolled view state), JSON with indent=1 and sorted keys, source as
a list of lines, one trailing newline (exactly what `nbformat.write` produces).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterable

import nbformat
from nbformat import NotebookNode

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("solutions", "labs", "tests/fixtures")
_VOLATILE_CELL_META = ("execution", "collapsed", "scrolled", "ExecuteTime", "jupyter")
_VOLATILE_NB_META = ("widgets", "toc", "varInspector")


def normalize(nb: NotebookNode) -> NotebookNode:
    """A copy of nb with outputs, execution counts and per-run metadata removed."""
    nb = copy.deepcopy(nb)
    for key in _VOLATILE_NB_META:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in _VOLATILE_CELL_META:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def dumps(nb: NotebookNode) -> str:
    """The exact text of a normalized notebook file."""
    text = nbformat.writes(normalize(nb), version=4)
    return text if text.endswith("\n") else text + "\n"


def normalized_text(path: Path | str) -> str:
    """What the file at path should contain."""
    return dumps(nbformat.read(str(path), as_version=4))


def is_normalized(path: Path | str) -> bool:
    return Path(path).read_text(encoding="utf-8") == normalized_text(path)


def normalize_file(path: Path | str) -> bool:
    """Rewrite path normalized; True when it changed."""
    path = Path(path)
    new = normalized_text(path)
    if path.read_text(encoding="utf-8") == new:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def find_notebooks(root: Path = REPO_ROOT, dirs: Iterable[str] = NOTEBOOK_DIRS) -> list[Path]:
    """Every committed-style notebook under root/dirs (checkpoints excluded)."""
    found = []
    for d in dirs:
        base = Path(root) / d
        if base.exists():
            found += [p for p in base.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts]
    return sorted(found)


def comparable(path: Path | str) -> dict:
    """A notebook as a plain dict after normalization (for comparing two notebooks)."""
    import json

    return json.loads(normalized_text(path))
