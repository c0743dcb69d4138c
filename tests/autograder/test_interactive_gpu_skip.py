"""A GPU-tier check cell run in JupyterLab on a machine without a GPU: the judge that interactive.py starts prints
SKIPPED and the cell passes (no points are at stake there); the judge nbgrader starts fails it (no points for a
check that did not run). Issue 40: four red cells in a row in lab 04 on a laptop."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from autograder.harness import gpu_available
from autograder.judging import judge
from tests.labs.test_lab0305_judged import judged

pytestmark = pytest.mark.skipif(gpu_available(), reason="a machine without a GPU is what this is about")

CELL = "from autograder.harness import require_gpu\nprint(require_gpu('a GPU-tier check'))\n"


@pytest.mark.parametrize("grading", [False, True])
def test_gpu_tier_cell_skips_in_jupyterlab_and_fails_under_grading(grading):
    folder = tempfile.mkdtemp(prefix="judge-")
    process = judge.JudgeProcess(folder, grading=grading)
    try:
        result, _ = judged(process, CELL, {})
    finally:
        process.close()
        shutil.rmtree(folder, ignore_errors=True)      # tests leave nothing behind
    if grading:
        assert result["error"] and "needs a GPU" in result["error"]["evalue"], result
    else:
        assert result["error"] is None, result["error"]
        assert "SKIPPED (needs a GPU): a GPU-tier check" in str(result), result
