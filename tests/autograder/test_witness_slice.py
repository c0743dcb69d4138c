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


# ----------------------------------------------------------------------------- what grading runs (cells_to_run)

def _notebook(cells: list[tuple[str, dict]]):
    import nbformat

    nb = nbformat.v4.new_notebook()
    for source, meta in cells:
        cell = nbformat.v4.new_code_cell(source)
        if meta:
            cell.metadata["nbgrader"] = {"schema_version": 3, "locked": not meta.get("solution"), **meta}
        nb.cells.append(cell)
    return nb


COURSE = {}                                     # a course cell: no nbgrader metadata, its source as released
ANSWER = {"grade_id": "ex1", "solution": True, "grade": False}
TEST = {"grade_id": "ex1_check", "solution": False, "grade": True, "points": 1}
LAB = [("import torch\ng = torch.Generator().manual_seed(0)\n", COURSE),              # 0: needed by the answer
       ("def f(x):\n    return torch.tensor(x) * SCALE\n", ANSWER),                     # 1: the learner's
       ("SCALE = 2\n", COURSE),                                      # 2: read by f as a global, bound after it
       ("table = [f(t) for t in range(3)]\nprint(table)\n", COURSE),                    # 3: a demo: nothing reads it
       ("g = torch.Generator().manual_seed(1)\nslow = sum(range(10))\n", COURSE),      # 4: binds g, read later only
       ("check(f)\n", TEST),                                                            #    after binding it again
       ("g = torch.Generator().manual_seed(2)\nprint(torch.randn(2, generator=g))\n", COURSE),   # 6: a later demo
       ("x = g\n", COURSE)]                                                             # 7: reads g, left out itself


def test_grading_runs_what_the_graded_cells_need_and_leaves_out_the_demos():
    from autograder.grading.preprocessors import left_out

    nb = _notebook(LAB)
    course = {nb.cells[i].source for i in (0, 2, 3, 4, 6, 7)}
    assert left_out(nb, course) == {3, 4, 6, 7}


def test_a_cell_that_reads_a_name_before_binding_it_needs_the_cell_that_bound_it():
    from autograder.grading.preprocessors import left_out

    nb = _notebook(LAB[:5] + [("g = g\ncheck(f)\n", TEST)])
    assert left_out(nb, {nb.cells[i].source for i in (0, 2, 3, 4)}) == {3}


def test_the_learners_cells_and_a_course_cell_they_changed_always_run():
    from autograder.grading.preprocessors import left_out

    nb = _notebook(LAB)
    course = {nb.cells[i].source for i in (0, 2, 3, 4, 6, 7)}
    nb.cells[3].source += "# mine\n"                      # changed: it is the learner's now
    nb.cells.insert(4, _notebook([("import os\nos.environ['X'] = '1'\n", COURSE)]).cells[0])   # added by the learner
    assert left_out(nb, course) == {5, 7, 8}
    assert left_out(nb, set()) == set()                  # no release to compare with: every cell runs
