"""The hostile class, part three (issue 55), graded by the real autograde (nbgrader, bubblewrap, witness on, two
jobs): for each kind of attack in `hostile_three/`, a one-exercise assignment that an honest student and an
attacker submit, all of them one class graded in one batch. Kinds with the same setup, honest answer and check
(lab 01's two speed attacks, lab 04's two) share one assignment and its honest student, each attacker a student of
its own. The honest student earns the exercise's points (so the check can pass); the attacker earns nothing;
nothing is left running.

`HOSTILE_THREE_ONLY=lab06_own_target,lab01_memo` grades only those kinds (while working on one).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.grading import batch, nbgrader_runs as grading
from autograder.judging import sandbox

import grading_scratch  # noqa: E402  (tests/instructor/ is on sys.path under pytest)
import hostile_three  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]     # the class is graded in the first test

_NO_SANDBOX = sandbox.probe()
if _NO_SANDBOX and not os.environ.get("CI"):
    pytest.skip(f"no grading sandbox here ({_NO_SANDBOX})", allow_module_level=True)

REPO_ROOT = Path(__file__).resolve().parents[2]
ONLY = [k for k in os.environ.get("HOSTILE_THREE_ONLY", "").split(",") if k]
KINDS = {stem: module for stem, module in hostile_three.kinds().items() if not ONLY or stem in ONLY}
HONEST = "honest"


def _exercise(module) -> tuple:
    return module.SETUP, module.SOLUTION, module.CHECK, module.POINTS


# kinds of one exercise share an assignment, named after the first of them, which brings its solution and honest student
_FIRST = {}
for _stem in sorted(KINDS):
    _FIRST.setdefault(_exercise(KINDS[_stem]), _stem)
ASSIGNMENTS = {stem: f"h3_{_FIRST[_exercise(module)]}" for stem, module in KINDS.items()}
LEADS = set(_FIRST.values())


def _attacker(stem: str) -> str:
    return f"attacker_{stem}"


def _cell(source: str, grade_id: str, *, solution: bool, grade: bool, points: int = 0):
    cell = nbformat.v4.new_code_cell(source)
    meta = {"grade_id": grade_id, "solution": solution, "grade": grade, "locked": not solution, "schema_version": 3}
    cell.metadata["nbgrader"] = {**meta, **({"points": points} if grade else {})}
    return cell


def _solution_notebook(module) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    answer = "### BEGIN SOLUTION\n" + module.SOLUTION.rstrip("\n") + "\n### END SOLUTION\n"
    cells = [nbformat.v4.new_markdown_cell(f"Hostile class, part three: {module.KIND}.")]
    if module.SETUP.strip():
        cells.append(_cell(module.SETUP, "setup", solution=False, grade=False))
    cells += [_cell(answer, "answer", solution=True, grade=False),
              _cell(module.CHECK, "check", solution=False, grade=True, points=module.POINTS)]
    nb.cells = cells
    return nb


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """Every kind's assignment in one course, released once, and its honest student and attacker graded in one
    batch (two jobs), as an instructor grades a class."""
    course = tmp_path_factory.mktemp("hostile-three") / "course"
    course.mkdir()
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    for stem, module in KINDS.items():
        name = ASSIGNMENTS[stem]
        if stem in LEADS:
            (course / "solutions" / name).mkdir(parents=True)
            nbformat.write(_solution_notebook(module), str(course / "solutions" / name / f"{name}.ipynb"))
    env = grading.nbgrader_env({"COURSE_CELL_TIMEOUT": "240"})
    grading.release(course, env=env)
    for stem, module in KINDS.items():
        name = ASSIGNMENTS[stem]
        released = nbformat.read(str(course / "labs" / name / f"{name}.ipynb"), as_version=4)
        students = ((HONEST, module.SOLUTION),) if stem in LEADS else ()
        for student, answer in students + ((_attacker(stem), module.ATTACK),):
            folder = course / "submitted" / student / name
            folder.mkdir(parents=True)
            mine = nbformat.from_dict(released)
            for cell in mine.cells:
                if cell.metadata.get("nbgrader", {}).get("grade_id") == "answer":
                    cell.source = answer
            nbformat.write(mine, str(folder / f"{name}.ipynb"))
    with grading_scratch.scratch_folder() as scratch:
        with grading_scratch.as_tmpdir(scratch):
            results = batch.autograde(course, timeout=600, env=env, log=lambda line: None, progress=False, jobs=2)
        yield {"results": {(r.assignment, r.student): r for r in results}, "course": course, "scratch": scratch}


@pytest.fixture(params=sorted(KINDS))
def graded(request, graded_class):
    """One kind's two results from the class: its assignment's honest student, its attacker."""
    stem = request.param
    name = ASSIGNMENTS[stem]
    results = graded_class["results"]
    return {"stem": stem, "results": {"honest": results[(name, HONEST)], "attacker": results[(name, _attacker(stem))]},
            "course": graded_class["course"], "scratch": graded_class["scratch"]}


def _report(result, course: Path) -> str:
    path = course / "autograded" / result.student / result.assignment / f"{result.assignment}.ipynb"
    if not path.exists():
        return f"{result.status}: {result.notes}"
    nb = nbformat.read(str(path), as_version=4)
    check = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "check")
    errors = [f"{o.ename}: {o.evalue}" for o in check.outputs if o.output_type == "error"]
    return f"{result.status} {result.notes}: {errors or 'passed'}"


def test_the_honest_student_earns_the_points(graded):
    result = graded["results"]["honest"]
    assert (result.status, result.score) == ("ok", KINDS[graded["stem"]].POINTS), _report(result, graded["course"])


def test_the_attack_earns_nothing(graded):
    result = graded["results"]["attacker"]
    assert result.score == 0, f"{KINDS[graded['stem']].KIND}: {_report(result, graded['course'])}"


def test_nothing_is_left_behind(graded):
    assert grading_scratch.left_files(graded["scratch"]) == []
    assert grading_scratch.left_running(graded["scratch"]) == []
