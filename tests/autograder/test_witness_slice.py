"""Which cells a witness replays (autograder/judging/witness.py: cells_needed): a function's parameters and locals
are its own, so a demo cell that binds the same names is not replayed for it (lab 09's ring_attention read `n`, `r`,
`k`, `v`, and the witness replayed five demo cells, about 110 s, for nothing)."""

from __future__ import annotations

from autograder.judging.witness import cells_needed

CELLS = [
    "import torch\nLIMIT = 3\n",                                   # 0: setup, read as a global by the answer
    "n, r, k, v = 4, 1, torch.ones(2), torch.zeros(2)\nslow = sum(range(10**6))\n",   # 1: a demo binding the same names
    "def helper(t):\n    return t * SCALE\nSCALE = 2\n",            # 2: a helper the answer calls, and its global
    "def answer(comm, q, k, v):\n    n, r = comm.world_size, comm.rank\n"
    "    return [x for x in k if x > LIMIT] + [helper(v) for _ in range(n)]\n",        # 3: the answer
]


def test_a_functions_parameters_and_locals_pull_in_no_cell():
    assert cells_needed(CELLS, ["answer"]) == [0, 2, 3]


def test_what_a_function_reads_as_a_global_is_replayed_with_it():
    assert cells_needed(CELLS, ["helper"]) == [2]
    assert cells_needed(CELLS + ["k = v + 1\n"], ["k"]) == [0, 1, 4]     # top-level reads still count
