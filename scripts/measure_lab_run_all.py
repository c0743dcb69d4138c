"""Wall time of Run All for each lab notebook, in a fresh course kernel (README's "Runs in" column).

    python scripts/measure_lab_run_all.py [--released] [--json FILE] [--save DIR] [NN ...]

What a learner waits: every cell executed in order in the course kernel (check cells judged in a separate process,
as in JupyterLab), timed from the first cell to the last. Cells that must raise (`raises-exception`) may raise.
Printed per lab: wall minutes, the kernel's own CPU minutes (its user + system time and its children's), the
machine's load average at the start, and the three slowest cells. `--released` runs `labs/` (stubs in place)
instead of `solutions/`; `--save DIR` writes each executed notebook there (to read what a learner sees).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
PROBE = ("import resource as _r, json as _j\n"
         "_s, _c = _r.getrusage(_r.RUSAGE_SELF), _r.getrusage(_r.RUSAGE_CHILDREN)\n"
         "print(_j.dumps({'cpu_s': _s.ru_utime + _s.ru_stime + _c.ru_utime + _c.ru_stime}))")


class TimedClient(NotebookClient):
    """Records each code cell's wall time (seconds) by index."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cell_seconds: dict[int, float] = {}

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        start = time.perf_counter()
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            self.cell_seconds[cell_index] = time.perf_counter() - start


def measure(notebook: Path, save: Path | None = None) -> dict:
    nb = nbformat.read(str(notebook), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    load = os.getloadavg()[0]
    client = TimedClient(nb, timeout=1200, kernel_name="python3", allow_errors=False,
                         resources={"metadata": {"path": str(notebook.parent)}})
    start = time.perf_counter()
    client.execute()
    wall = time.perf_counter() - start
    cpu = json.loads(nb.cells[-1].outputs[-1]["text"].strip().splitlines()[-1])["cpu_s"]
    if save:
        save.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(save / notebook.name))
    slowest = sorted(client.cell_seconds.items(), key=lambda item: -item[1])[:3]
    return {"lab": notebook.parent.name, "wall_min": round(wall / 60, 2), "kernel_cpu_min": round(cpu / 60, 2),
            "load_at_start": round(load, 2),
            "slowest_cells": [{"cell": i, "s": round(s, 1), "grade_id": nb.cells[i].metadata.get("nbgrader", {})
                               .get("grade_id"), "starts": "".join(nb.cells[i].source)[:60]} for i, s in slowest]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labs", nargs="*", help="two-digit lab numbers (default: all)")
    parser.add_argument("--released", action="store_true", help="run labs/ (stubs) instead of solutions/")
    parser.add_argument("--json", type=Path, help="also append each lab's line to this file")
    parser.add_argument("--save", type=Path, help="write each executed notebook into this folder")
    args = parser.parse_args()
    for path in sorted((REPO / ("labs" if args.released else "solutions")).glob("*/*.ipynb")):
        if not args.labs or path.parent.name[:2] in args.labs:
            line = json.dumps(measure(path, args.save))
            print(line, flush=True)
            if args.json:
                with args.json.open("a") as out:
                    out.write(line + "\n")


if __name__ == "__main__":
    main()
