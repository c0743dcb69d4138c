"""End to end instructor run on the tiny fixture course (tests/fixtures/course, 3 exercises, 4 points).

release -> a fake class of submissions, honest and hostile (tests/instructor/hostile_submissions.py) ->
autograde (real nbgrader, each kernel in the bubblewrap sandbox, two at a time, sqlite gradebook) ->
generate_feedback -> export to CSV. Every submission is graded, bad ones included, and the batch
completes with a status line per submission. The same fixture course is then graded with --unsafe (the
gradebook guard must catch what the sandbox no longer stops) and on a Dask LocalCluster (same results).
One graded class is shared by the tests (module fixtures): about 30 small submissions in all.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder.grading import batch, nbgrader_runs as grading, notebooks
from autograder.judging import sandbox

import hostile_submissions as hostile  # noqa: E402  (tests/instructor/ is on sys.path under pytest)

pytestmark = pytest.mark.slow

# Without a sandbox (no bubblewrap, no user namespaces) the batch refuses to run: skip, except in CI ($CI set).
_NO_SANDBOX = sandbox.probe()
if _NO_SANDBOX and not os.environ.get("CI"):
    pytest.skip(f"no grading sandbox here ({_NO_SANDBOX})", allow_module_level=True)

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
    "crashing":  ({**GOOD, "ex2_code": "import os\nos._exit(1)"}, 1, "kernel-died"),   # ex1 passed before
    # 20,000 prints, 380,000 characters (past the 100,000 a text output keeps): 0.2 s of the 5 s cell limit
    # alone here; 100,000 prints took 0.9 s and ran out the limit under CI's load
    "chatty":    ({**GOOD, "ex1_code": "for i in range(20_000):\n    print(f'flood line {i:>6}')\n" + GOOD["ex1_code"]},
                  4, "ok"),
    "giantline": ({**GOOD, "ex1_code": "print('x' * 5_000_000)\n" + GOOD["ex1_code"]}, 4, "ok"),
    "tampering": ({**GOOD, "ex1_code": "def add(a, b):\n    return a - b", "@ex1_check": "pass"}, 3, "ok"),
    "deleting":  ({**GOOD, "-q1_check": None}, 3, "ok"),
}


def make_submission(released: Path, spec) -> str:
    """Notebook text for one fake student, starting from the released notebook.

    spec: notebook text, or {grade_id: new source, "@grade_id": new source of a locked cell,
    "-grade_id": delete the cell, "#edit": function that edits the notebook node}.
    """
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
    if "#edit" in spec:
        spec["#edit"](nb)
    return nbformat.writes(nb, version=4) if "#edit" not in spec else json.dumps(nb)


@pytest.fixture(scope="module")
def listener():
    """A TCP listener on the host's loopback that would hand out the answer; counts connections."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    hits = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            hits.append(1)
            conn.sendall(b"4")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join()
    srv.close()


def _survivors() -> list[int]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if hostile.SURVIVOR_MARK.encode() in cmdline.read_bytes():
                out.append(int(cmdline.parent.name))
        except OSError:
            continue
    return out


