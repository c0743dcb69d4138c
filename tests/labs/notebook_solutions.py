"""The solution notebook's own answers, for tests: the checks refuse the package's reference, so a test shows a
check passing with the code a learner would write (the solution cells), compiled as notebook code.

    ns = solution_cells("03_continuous_batching", "ex2_code", preamble="from minigpt.engine.scheduler import *")
    lab03.check_scheduler(ns["MyScheduler"])
"""

from __future__ import annotations

import hashlib
import json
import linecache
from pathlib import Path
from typing import Any

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def solution_cells(assignment: str, *grade_ids: str, preamble: str = "",
                   replace: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `preamble`, then the named cells of solutions/<assignment>/<assignment>.ipynb (in that order) in one fresh
    namespace; each cell is compiled under a file name of its own (its source's hash) outside the package, registered in linecache as
    ipykernel does.
    `replace`: {text: replacement} applied to the cells first, each text found exactly once (a wrong implementation
    that differs from the solution in one place)."""
    path = SOLUTIONS / assignment / f"{assignment}.ipynb"
    cells = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): "".join(c["source"])
             for c in json.loads(path.read_text())["cells"]}
    for old, new in (replace or {}).items():
        found = [g for g in grade_ids if old in cells[g]]
        assert len(found) == 1 and cells[found[0]].count(old) == 1, f"{old!r} is not in exactly one place: {found}"
        cells[found[0]] = cells[found[0]].replace(old, new)
    namespace: dict[str, Any] = {"__name__": f"solution_{assignment}"}
    for name, source in [("preamble", preamble)] + [(g, cells[g]) for g in grade_ids]:
        # Named by the source's hash, as ipykernel names its cell files: Triton's interpreter reads a kernel's source
        # again (linecache) when it first runs, so an edited cell under the same name would replace an earlier one's
        digest = hashlib.sha1(source.encode()).hexdigest()[:12]
        filename = f"/notebook-cells/{assignment}/{name}-{digest}.py"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace
