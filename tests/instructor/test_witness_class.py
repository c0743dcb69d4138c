"""A class graded by the real autograde (nbgrader, bubblewrap, two jobs) on one exercise whose check refuses the
reference (lab 02's slot_of): students who forge what their kernel reports about their code (its watch for calls
into the reference switched off, the reference's source read from disk and run) earn nothing, because the cell is
graded again in a witness whose package lacks the reference (autograder/judging/witness.py); the honest student keeps the
points; no code reaches a file outside the sandboxes; nothing is left running."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.grading import batch, nbgrader_runs as grading
from autograder.judging import sandbox

import grading_scratch  # noqa: E402  (tests/instructor/ is on sys.path under pytest)

pytestmark = pytest.mark.slow

_NO_SANDBOX = sandbox.probe()
if _NO_SANDBOX and not os.environ.get("CI"):
    pytest.skip(f"no grading sandbox here ({_NO_SANDBOX})", allow_module_level=True)

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "ex_witness"
SECRET = "witness-canary-51be"

SOLUTION = ("def slot_of(table, position, block_size):\n"
            "    ### BEGIN SOLUTION\n"
            "    index = position // block_size\n"
            "    if position < 0 or index >= len(table):\n"
            "        raise ValueError(f'position {position} is past the table')\n"
            "    return table[index] * block_size + position % block_size\n"
            "    ### END SOLUTION\n")
CHECK = "from autograder.lab02 import check_slot_mapping\ncheck_slot_mapping(slot_of)"
HONEST = SOLUTION.replace("    ### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION\n", "")
READ_CANARY = ("try:\n"
               "    print(open(CANARY_PATH).read())\n"
               "except OSError as exc:\n"
               "    print('canary:', type(exc).__name__)\n")
STUDENTS = {       # student -> (answer cell, expected score)
    "honest": (HONEST, 2.0),
    "forged_watch": ("from minigpt.cache.block_table import slot_of as _reference\n"
                     "def slot_of(table, position, block_size):\n"
                     "    return _reference(table, position, block_size)\n"
                     "import autograder.judging.observe as _observe, autograder.checking.reference_guard as _guard\n"
                     "_observe.observed_call = lambda call, options: (call(), {})\n"
                     "_guard.own_work = lambda *args, **kwargs: None\n" + READ_CANARY, 0.0),
    "forged_source": ("import pathlib, contextlib, minigpt.cache.block_table as _module\n"
                      "import autograder.checking.reference_guard as _guard\n"
                      "_copy = {}\n"
                      "exec(pathlib.Path(_module.__file__).read_text(), _copy)\n"
                      "def slot_of(table, position, block_size):\n"
                      "    return _copy['slot_of'](table, position, block_size)\n"
                      "_guard.no_calls_into = lambda *refs, **how: contextlib.nullcontext()\n" + READ_CANARY, 0.0),
    # the kernel leaves the reference's source in every folder it may write that another process might see (the
    # judge's socket folder among them); the cell replayed in the witness runs what it finds there
    "smuggled_source": ("import os, pathlib, contextlib, minigpt.cache.block_table as _module\n"
                        "import autograder.checking.reference_guard as _guard\n"
                        "_mine = ('/', '/tmp', '/dev/shm', '/proc', '/dev')\n"
                        "_shared = [m for m in (line.split()[4] for line in open('/proc/self/mountinfo'))\n"
                        "           if m not in _mine and os.path.isdir(m) and os.access(m, os.W_OK)]\n"
                        "_found = [p for d in _shared for p in pathlib.Path(d).glob('stash-*.py')]\n"
                        "_source = _found[0].read_text() if _found else pathlib.Path(_module.__file__).read_text()\n"
                        "for _d in _shared:\n"
                        "    with contextlib.suppress(OSError):\n"
                        "        pathlib.Path(_d, 'stash-block_table.py').write_text(_source)\n"
                        "_copy = {}\n"
                        "exec(_source, _copy)\n"
                        "def slot_of(table, position, block_size):\n"
                        "    return _copy['slot_of'](table, position, block_size)\n"
                        "_guard.no_calls_into = lambda *refs, **how: contextlib.nullcontext()\n" + READ_CANARY, 0.0),
}


def _cell(source: str, grade_id: str, *, solution: bool, grade: bool, points: int = 0):
    cell = nbformat.v4.new_code_cell(source)
    meta = {"grade_id": grade_id, "solution": solution, "grade": grade, "locked": not solution, "schema_version": 3}
    cell.metadata["nbgrader"] = {**meta, **({"points": points} if grade else {})}
    return cell


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("witness-class")
    canary = root / "canary.txt"
    canary.write_text(SECRET)
    course = root / "course"
    (course / "solutions" / ASSIGNMENT).mkdir(parents=True)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("Exercise: the physical slot of a logical position."),
                _cell(SOLUTION, "ex1_code", solution=True, grade=False),
                _cell(CHECK, "ex1_check", solution=False, grade=True, points=2)]
    nbformat.write(nb, str(course / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"))
    env = grading.nbgrader_env({"COURSE_CELL_TIMEOUT": "120"})
    grading.release(course, env=env)
    released = nbformat.read(str(course / "labs" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), as_version=4)
    for student, (answer, _) in STUDENTS.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        mine = nbformat.from_dict(released)
        for cell in mine.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == "ex1_code":
                cell.source = answer.replace("CANARY_PATH", repr(str(canary)))
        nbformat.write(mine, str(folder / f"{ASSIGNMENT}.ipynb"))
    before = {p.name for p in root.iterdir()}
    with grading_scratch.scratch_folder() as scratch:      # the grading processes' sockets, witnesses' packages
        with grading_scratch.as_tmpdir(scratch):
            results = batch.autograde(course, timeout=300, env=env, log=lambda line: None, progress=False, jobs=2)
        yield {"results": {r.student: r for r in results}, "canary": canary, "root": root,
               "before": before, "course": course, "scratch": scratch}


def test_forged_reports_earn_nothing_and_the_honest_student_keeps_the_points(graded):
    scores = {student: result.score for student, result in graded["results"].items()}
    assert scores == {student: expected for student, (_, expected) in STUDENTS.items()}
    assert all(result.status == "ok" for result in graded["results"].values())


def test_the_forgeries_are_told_they_call_the_reference(graded):
    autograded = graded["course"] / "autograded"
    for student in ("forged_watch", "forged_source", "smuggled_source"):
        nb = nbformat.read(str(autograded / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), as_version=4)
        check = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ex1_check")
        errors = [o for o in check.outputs if o.output_type == "error"]
        assert errors and errors[0].ename == "ReferenceHandedIn", errors


def test_nothing_outside_the_sandboxes_was_read_written_or_left_running(graded):
    assert graded["canary"].read_text() == SECRET
    assert {p.name for p in graded["root"].iterdir()} == graded["before"]
    autograded = graded["course"] / "autograded"
    for student in ("forged_watch", "forged_source", "smuggled_source"):
        text = (autograded / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text()
        assert SECRET not in text
    assert grading_scratch.left_files(graded["scratch"]) == []
    assert grading_scratch.left_running(graded["scratch"]) == []
