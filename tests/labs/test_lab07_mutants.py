"""Lab 07: wrong versions of the notebook's own solution cells, one edit each, that mutation testing
(`make mutation LAB=07`) found passing; each check below now rejects its edit, with a message that says why."""

from __future__ import annotations

import pytest

from autograder import lab07
from tests.labs.notebook_solutions import solution_cells

PREAMBLE = """
import torch
from minigpt.config import ModelConfig
"""

# (the edit of shard_weight, what the check's message says)
EDITS = [
    ({"or (cfg.n_kv_heads % tp and tp % cfg.n_kv_heads) or cfg.d_ff % tp:":
      "or (cfg.n_kv_heads % tp and tp % cfg.n_kv_heads) and cfg.d_ff % tp:"}, "d_ff=130"),
    ({'raise ValueError(f"tp={tp} cannot split': 'raise ValueError(None)\n        print(f"tp={tp} cannot split'},
     "should name 3"),
    ({"return piece.contiguous().clone()": "return piece.contiguous()"}, "is a view of the full"),
]


def _shard_weight(edit: dict[str, str]):
    return solution_cells("07_tensor_parallel", "ex1_code", preamble=PREAMBLE, replace=edit)["shard_weight"]


def test_the_unedited_cell_passes():
    lab07.check_shard_weight(_shard_weight({}))


@pytest.mark.parametrize("edit, match", EDITS, ids=[str(i) for i in range(len(EDITS))])
def test_each_edit_is_rejected(edit, match):
    with pytest.raises(AssertionError, match=match):
        lab07.check_shard_weight(_shard_weight(edit))
