"""autograder.grading.nbgrader_runs: pre-checks of submissions, and `python -m autograder grade` on the fixture course."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.grading import nbgrader_runs as grading

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_SRC = REPO_ROOT / "tests" / "fixtures" / "course" / "solutions" / "ex_fixture" / "ex_fixture.ipynb"


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """The fixture assignment released by nbgrader into a temp folder (temp gradebook)."""
    import shutil
    course = tmp_path_factory.mktemp("rel") / "course"
    shutil.copytree(FIXTURE_SRC.parents[2], course)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course)
    grading.release(course)
    return course / "labs" / "ex_fixture" / "ex_fixture.ipynb"


def test_find_assignment(tmp_path):
    course = FIXTURE_SRC.parents[2]
    assert grading.find_assignment(FIXTURE_SRC, course) == "ex_fixture"
    elsewhere = tmp_path / "ex_fixture.ipynb"          # a learner's copy somewhere else
    elsewhere.write_text(FIXTURE_SRC.read_text())
    assert grading.find_assignment(elsewhere, course) == "ex_fixture"
    with pytest.raises(grading.GradingError, match="no assignment"):
        grading.find_assignment(tmp_path / "unknown.ipynb", course)


def test_assignments_lists_source_folders():
    assert grading.assignments(FIXTURE_SRC.parents[2]) == ["ex_fixture"]


def test_precheck_accepts_release_and_solution(released):
    assert grading.precheck(released, released) == ("ok", [])
    assert grading.precheck(FIXTURE_SRC, released, FIXTURE_SRC) == ("ok", [])


def test_precheck_flags_invalid_json(tmp_path, released):
    bad = tmp_path / "bad.ipynb"
    bad.write_text('{"cells": [')
    status, notes = grading.precheck(bad, released)
    assert status == "invalid-notebook" and "JSONDecodeError" in notes[0]
    bad.write_text('{"not": "a notebook"}')
    assert grading.precheck(bad, released)[0] == "invalid-notebook"


def test_precheck_flags_deleted_and_edited_cells(tmp_path, released):
    nb = nbformat.read(str(released), as_version=4)
    nb2 = copy.deepcopy(nb)
    nb2.cells = [c for c in nb2.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "q1_check"]
    for c in nb2.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "ex1_check":
            c.source = "pass"
    p = tmp_path / "s.ipynb"
    nbformat.write(nb2, str(p))
    status, notes = grading.precheck(p, released)
    assert status == "ok"
    assert any("deleted" in n and "q1_check" in n for n in notes)
    assert any("edited" in n and "ex1_check" in n for n in notes)


def test_grade_cli_solution_full_marks_and_course_untouched(tmp_path):
    course = FIXTURE_SRC.parents[2]
    before = sorted(p.relative_to(course) for p in course.rglob("*"))
    out = subprocess.run([sys.executable, "-m", "autograder", "--course", str(course), "grade", str(FIXTURE_SRC),
                          "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, env=grading.nbgrader_env({"COURSE_CELL_TIMEOUT": "20"}),
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "score: 4 / 4"
    assert any(l.split()[0] == "ex2_check" and "2 / 2" in l for l in lines[1:-1])
    assert sorted(p.relative_to(course) for p in course.rglob("*")) == before
    assert (tmp_path / "r.json").exists()


def test_grade_missing_notebook_is_clear_error(tmp_path, capsys):
    from autograder.cli import main
    assert main(["grade", str(tmp_path / "nope.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_run_nbgrader(tmp_path):
    rc, out = grading.run_nbgrader(["--version"], tmp_path, timeout=120)
    assert rc == 0 and "0.9.6" in out       # a command past its time: tests/autograder/test_nbgrader_fork.py


def test_grade_cli_released_stub_scores_zero_and_require_full_fails(released):
    course = released.parents[2]
    out = subprocess.run([sys.executable, "-m", "autograder", "--course", str(course), "grade", str(released),
                          "--require-full"],
                         capture_output=True, text=True, env=grading.nbgrader_env({"COURSE_CELL_TIMEOUT": "20"}),
                         timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "score: 0 / 4"
    assert any("NotImplementedError" in l for l in lines)
    assert not (course / "submitted").exists() and not (course / "gradebook.db").exists()


def _executed_with(output: dict) -> str:
    """An executed notebook of one test cell (grade_id q1_check) whose only output is `output`."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("check_answer('q1', answer_q1)")
    cell.metadata["nbgrader"] = {"grade_id": "q1_check", "grade": True, "solution": False, "points": 1}
    cell.outputs = [nbformat.from_dict(output)]
    nb.cells = [cell]
    return nbformat.writes(nb)


def test_the_report_says_what_the_notebook_says():
    """A grade's note is the line the learner's notebook shows (the course's explanation, the traceback's last
    entry), not the exception's raw value: "Question 1 is not answered yet", not "name 'answer_q1' is not defined"
    (issue 60, item 4)."""
    told = "Question 1 is not answered yet: give `answer_q1` a value in the answer cell above and run that cell."
    out = {"output_type": "error", "ename": "NameError", "evalue": "name 'answer_q1' is not defined",
           "traceback": ["  Cell In[3], line 1\n    check_answer('q1', answer_q1)", told]}
    assert grading.read_executed(_executed_with(out)).errors["q1_check"] == told
    coloured = dict(out, traceback=["\x1b[0;31mNameError\x1b[0m: name 'answer_q1' is not defined\n  more"])
    assert grading.read_executed(_executed_with(coloured)).errors["q1_check"] == \
        "NameError: name 'answer_q1' is not defined"
    bare = dict(out, traceback=[])
    assert grading.read_executed(_executed_with(bare)).errors["q1_check"] == \
        "NameError: name 'answer_q1' is not defined"
