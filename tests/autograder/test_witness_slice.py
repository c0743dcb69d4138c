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


# ----------------------------------------------------------------------------- what runs where it stands

from autograder.judging.witness import cells_to_run  # noqa: E402

SLOW = "slow = sum(range(10**6))\n"


def test_a_lambda_or_generator_consumed_at_once_reads_where_it_stands():
    """`max(..., key=lambda ...)` and `sum(... for ...)` run inside the call: a cell far away that binds the same
    names (a measurement's loop variable) is not needed for them, as it is for a lambda kept to be called later."""
    cells = ["bits = 8\n",                                                          # 0
             "best = max([1, 2], key=lambda m: m * bits)\ntotal = sum(x * bits for x in [1, 2])\n"
             "first = next(b for b in range(9) if b * bits > 8)\n",                    # 1
             "for bits in (3, 4):\n    " + SLOW,                                   # 2: a measurement binding bits
             "check(best, total, first)\n"]                                        # 3: the test cell
    assert cells_to_run(cells, [3]) == [0, 1, 3]
    kept_for_later = ["bits = 8\n", "scale = lambda m: m * bits\n", cells[2], "check(scale(2))\n"]
    assert cells_to_run(kept_for_later, [3]) == [0, 1, 2, 3]
    lazy = ["bits = 8\n", "gen = (x * bits for x in [1, 2])\n", cells[2], "check(list(gen))\n"]
    assert cells_to_run(lazy, [3]) == [0, 1, 2, 3]                  # a generator kept is read when consumed
    shadowed = ["def max(*a, key=None):\n    KEPT.append(key)\n    return 0\n"] + cells   # `max` is the notebook's
    assert cells_to_run(shadowed, [4]) == [0, 1, 2, 3, 4]


def test_a_comprehension_at_the_top_level_reads_where_it_stands_and_one_in_a_function_when_called():
    top = ["w = 1\n", "rows = [x * w for x in range(3)]\n", "for w in (2, 3):\n    " + SLOW, "check(rows)\n"]
    assert cells_to_run(top, [3]) == [0, 1, 3]
    inside = ["w = 1\n", "def rows():\n    return [x * w for x in range(3)]\n", top[2], "check(rows())\n"]
    assert cells_to_run(inside, [3]) == [0, 1, 2, 3]


def test_names_a_loop_binds_before_reading_them_are_the_loops():
    cells = ["label, r = 'x', 0\n",                                                  # 0: an earlier binding
             "for g in (1, 2):\n    label = f'g{g}'\n    print(label)\n    if g:\n        for r in (g,):\n"
             "            print(r)\nresult = 1\n",                                     # 1: reads only its own
             "check(result)\n"]
    assert cells_to_run(cells, [2]) == [1, 2]
    after = ["r = 0\n", "for x in (1,):\n    print(r)\n    r = x\nresult = r\n", "check(result)\n"]
    assert cells_to_run(after, [2]) == [0, 1, 2]           # read before the loop's body binds it: the notebook's
    augmented = ["total = 0\n", "for i in (1, 2):\n    total += i\n", "check(total)\n"]
    assert cells_to_run(augmented, [2]) == [0, 1, 2]       # `+=` reads what it adds to
