"""Notebooks are stored normalized so that diffs stay readable.

Normalized means: nbformat 4, no outputs, execution_count null, no per-run metadata (execution
timings, widget state, collapsed/scrolled view state), JSON with indent=1 and sorted keys, source as
a list of lines, one trailing newline (exactly what `nbformat.write` produces), and the course kernel's
name and language info, exactly as that kernel reports them (so a notebook opens without unsaved changes).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterable

import nbformat
from nbformat import NotebookNode

from autograder.paths import REPO_ROOT

NOTEBOOK_DIRS = ("solutions", "labs", "tests/fixtures")
_VOLATILE_CELL_META = ("execution", "collapsed", "scrolled", "ExecuteTime", "jupyter")
_VOLATILE_NB_META = ("widgets", "toc", "varInspector")
# What `make setup` installs (ipykernel install --name python3 --display-name "Python 3 (course)") and what that
# kernel answers in its kernel_info reply, on the course's Python (environment.yml: python=3.11).
COURSE_KERNELSPEC = {"display_name": "Python 3 (course)", "language": "python", "name": "python3"}
COURSE_LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                        "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                        "pygments_lexer": "ipython3", "version": "3.11.7"}


def normalize(nb: NotebookNode) -> NotebookNode:
    """A copy of nb with outputs, execution counts and per-run metadata removed."""
    nb = copy.deepcopy(nb)
    for key in _VOLATILE_NB_META:
        nb.metadata.pop(key, None)
    nb.metadata["kernelspec"] = copy.deepcopy(COURSE_KERNELSPEC)
    nb.metadata["language_info"] = copy.deepcopy(COURSE_LANGUAGE_INFO)
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
