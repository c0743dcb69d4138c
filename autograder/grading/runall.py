"""Run All reaches the last cell of every released notebook: cells that must raise until the learner's work is
done carry the `raises-exception` tag, which JupyterLab's Run All and nbclient honour (nbgrader's scoring is
unchanged).

    python -m autograder runall                 # run each released notebook; list raising cells not tagged
    python -m autograder runall --fix           # tag them in solutions/ (the source), then re-release

Which cells raise is found by running the released notebook as a learner would (Run All with errors allowed);
graded cells are always tagged, since each must fail until its exercise is done.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

TAG = "raises-exception"


@dataclass(frozen=True)
class RaisingCell:
    index: int
    cell_id: str
    grade_id: str
    ename: str


def run_released(notebook: Path, *, timeout: int = 600) -> nbformat.NotebookNode:
    """Execute a copy of `notebook` top to bottom, errors allowed, outside nbgrader (as Run All would)."""
    from nbclient import NotebookClient

    nb = nbformat.read(str(notebook), as_version=4)
    env_before = os.environ.pop("NBGRADER_EXECUTION", None)
    try:
        with tempfile.TemporaryDirectory(prefix="runall-") as tmp:
            NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                           resources={"metadata": {"path": tmp}}).execute()
    finally:
        if env_before is not None:
            os.environ["NBGRADER_EXECUTION"] = env_before
    return nb


def raising_cells(executed: nbformat.NotebookNode) -> list[RaisingCell]:
    """Code cells of an executed notebook with an error output."""
    out = []
    for i, cell in enumerate(executed.cells):
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if cell.cell_type == "code" and errors:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            out.append(RaisingCell(i, cell.get("id", ""), gid, errors[0].ename))
    return out


def untagged(executed: nbformat.NotebookNode) -> list[RaisingCell]:
    """Raising cells without the tag: where Run All would stop."""
    return [c for c in raising_cells(executed) if TAG not in executed.cells[c.index].metadata.get("tags", [])]


def tag_cells(source: Path, cell_ids: set[str]) -> int:
    """Add the tag to the cells of the source notebook with these ids, and to every graded cell; returns how many
    cells were tagged anew."""
    from autograder.grading.notebooks import normalize_file

    nb = nbformat.read(str(source), as_version=4)
    added = 0
    for cell in nb.cells:
        graded = cell.get("metadata", {}).get("nbgrader", {}).get("grade", False)
        if cell.cell_type == "code" and (cell.get("id") in cell_ids or graded):
            tags = cell.metadata.setdefault("tags", [])
            if TAG not in tags:
                tags.append(TAG)
                added += 1
    nbformat.write(nb, str(source))
    normalize_file(source)
    return added
