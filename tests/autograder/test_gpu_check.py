"""`make gpu-check`: says plainly when there is no GPU, finds the GPU-tier cells, reads their outcomes,
and collects what the speed checks measured."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from autograder import gpu_check
from autograder.harness import check_speedup, gpu_available


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU; the no-GPU message is for machines without one")
def test_without_a_gpu_it_says_so_and_checks_nothing(repo_root):
    proc = subprocess.run([sys.executable, "-m", "autograder", "gpu-check"], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode == gpu_check.NO_GPU_EXIT, proc.stdout + proc.stderr
    assert "no CUDA GPU here" in proc.stdout and "nothing was run" in proc.stdout


def test_finds_the_gpu_tier_cells_of_the_solutions(repo_root):
    nb = nbformat.read(str(repo_root / "solutions" / "01_kv_cache" / "01_kv_cache.ipynb"), as_version=4)
    cells = gpu_check.gpu_tier_cells(nb)
    assert cells, "lab 01 has a GPU-tier graded cell (the CUDA-graph decode step)"
    assert all("require_gpu(" in nb.cells[i].source for i in cells.values())


def test_cell_outcomes():
    ran = nbformat.v4.new_code_cell("x", execution_count=3,
                                    outputs=[nbformat.v4.new_output("stream", name="stdout", text="a\nspeedup 2.0x\n")])
    broke = nbformat.v4.new_code_cell("x", execution_count=4, outputs=[
        nbformat.v4.new_output("error", ename="AssertionError", evalue="too slow", traceback=[])])
    assert gpu_check.cell_outcome(ran) == {"status": "passed", "detail": "speedup 2.0x"}
    assert gpu_check.cell_outcome(broke) == {"status": "failed", "detail": "AssertionError: too slow"}
    assert gpu_check.cell_outcome(nbformat.v4.new_code_cell("x"))["status"] == "not run"


def test_speed_checks_log_their_measurements(tmp_path, monkeypatch):
    log = tmp_path / "m.jsonl"
    monkeypatch.setenv("COURSE_CALIBRATION_LOG", str(log))
    work = lambda n: (lambda: sum(range(n)))          # noqa: E731
    check_speedup(work(2000), work(20000), work(2000), what="toy", min_fraction={"cpu": 0.01}, repeats=3)
    [record] = gpu_check.read_measurements(log)
    assert record["what"] == "toy" and record["passed"] and record["speedup"] > 1
    assert json.loads(log.read_text())["threshold"] == pytest.approx(0.01 * record["reference_speedup"])