def _grade_course(root: Path, cls: dict, release_from: Path | None = None, **kwargs):
    """Release the fixture course in root (or copy the labs/ of release_from), write a class of
    submissions, autograde it (real nbgrader)."""
    course = root / "course"
    shutil.copytree(FIXTURE_COURSE, course)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    env = grading.nbgrader_env({"COURSE_CELL_TIMEOUT": "5"})
    if release_from is None:
        released = grading.release(course, env=env)
    else:                          # the same release, one nbgrader run fewer
        shutil.copytree(release_from / "labs", course / "labs")
        released = [course / "labs" / ASSIGNMENT]
    lab = course / "labs" / ASSIGNMENT / NB_NAME
    for student, (spec, _, _) in cls.items():
        d = course / "submitted" / student / ASSIGNMENT
        d.mkdir(parents=True)
        files = spec.pop("#files", {}) if isinstance(spec, dict) else {}
        (d / NB_NAME).write_text(make_submission(lab, spec))
        for name, make in files.items():
            make(d / name)
    lines: list[str] = []
    results = batch.autograde(course, timeout=120, env=env, log=lines.append, progress=False, **kwargs)
    print("\n".join(lines))
    return course, lab, released, env, {r.student: r for r in results}, lines


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory, listener):
    """Run the whole instructor workflow once, honest and hostile class together, two jobs at a time."""
    root = tmp_path_factory.mktemp("instructor")
    port, hits = listener
    canary = root / "canary.txt"          # outside every sandbox: no submission may read it or write beside it
    canary.write_text(hostile.CANARY_SECRET)
    cls = {**CLASS, **hostile.hostile_class(root / "course", port, GOOD, canary)}
    # a 128 MiB tmpfs (default 512 MiB) so that the 2 GiB writer hits the cap well within the 5 s cell limit
    policy = sandbox.SandboxPolicy(tmp_bytes=128 << 20, cpu_seconds=125)
    course, lab, released, env, results, lines = _grade_course(root, cls, jobs=2, policy=policy)
    assert released == [course / "labs" / ASSIGNMENT]
    time.sleep(2)              # a process that outlived its grading would act now
    feedback = grading.generate_feedback(course, env=env)
    csv_path = grading.export_grades(course, course / "grades.csv", env=env)
    return {"course": course, "lab": lab, "results": results, "lines": lines, "class": cls,
            "feedback": feedback, "csv": csv_path, "listener_hits": hits, "survivors": _survivors(), "canary": canary}


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


def _status_lines(graded) -> dict[str, str]:
    return {line.split()[0]: line for line in graded["lines"] if line.split()[0] in graded["class"]}


def test_batch_says_first_that_it_is_sandboxed(graded_class):
    assert graded_class["lines"][0].startswith("sandbox: bubblewrap")


def test_every_submission_is_graded_with_expected_score(graded_class):
    results, cls = graded_class["results"], graded_class["class"]
    assert sorted(results) == sorted(cls)
    got = {s: (r.score, r.status) for s, r in results.items()}
    want = {s: (float(score), status) for s, (_, score, status) in cls.items()}
    assert got == want, "\n".join(graded_class["lines"])
    assert all(r.max_score == 4 for r in results.values())
    assert {r.status for r in results.values()} <= set(batch.STATUSES)


def test_status_lines_say_what_happened(graded_class):
    lines = _status_lines(graded_class)
    assert len(lines) == len(graded_class["class"])
    assert "invalid-notebook" in lines["badjson"] and "not a valid notebook" in lines["badjson"]
    assert "kernel-died" in lines["crashing"] and "the kernel died in ex2_code" in lines["crashing"]
    assert "timed out: ex2_code" in lines["looping"]
    assert "output truncated in: ex1_code" in lines["chatty"]
    assert "output truncated in: ex1_code" in lines["giantline"]
    assert "locked cells edited" in lines["tampering"] and "ex1_check" in lines["tampering"]
    assert "cells deleted" in lines["deleting"] and "q1_check" in lines["deleting"]
    assert " 4 / 4  ok" in lines["correct"]


