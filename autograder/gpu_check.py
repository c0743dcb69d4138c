"""The GPU tier in one command: `make gpu-check` (or `python -m autograder gpu-check`).

On a machine with a CUDA GPU it

1. runs `pytest -m gpu` (the package's and the checks' GPU tests),
2. executes every solution notebook top to bottom and records, for each GPU-tier graded cell
   (a cell that calls `require_gpu(`), whether it passed and the speedups its checks measured
   (`harness.check_speedup` appends each measurement to $COURSE_CALIBRATION_LOG),
3. writes all of it, with the GPU's name, torch/triton versions and the date, to
   `autograder/calibration/gpu_check.<device class>.json`.

It uses whatever torch/triton the python running it has (a GPU machine's own, e.g. torch 2.11 + triton
3.6), needs no network, and without a GPU says so plainly and exits 2: nothing was checked.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
from tqdm import tqdm

from autograder.grading import REPO_ROOT, assignments

NO_GPU_EXIT = 2
CELL_TIMEOUT_S = 600


def gpu_tier_cells(notebook: nbformat.NotebookNode) -> dict[str, int]:
    """{grade_id: cell index} of the graded cells gated by require_gpu(...)."""
    found = {}
    for i, cell in enumerate(notebook.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and "require_gpu(" in cell.source:
            found[meta["grade_id"]] = i
    return found


def cell_outcome(cell: nbformat.NotebookNode) -> dict[str, str]:
    """{"status": "passed" | "failed" | "not run", "detail": error or last output line} of an executed cell."""
    if cell.get("execution_count") is None:
        return {"status": "not run", "detail": "an earlier cell failed"}
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return {"status": "failed", "detail": f"{out.get('ename')}: {out.get('evalue')}"}
    text = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    lines = [line for line in text.splitlines() if line.strip()]
    return {"status": "passed", "detail": lines[-1] if lines else ""}


def run_notebook(path: Path) -> dict[str, dict[str, str]]:
    """Execute one solution notebook (in its folder) and report its GPU-tier cells."""
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    cells = gpu_tier_cells(nb)
    if not cells:
        return {}
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except Exception as exc:                      # a dead kernel or a timeout: report it on every cell not run
        return {gid: {"status": "failed", "detail": f"notebook stopped: {exc.__class__.__name__}: {exc}"}
                for gid in cells}
    return {gid: cell_outcome(nb.cells[i]) for gid, i in cells.items()}


def run_pytest_gpu(repo: Path, junit: Path) -> dict[str, object]:
    """`pytest -m gpu`: the counts from its JUnit report and its exit code."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={junit}"], cwd=repo, capture_output=True, text=True)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in counts}
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    return {"exit_code": proc.returncode, **counts, "summary": tail[0] if tail else ""}


def read_measurements(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def main(repo: Path = REPO_ROOT, out_dir: Path | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: the GPU tier (pytest -m gpu and the GPU-tier cells of solutions/) needs one; "
              "nothing was run. Run `make gpu-check` on a machine with a CUDA GPU.")
        return NO_GPU_EXIT
    from minigpt.timing import device_class

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    out_dir = out_dir or repo / "autograder" / "calibration"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        log = Path(tmp) / "measurements.jsonl"
        os.environ["COURSE_CALIBRATION_LOG"] = str(log)      # inherited by pytest and the notebook kernels
        print("pytest -m gpu ...", flush=True)
        tests = run_pytest_gpu(repo, Path(tmp) / "junit.xml")
        print(f"  {tests['summary']}")
        labs: dict[str, dict] = {}
        for a in tqdm(assignments(repo), desc="solution notebooks", unit="lab"):
            for nb_path in sorted((repo / "solutions" / a).glob("*.ipynb")):
                labs[a] = run_notebook(nb_path)
        measurements = read_measurements(log)
    report = {
        "device_name": torch.cuda.get_device_name(),
        "device_class": device_class("cuda"),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "pytest_gpu": tests,
        "gpu_tier_cells": labs,
        "speed_checks": measurements,
    }
    out = out_dir / f"gpu_check.{report['device_class']}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    failed = [f"{a}:{gid}" for a, cells in labs.items() for gid, r in cells.items() if r["status"] != "passed"]
    for a, cells in labs.items():
        for gid, r in cells.items():
            print(f"  {a:<22} {gid:<28} {r['status']:<8} {r['detail'][:100]}")
    for m in measurements:
        print(f"  speed: {m['what'][:60]:<60} {m['speedup']:.2f}x (reference {m['reference_speedup']:.2f}x, "
              f"needed {m['threshold']:.2f}x)")
    print(f"wrote {out}")
    return 0 if not failed and tests["exit_code"] in (0, 5) else 1
