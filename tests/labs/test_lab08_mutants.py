"""Lab 08: wrong versions of the notebook's own solution cells, one edit each, that mutation testing
(`make mutation LAB=08`) found passing; each check below now rejects its edit, with a message that says why."""

from __future__ import annotations

import pytest

from autograder import lab08
from autograder.lab08.streaming import _check_sse_unit
from tests.labs.notebook_solutions import solution_cells

PREAMBLE = """
import torch
"""

CHECKS = {"ex1_code": ("sse_stream", _check_sse_unit),      # the scripted streams, without a server
          "ex3_code": ("request_goodput", lab08.check_goodput)}

# (cell, the edit, what the check's message says)
EDITS = [
    ("ex1_code", {"json.dumps(chunk, separators=(',', ':'))": "json.dumps(chunk)"}, "compact JSON"),
    ("ex3_code", {"duration = max(r.end_time for r in records) - min(r.send_time for r in records)":
                  "duration = max(r.end_time for r in records) + min(r.send_time for r in records)"}, "100 s"),
    ("ex3_code", {"if duration > 0 else 0.0": "if duration >= 0 else 0.0"}, "0 s"),
    ("ex3_code", {"if duration > 0 else 0.0": "if duration > 1 else 0.0"}, "shorter than a second"),
    ("ex3_code", {"if duration > 0 else 0.0": "if duration > 0 else 1.0"}, "0 s"),
]


def _edited(cell: str, edit: dict[str, str]):
    name, _ = CHECKS[cell]
    return solution_cells("08_serving", cell, preamble=PREAMBLE, replace=edit)[name]


@pytest.mark.parametrize("cell", sorted(CHECKS))
def test_the_unedited_cell_passes(cell):
    CHECKS[cell][1](_edited(cell, {}))


@pytest.mark.parametrize("cell, edit, match", EDITS, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(EDITS)])
def test_each_edit_is_rejected(cell, edit, match):
    with pytest.raises(AssertionError, match=match):
        CHECKS[cell][1](_edited(cell, edit))