def test_hostile_submissions_are_contained(graded_class):
    """Each attack fails inside the sandbox, and the status line says what stopped it."""
    lines = _status_lines(graded_class)
    assert "did not stop when interrupted" in lines["sigint_loop"] and "timeout" in lines["sigint_loop"]
    assert "disk limit (q1_answer)" in lines["disk_2gib"]
    assert "memory limit (q1_answer)" in lines["memory_3gib"]
    assert "no network (q1_answer)" in lines["net_loopback"]
    assert "no network (q1_answer)" in lines["net_dns"]
    assert "were still running when grading ended; killed with the sandbox" in lines["survivor"]
    assert "kernelspec 'instructor-unsandboxed' ignored" in lines["metadata"]
    assert "cell tags dropped" in lines["metadata"] and "not in the assignment ignored: bonus" in lines["metadata"]
    assert "duplicated grade cells ignored: ex2_check" in lines["metadata"]
    assert "left out answers.txt (a symbolic link)" in lines["read_solutions"]
    assert "left out solution_copy.ipynb (a hard link" in lines["read_solutions"]
    assert graded_class["listener_hits"] == [], "a sandboxed kernel reached the host's loopback"
    assert graded_class["survivors"] == [], "a process started by a submission outlived its grading"
    sig = {c.grade_id: c for c in graded_class["results"]["sigint_loop"].cells}
    assert (sig["ex1_check"].score, sig["ex2_check"].score, sig["q1_check"].score) == (1, 0, 0)
    assert "not run" in sig["q1_check"].note


def test_learner_code_cannot_reach_into_the_judge(graded_class):
    """Learner code that writes to the judge's socket itself gets no code run there: no course function by path, no
    dunder, no name of the judge's namespace; the canary outside every sandbox is neither read nor written beside,
    and the judged cells score as the honest code does (q1 would be 4 had the canary been read)."""
    results = graded_class["results"]
    reach = {c.grade_id: c.score for c in results["judge_reach"].cells}
    assert reach == {"ex1_check": 1, "ex2_check": 2, "q1_check": 0}, reach
    canary = graded_class["canary"]
    assert canary.read_text() == hostile.CANARY_SECRET
    assert sorted(p.name for p in canary.parent.iterdir() if p.is_file()) == ["canary.txt"], \
        "something wrote beside the canary"


def test_a_flood_from_the_kernel_fails_only_its_cell(graded_class):
    """A reply of 50 MB of JSON, or nested 200,000 deep, is refused before it is decoded: that check fails, the judge
    stays up (the checks after it are graded), and nothing else is touched."""
    for student in ("judge_flood_wide", "judge_flood_deep"):
        cells = {c.grade_id: c.score for c in graded_class["results"][student].cells}
        assert cells == {"ex1_check": 0, "ex2_check": 2, "q1_check": 1}, (student, cells)


def test_a_judged_check_past_its_time_limit_is_a_timeout(graded_class):
    """Learner code that sleeps through a judged check: that check is reported as timed out (not as a broken pipe)
    and earns nothing; the checks after it are graded."""
    result = graded_class["results"]["judge_timeout"]
    cells = {c.grade_id: c for c in result.cells}
    assert (cells["ex1_check"].score, cells["ex2_check"].score, cells["q1_check"].score) == (0, 2, 1)
    assert cells["ex1_check"].note == "timed out", cells["ex1_check"].note
    assert "timed out: ex1_check" in _status_lines(graded_class)["judge_timeout"]


def test_gradebook_is_intact_after_the_hostile_class(graded_class):
    """Scores, maxima, rows and manual scores are the grader's own: nothing a submission wrote."""
    from nbgrader.api import Gradebook

    with Gradebook(grading.db_url_for(graded_class["course"] / "gradebook.db")) as gb:
        assert gb.find_assignment(ASSIGNMENT).max_score == 4
        assert sorted(s.id for s in gb.students) == sorted(graded_class["class"])
        for student, (_, score, _) in graded_class["class"].items():
            sub = gb.find_submission(ASSIGNMENT, student)
            assert sub.score == score, student
            assert all(g.manual_score is None for nb in sub.notebooks for g in nb.grades), student


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
    for student in graded_class["class"]:
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
    assert sorted(rows) == sorted(graded_class["class"])
    for student, (_, score, _) in graded_class["class"].items():
        assert float(rows[student]["score"]) == score, student
        assert float(rows[student]["max_score"]) == 4


