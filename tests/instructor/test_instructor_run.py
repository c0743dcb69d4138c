"""End to end instructor run on the tiny fixture course (tests/fixtures/course, 3 exercises, 4 points).

release -> a fake class of submissions -> autograde (real nbgrader, sqlite gradebook) ->
generate_feedback -> export to CSV. Every submission is graded, bad ones included, and the batch
completes with a status line per submission.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import nbformat
import pytest

from autograder import grading, notebooks

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_COURSE = REPO_ROOT / "tests" / "fixtures" / "course"
ASSIGNMENT = "ex_fixture"
NB_NAME = "ex_fixture.ipynb"

GOOD = {
    "ex1_code": "def add(a, b):\n    return a + b",
    "ex2_code": "def mean(xs):\n    return sum(xs) / len(xs)",
    "q1_answer": "answer = 4",
}

# student -> (how the notebook is made, expected score, expected status)
CLASS = {
    "correct":   (dict(GOOD), 4, "ok"),
    "stubbed":   ({}, 0, "ok"),
    "partial":   ({**GOOD, "ex2_code": "def mean(xs):\n    return sum(xs) / (len(xs) + 1)"}, 2, "ok"),
    "badjson":   ("{\"cells\": [ this is not json", 0, "invalid-notebook"),
    "looping":   ({**GOOD, "ex2_code": "while True:\n    pass"}, 2, "ok"),
    "crashing":  ({**GOOD, "ex2_code": "import os\nos._exit(1)"}, 0, "kernel-died"),
    "chatty":    ({**GOOD, "ex1_code": "for i in range(100_000):\n    print(i)\n" + GOOD["ex1_code"]}, 4, "ok"),
    "giantline": ({**GOOD, "ex1_code": "print('x' * 5_000_000)\n" + GOOD["ex1_code"]}, 4, "ok"),
    "tampering": ({**GOOD, "ex1_code": "def add(a, b):\n    return a - b", "@ex1_check": "pass"}, 3, "ok"),
    "deleting":  ({**GOOD, "-q1_check": None}, 3, "ok"),
}


def make_submission(released: Path, spec) -> str:
    """Notebook text for one fake student, starting from the released notebook."""
    if isinstance(spec, str):
        return spec
    nb = nbformat.read(str(released), as_version=4)
    cells = []
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if f"-{gid}" in spec:
            continue
        cell = copy.deepcopy(cell)
        if gid in spec:
            cell.source = spec[gid]
        if f"@{gid}" in spec:
            cell.source = spec[f"@{gid}"]
        cells.append(cell)
    nb.cells = cells
    return nbformat.writes(nb)


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """Run the whole instructor workflow once; tests below look at its results."""
    import shutil

    course = tmp_path_factory.mktemp("instructor") / "course"
    shutil.copytree(FIXTURE_COURSE, course)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    env = grading.nbgrader_env({"COURSE_CELL_TIMEOUT": "5"})

    released = grading.release(course, env=env)
    assert released == [course / "labs" / ASSIGNMENT]
    lab = course / "labs" / ASSIGNMENT / NB_NAME

    for student, (spec, _, _) in CLASS.items():
        d = course / "submitted" / student / ASSIGNMENT
        d.mkdir(parents=True)
        (d / NB_NAME).write_text(make_submission(lab, spec))

    lines: list[str] = []
    results = grading.autograde(course, timeout=120, env=env, log=lines.append)
    print("\n".join(lines))
    feedback = grading.generate_feedback(course, env=env)
    csv_path = grading.export_grades(course, course / "grades.csv", env=env)
    return {"course": course, "lab": lab, "results": {r.student: r for r in results}, "lines": lines,
            "feedback": feedback, "csv": csv_path}


def test_release_is_nbgrader_output_and_normalized(graded_class):
    lab = graded_class["lab"]
    assert notebooks.is_normalized(lab)
    nb = nbformat.read(str(lab), as_version=4)
    text = nbformat.writes(nb)
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    assert "raise NotImplementedError()" in text
    checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [c.metadata.nbgrader.grade_id for c in checks] == ["ex1_check", "ex2_check", "q1_check"]
    assert all(c.metadata.nbgrader.get("checksum") for c in checks)


def test_every_submission_is_graded_with_expected_score(graded_class):
    results = graded_class["results"]
    assert sorted(results) == sorted(CLASS)
    got = {s: (r.score, r.status) for s, r in results.items()}
    want = {s: (float(score), status) for s, (_, score, status) in CLASS.items()}
    assert got == want, "\n".join(graded_class["lines"])
    assert all(r.max_score == 4 for r in results.values())


def test_status_lines_say_what_happened(graded_class):
    lines = {line.split()[0]: line for line in graded_class["lines"]}
    assert len(lines) == len(CLASS)
    assert "invalid-notebook" in lines["badjson"] and "not a valid notebook" in lines["badjson"]
    assert "kernel-died" in lines["crashing"]
    assert "timed out: ex2_code" in lines["looping"]
    assert "output truncated in: ex1_code" in lines["chatty"]
    assert "output truncated in: ex1_code" in lines["giantline"]
    assert "locked cells edited" in lines["tampering"] and "ex1_check" in lines["tampering"]
    assert "cells deleted" in lines["deleting"] and "q1_check" in lines["deleting"]
    assert " 4 / 4  ok" in lines["correct"]


def test_per_cell_scores_and_notes(graded_class):
    r = graded_class["results"]
    cells = {c.grade_id: c for c in r["partial"].cells}
    assert (cells["ex1_check"].score, cells["ex2_check"].score, cells["q1_check"].score) == (1, 0, 1)
    assert cells["ex2_check"].note.startswith("AssertionError")
    stub = {c.grade_id: c for c in r["stubbed"].cells}
    assert all(c.score == 0 for c in stub.values())
    assert "NotImplementedError" in stub["ex1_check"].note
    loop = {c.grade_id: c for c in r["looping"].cells}
    assert loop["ex2_check"].score == 0 and loop["ex1_check"].score == 1


def test_autograded_notebooks_stay_small(graded_class):
    auto = graded_class["course"] / "autograded"
    for student in ("chatty", "giantline"):
        size = (auto / student / ASSIGNMENT / NB_NAME).stat().st_size
        assert size < 400_000, f"{student}: autograded notebook is {size} bytes; output limits not applied"


def test_other_submissions_untouched(graded_class):
    course = graded_class["course"]
    for student in CLASS:
        assert (course / "submitted" / student / ASSIGNMENT / NB_NAME).exists()


def test_feedback_generated_for_graded_submissions(graded_class):
    fb = graded_class["feedback"]
    for student in ("correct", "stubbed", "partial", "looping", "chatty", "tampering", "deleting"):
        html = fb / student / ASSIGNMENT / "ex_fixture.html"
        assert html.exists(), f"no feedback for {student}"
    assert "4.0 / 4.0" in (fb / "correct" / ASSIGNMENT / "ex_fixture.html").read_text() or \
        "Score: 4.0" in (fb / "correct" / ASSIGNMENT / "ex_fixture.html").read_text()


def test_export_csv_has_everyone(graded_class):
    with open(graded_class["csv"], newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == sorted(CLASS)
    for student, (_, score, _) in CLASS.items():
        assert float(rows[student]["score"]) == score, student
        assert float(rows[student]["max_score"]) == 4
