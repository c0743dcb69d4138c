"""CPU time of each lab's solution notebook, run top to bottom in a fresh kernel (README's "Runs in" column).

    python scripts/measure_lab_cpu_time.py [NN ...]

The kernel's own user + system CPU time (and its children's) is read inside the kernel after the last cell, so the
figure does not count nbclient, the server or other jobs on the machine (wall time is printed beside it, but it is
what a loaded machine changes most).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
PROBE = ("import resource as _r, json as _j\n"
         "_s, _c = _r.getrusage(_r.RUSAGE_SELF), _r.getrusage(_r.RUSAGE_CHILDREN)\n"
         "print(_j.dumps({'cpu_s': _s.ru_utime + _s.ru_stime + _c.ru_utime + _c.ru_stime}))")


def measure(notebook: Path) -> dict:
    nb = nbformat.read(str(notebook), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    start = time.perf_counter()
    NotebookClient(nb, timeout=1200, kernel_name="python3",
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    wall = time.perf_counter() - start
    cpu = json.loads(nb.cells[-1].outputs[-1]["text"].strip().splitlines()[-1])["cpu_s"]
    return {"lab": notebook.parent.name, "cpu_min": round(cpu / 60, 2), "wall_min": round(wall / 60, 2)}


def main(labs: list[str]) -> None:
    for path in sorted((REPO / "solutions").glob("*/*.ipynb")):
        if not labs or path.parent.name[:2] in labs:
            print(json.dumps(measure(path)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