def test_feedback_shows_no_test_source_or_solution(graded_class):
    secrets = ["assert add(2, 3) == 5", "assert mean([4.0]) == 4.0", "HIDDEN TESTS", "### BEGIN SOLUTION"]
    pages = sorted(graded_class["feedback"].rglob("*.html"))
    assert len(pages) >= 20
    for page in pages:
        html = page.read_text()
        leaked = [s for s in secrets if s in html]
        assert not leaked, f"{page}: {leaked}"
    stub = (graded_class["feedback"] / "stubbed" / ASSIGNMENT / "ex_fixture.html").read_text()
    assert "NotImplementedError" in stub and "test cell ex1_check" in stub
    partial = (graded_class["feedback"] / "partial" / ASSIGNMENT / "ex_fixture.html").read_text()
    assert "mean([1, 2, 3]) should be 2" in partial          # the failure message a learner needs


# ----------------------------------------------------------------------------- the same, other ways

@pytest.fixture(scope="module")
def unsafe_class(tmp_path_factory, graded_class):
    """--unsafe: no sandbox; attacks on the gradebook then reach it, and the guard must catch them."""
    root = tmp_path_factory.mktemp("unsafe")
    course = root / "course"
    attacks = hostile.hostile_class(course, 0, GOOD, root / "canary.txt")
    cls = {"correct": CLASS["correct"], "gb_others": attacks["gb_others"], "gb_own_manual": attacks["gb_own_manual"]}
    course, _, _, env, first, lines = _grade_course(root, cls, graded_class["course"], unsafe=True,
                                                    students=["correct"])
    from nbgrader.api import Gradebook

    url = grading.db_url_for(course / "gradebook.db")
    with Gradebook(url) as gb:          # gb_own_manual was graded before: its rows exist
        gb.update_or_create_student("gb_own_manual")
        gb.update_or_create_submission(ASSIGNMENT, "gb_own_manual")
    again: list[str] = []
    second = batch.autograde(course, students=["gb_others", "gb_own_manual"], timeout=120, env=env,
                               log=again.append, progress=False, unsafe=True)
    csv_path = grading.export_grades(course, course / "grades.csv", env=env)
    with open(csv_path, newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    return {"course": course, "first": first, "second": {r.student: r for r in second}, "lines": lines + again,
            "rows": rows}


def test_unsafe_mode_warns_and_catches_tampering(unsafe_class):
    assert unsafe_class["lines"][0].startswith("WARNING: --unsafe")
    second = unsafe_class["second"]
    assert second["gb_others"].status == "tampered" and second["gb_others"].score == 0
    assert any("changed from outside the grader" in n for n in second["gb_others"].notes)
    assert second["gb_own_manual"].status == "tampered" and second["gb_own_manual"].score == 0
    rows = unsafe_class["rows"]
    assert float(rows["correct"]["score"]) == 4            # the other student's grade, restored
    assert list((unsafe_class["course"]).glob("gradebook.db.backup-*")), "no backup before the second batch"


@pytest.fixture(scope="module")
def dask_class(tmp_path_factory, graded_class):
    """Three honest submissions graded on a Dask LocalCluster (one worker thread: like --jobs 1)."""
    pytest.importorskip("distributed")
    cls = {s: CLASS[s] for s in ("correct", "partial", "crashing")}
    cls = {s: (copy.deepcopy(spec), score, status) for s, (spec, score, status) in cls.items()}
    _, _, _, _, results, _ = _grade_course(tmp_path_factory.mktemp("dask"), cls, graded_class["course"], jobs=1,
                                           scheduler="local-threads")
    return results


def test_dask_and_one_job_give_the_same_results_as_two_jobs(dask_class, graded_class):
    for student, r in dask_class.items():
        other = graded_class["results"][student]
        assert (r.score, r.status, [(c.grade_id, c.score) for c in r.cells]) == \
            (other.score, other.status, [(c.grade_id, c.score) for c in other.cells]), student
