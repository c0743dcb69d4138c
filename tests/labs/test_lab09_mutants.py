"""Lab 09: wrong versions of the notebook's own solution cells, one edit each, that mutation testing
(`make mutation LAB=09`) found passing; each check below now rejects its edit, with a message that says why."""

from __future__ import annotations

import pytest

from autograder import lab09
from tests.labs.notebook_solutions import solution_cells

PREAMBLE = """
import math
import torch
from minigpt.longctx import sliding_window as sw
"""

CHECKS = {"ex1_code": ("scaled_inv_freq", lab09.check_scaled_inv_freq),
          "ex2_code": ("RingKVCache", lab09.check_ring_cache),
          "ex4_code": ("kv_bytes_per_token", lab09.check_kv_bytes)}

# (cell, the edit, what the check's message says)
EDITS = [
    ("ex1_code", {"return new_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)":
                  "return new_theta ** (-torch.arange(0, head_dim, 2) / head_dim)"}, "must be float64"),
    ("ex1_code", {'raise ValueError(f"unknown method {method!r}")': "raise ValueError(None)"}, "should name rope2"),
    ("ex2_code", {"if T > 1 and self.length + T > self.capacity:": "if T > 2 and self.length + T > self.capacity:"},
     "2 tokens at once"),
    ("ex2_code", {"if T > 1 and self.length + T > self.capacity:": "if T > 1 and self.length + T >= self.capacity:"},
     "16 tokens at once"),          # a prefill that fills the window exactly, refused
    ("ex2_code", {'raise ValueError(f"{T} tokens at once would evict cached ones; feed one at a time")':
                  "raise ValueError(None)"}, "says nothing"),
    ("ex4_code", {'raise ValueError(f"unknown kind {kind!r}")': "raise ValueError(None)"}, "should name XYZ"),
]


def _edited(cell: str, edit: dict[str, str]):
    name, _ = CHECKS[cell]
    return solution_cells("09_long_context", cell, preamble=PREAMBLE, replace=edit)[name]


@pytest.mark.parametrize("cell", sorted(CHECKS))
def test_the_unedited_cell_passes(cell):
    CHECKS[cell][1](_edited(cell, {}))


@pytest.mark.parametrize("cell, edit, match", EDITS, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(EDITS)])
def test_each_edit_is_rejected(cell, edit, match):
    with pytest.raises(AssertionError, match=match):
        CHECKS[cell][1](_edited(cell, edit))
