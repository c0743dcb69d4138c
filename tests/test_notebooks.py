"""Every lab, through real nbgrader: the solution scores full marks, the released notebook scores zero
on every graded cell (also with cells that patch the checks from the kernel, tests/attacks.py), labs/ is what nbgrader generates from solutions/ (not stale), and every committed
notebook is stored normalized (no outputs).

Labs are found under solutions/NN_topic/; a new lab is picked up without touching this file.
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import pytest
from answer_leaks import leaks
from attacks import ATTACKS, CHEATS, with_attacks

from autograder.grading import nbgrader_runs as grading, notebooks

REPO_ROOT = Path(__file__).resolve().parents[1]
LABS = grading.assignments(REPO_ROOT)
NOTEBOOKS = notebooks.find_notebooks(REPO_ROOT)
LAB_TIMEOUT_S = 600       # wall clock for one whole notebook (labs must run in a few minutes on 2 cores)


def test_there_are_labs():
    assert LABS, "no lab found under solutions/NN_topic/NN_topic.ipynb"


def test_labs_folders_match_solutions():
    released = sorted(p.name for p in (REPO_ROOT / "labs").iterdir() if p.is_dir()) if (REPO_ROOT / "labs").exists() else []
    assert released == LABS, ("labs/ and solutions/ hold different labs; run `make release` "
                              f"(labs/: {released}, solutions/: {LABS})")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(REPO_ROOT)) for p in NOTEBOOKS])
def test_notebook_is_normalized(path):
    assert notebooks.is_normalized(path), (
        f"{path.relative_to(REPO_ROOT)} has outputs or is not normalized. labs/ and solutions/ are the course's "
        "files; learners work in workspace/ (`make lab`): if this holds your work, copy it into workspace/ before "
        "anything else. Course authors: `make normalize`.")


@pytest.fixture(scope="class")
def released_lab(request, tmp_path_factory):
    """(assignment, temp course, fresh release folder, gradebook path): nbgrader run on a copy of the source."""
    a = request.cls.lab
    tmp = tmp_path_factory.mktemp(f"lab_{a}")
    course = grading.make_temp_course(REPO_ROOT, a, tmp / "course")
    db = tmp / "gradebook.db"
    folder = grading.generate_assignment(course, a, db=db)
    for nb in folder.glob("*.ipynb"):
        notebooks.normalize_file(nb)
    return a, course, folder, db


@pytest.fixture(scope="class")
def graded_lab(released_lab):
    """Autograde the solution and the released notebook of one lab, as two students of a temp course."""
    a, course, folder, db = released_lab
    for student, src in (("solution", course / "solutions" / a), ("released", folder)):
        d = course / "submitted" / student / a
        d.mkdir(parents=True)
        for nb in src.glob("*.ipynb"):
            if student == "released":      # the release, plus the four ways to patch the checks from the kernel
                with_attacks(nb, d / nb.name, answers=CHEATS.get(a))     # and, where listed, answers that cheat
            else:
                shutil.copy(nb, d / nb.name)
    # The solution as an instructor's autograde runs it (only the cells a grade depends on); the release with every
    # cell run, so that its execution is also Run All's (test_released_runs_to_the_last_cell)
    every_cell = {"solution": None, "released": grading.nbgrader_env({"COURSE_ALL_CELLS": "1"})}
    return {s: grading.autograde_one(course, a, s, db=db, released=folder, timeout=LAB_TIMEOUT_S, env=every_cell[s])
            for s in ("solution", "released")}


def _gpu_tier_cells(course: Path, assignment: str) -> set[str]:
    """grade_ids of test cells gated by require_gpu(...) (GPU tier)."""
    import nbformat
    ids = set()
    for nb_path in (course / "solutions" / assignment).glob("*.ipynb"):
        for cell in nbformat.read(str(nb_path), as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and "require_gpu(" in cell.source:
                ids.add(meta["grade_id"])
    return ids


def _table(result: grading.SubmissionResult) -> str:
    rows = [result.line()] + [f"  {c.grade_id}: {c.score:g}/{c.max_score:g} {c.note}" for c in result.cells]
    return "\n".join(rows)


class LabNotebook:
    """The tests of one lab's notebook. One subclass per lab (below): pytest-xdist's `--dist loadscope` keeps
    a class on one worker, so each lab is released and graded once, and different labs grade in parallel."""

    lab: str

    def test_labs_not_stale(self, released_lab):
        a, _, fresh, _ = released_lab
        committed = REPO_ROOT / "labs" / a
        assert committed.is_dir(), f"labs/{a} is missing; run `make release`"
        fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        committed_files = sorted(p.relative_to(committed) for p in committed.rglob("*")
                                 if p.is_file() and ".ipynb_checkpoints" not in p.parts and "__pycache__" not in p.parts)
        assert committed_files == fresh_files, f"labs/{a} holds other files than nbgrader generates; run `make release`"
        for rel in fresh_files:
            if rel.suffix == ".ipynb":
                same = notebooks.comparable(committed / rel) == notebooks.comparable(fresh / rel)
            else:
                same = filecmp.cmp(committed / rel, fresh / rel, shallow=False)
            assert same, f"labs/{a}/{rel} is stale (differs from nbgrader's release of solutions/{a}); run `make release`"

    @pytest.mark.slow
    def test_solution_scores_full_marks(self, graded_lab, released_lab):
        """Full marks; without a GPU, full marks on the CPU tier and no points (with the message) for GPU cells."""
        from autograder.harness import gpu_available

        r = graded_lab["solution"]
        assert r.max_score > 0 and r.cells, "the lab has no graded cells"
        assert r.status == "ok", _table(r)
        gpu_cells = set() if gpu_available() else _gpu_tier_cells(released_lab[1], released_lab[0])
        lost = [c.grade_id for c in r.cells if c.grade_id not in gpu_cells and c.score != c.max_score]
        assert not lost, "the solution notebook lost points in " + ", ".join(lost) + ":\n" + _table(r)
        unplanned = [p["grade_id"] for p in r.witness_plans if not p["used"]]
        assert not unplanned, ("these witnessed test cells had no witness plan that covered their checks, so they ran "
                               "twice (kernel, then witness): " + ", ".join(unplanned) + "; run `python -m autograder "
                               "witness-plans --labs " + released_lab[0][:2] + "`")
        for c in r.cells:
            if c.grade_id in gpu_cells:
                assert c.score == 0 and "needs a GPU" in c.note, ("a GPU-tier cell must not award points on a "
                                                                  "machine without a GPU:\n" + _table(r))

    @pytest.mark.slow
    def test_released_notebook_scores_zero_everywhere(self, graded_lab):
        """The released stub earns nothing, even with cells that patch the checks in the kernel (tests/attacks.py:
        no-op check functions, fake check modules, an input transformer that skips test cells, a patched harness):
        test cells run in the judge. Where tests/attacks.py lists CHEATS for the lab (wrappers around the package's
        reference, an output of NaN), those answers earn nothing either."""
        r = graded_lab["released"]
        assert r.status == "ok", _table(r)
        earned = [c for c in r.cells if c.score > 0]
        assert not earned, "the released stub earns points in: " + ", ".join(c.grade_id for c in earned) + "\n" + _table(r)

    @pytest.mark.slow
    def test_no_answer_is_printed_before_its_question(self, graded_lab, released_lab):
        """An interview question needs the method applied, not an earlier output read off: the solution's key
        (what its answer cell prints) appears in no output above the question (tests/answer_leaks.py), neither in
        the solution's graded run nor in the released notebook's full run (the cells grading leaves out)."""
        import nbformat

        a, course, _, _ = released_lab
        executed = sorted((course / "autograded" / "solution" / a).glob("*.ipynb"))
        assert executed, "the solution notebook was not executed"
        for path in executed:
            released = course / "autograded" / "released" / a / path.name
            full_run = nbformat.read(str(released), as_version=4)
            full_run.cells = full_run.cells[len(ATTACKS):]        # the attack cells with_attacks put first
            found = leaks(nbformat.read(str(path), as_version=4), also=(full_run,))
            assert not found, f"solutions/{a}/{path.name}: " + "; ".join(map(str, found))

    @pytest.mark.slow
    def test_run_all_reaches_the_last_cell(self, graded_lab, released_lab):
        """Every cell that raises in the released notebook (run in full by the grading above) is tagged
        raises-exception, so Run All in JupyterLab (and nbclient) goes on to the last cell."""
        import nbformat

        from autograder.grading import runall

        a, course, _, _ = released_lab
        executed = sorted((course / "autograded" / "released" / a).glob("*.ipynb"))
        assert executed, "the released notebook was not executed"
        for path in executed:
            stuck = runall.untagged(nbformat.read(str(path), as_version=4))
            assert not stuck, (f"Run All would stop in labs/{a}/{path.name} at " +
                               ", ".join(f"cell {c.index + 1} ({c.grade_id or c.cell_id}: {c.ename})" for c in stuck) +
                               "; tag them with `python -m autograder runall --fix`")


for _lab in LABS:                                   # TestLab_00_token_factory, TestLab_01_kv_cache, ...
    globals()[f"TestLab_{_lab}"] = type(f"TestLab_{_lab}", (LabNotebook,), {"lab": _lab})
