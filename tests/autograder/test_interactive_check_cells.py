"""Check cells in a learner's kernel (the JupyterLab path: autograder.judging.interactive routes them to a judge):
a passing check says so in the same words in every lab, once."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

CELLS = [
    "%load_ext autograder.judging.interactive",
    "def truncate_cache(cache, length):\n"
    "    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= cache.length:\n"
    "        raise ValueError(f'length must be in [0, {cache.length}], got {length!r}')\n"
    "    for layer in cache:\n"
    "        layer.length = length",
    "from autograder.lab06 import check_truncate_cache\ncheck_truncate_cache(truncate_cache)",
]


def test_a_passing_check_cell_says_exercise_n_passed(tmp_path, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_JUDGE", raising=False)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    assert text.strip().splitlines()[-1] == "Exercise 1 passed.", nb.cells[-1].outputs
