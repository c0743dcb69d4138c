"""`python -m autograder grading-bench` (autograder/commands/grading_bench.py) without grading anything: the batch is
a fake that answers at once on a fake clock; what is checked is the course it is given, the JSON, the table, the
goals' verdicts and README's block."""

from __future__ import annotations

import json
import shutil

import pytest

from autograder import cli
from autograder.commands import grading_bench as gb
from autograder.grading import batch
from autograder.grading.nbgrader_runs import CellScore, SubmissionResult
from autograder.paths import REPO_ROOT

# Fake seconds of one autograde call: per lab by its number; for the class, per submission / jobs.
LAB_SECONDS = {"00": 8.0, "05": 25.0}
CLASS = {"seconds_per_submission": 16.0}


@pytest.fixture
def course(tmp_path):
    root = tmp_path / "course"
    for a in ("00_token_factory", "05_quantization"):
        (root / "solutions" / a).mkdir(parents=True)
        (root / "solutions" / a / f"{a}.ipynb").write_text("{}")
    shutil.copy(REPO_ROOT / "nbgrader_config.py", root / "nbgrader_config.py")
    return root


@pytest.fixture
def graded(monkeypatch):
    """Replace the batch by a fake; returns the calls it got (course, students, jobs, kwargs)."""
    calls = []
    clock = [0.0]

    def fake_autograde(course_root, assignment_ids=None, students=None, **kw):
        subs = sorted(p for p in (course_root / "submitted").iterdir())
        (assignment,) = {q.name for p in subs for q in p.iterdir()}
        for p in subs:
            assert (p / assignment / f"{assignment}.ipynb").exists()
        calls.append({"assignment": assignment, "students": [p.name for p in subs], **kw})
        jobs = kw["jobs"]
        clock[0] += (LAB_SECONDS[assignment[:2]] if len(subs) == 1 else
                     CLASS["seconds_per_submission"] * len(subs) / jobs)
        times = [{"index": 0, "kind": "course", "seconds": 0.5, "grade_id": None},
                 {"index": 2, "kind": "solution", "seconds": 0.25, "grade_id": "ex1_code"},
                 {"index": 3, "kind": "test", "seconds": 3.0, "grade_id": "ex1_check"}]
        return [SubmissionResult(p.name, assignment, 10.0, 10.0, "ok", seconds=5.0, record_seconds=0.5,
                                 cell_times=times) for p in subs]

    monkeypatch.setattr(batch, "autograde", fake_autograde)
    monkeypatch.setattr(gb, "_clock", lambda: clock[0])
    return calls


def test_labs_and_a_class_of_30_are_measured_and_judged(course, graded, tmp_path, capsys):
    out = tmp_path / "out" / "grading.json"
    assert cli.main(["--course", str(course), "grading-bench", "--labs", "00", "5", "--class-size", "30",
                     "--jobs", "2", "--out", str(out)]) == 0
    # one submission per lab, then the class: 30 copies of lab 05 as s000..s029, 2 jobs; sandboxed (no unsafe),
    # no progress bar
    assert [(c["assignment"], len(c["students"]), c["jobs"]) for c in graded] == [
        ("00_token_factory", 1, 1), ("05_quantization", 1, 1), ("05_quantization", 30, 2)]
    assert graded[2]["students"][0] == "s000" and graded[2]["students"][-1] == "s029"
    assert all(not c.get("unsafe") and c["progress"] is False for c in graded)

    data = json.loads(out.read_text())
    assert data["settings"]["sandboxed"] and data["settings"]["witness"]
    assert data["machine"]["cores"] and "torch" in data["machine"] and len(data["load_before"]) == 3
    lab00, lab05 = data["labs"]
    assert (lab00["seconds"], lab00["goal_s"], lab00["met"]) == (8.0, 10.0, True)
    assert (lab05["seconds"], lab05["goal_s"], lab05["met"]) == (25.0, 20.0, False)
    k = data["class"]
    assert (k["submissions"], k["jobs"], k["seconds"], k["seconds_per_submission"]) == (30, 2, 240.0, 8.0)
    assert k["per_minute"] == 7.5 and k["met"] is True and k["statuses"] == {"ok": 30}
    assert [g["met"] for g in data["goals"]] == [True, False, True]

    table = capsys.readouterr().out
    assert "| 00_token_factory, one submission | 8.0 s" in table and "<= 10 s met" in table
    assert "<= 20 s **not met**" in table
    assert "a class: 30 x 05_quantization, --jobs 2 | 240.0 s | 8.0 s (7.50 a minute)" in table
    assert "<= 300 s met" in table
    # where the job's 5 s went: 0.5 course, 0.25 learner, 3.0 test, the rest 1.25; slowest cells by name
    assert lab05["profile"] == {"cells_run": 3, "course_s": 0.5, "solution_s": 0.25, "test_s": 3.0,
                                "outside_cells_s": 1.25, "slowest": [["ex1_check", 3.0], ["cell 1", 0.5],
                                                                     ["ex1_code", 0.25]]}
    assert "| 05_quantization (3 cells run) | 0.5 | 0.2 | 3.0 | 1.2 | ex1_check 3.0, cell 1 0.5, ex1_code 0.2 | 20.0 |" in table
    # the missed goal names its largest part (here the 20 s outside the 5-s job); the met one is not listed
    assert ("- 05_quantization: 25.0 s against 20 s; the largest part, 20.0 s, is outside the job (the release and "
            "gradebook, once per assignment); its job 5.0 s") in table and "- 00_token_factory:" not in table
    assert table.startswith("Measured by `make bench` (`python -m autograder grading-bench --labs 00 05 "
                            "--class-size 30 --jobs 2`)")


def test_a_slow_class_a_lost_point_and_a_small_class(course, graded, tmp_path, monkeypatch):
    monkeypatch.setitem(CLASS, "seconds_per_submission", 25.0)
    out = tmp_path / "g.json"
    assert cli.main(["--course", str(course), "grading-bench", "--labs", "00", "--class-size", "30", "--out",
                     str(out)]) == 0
    assert json.loads(out.read_text())["class"]["met"] is False            # 375 s > 300 s
    # a submission that loses a point does not meet its goal, however fast
    real = batch.autograde

    def one_short(*a, **kw):
        return [SubmissionResult(r.student, r.assignment, 9.0, 10.0, "ok",
                                 cells=[CellScore("ex2_speed", 0.0, 1.0, "timed out")])
                for r in real(*a, **kw)]

    monkeypatch.setattr(batch, "autograde", one_short)
    assert cli.main(["--course", str(course), "grading-bench", "--quick", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["lab"] for r in data["labs"]] == ["00"] and data["labs"][0]["met"] is False
    # --quick: a class of 4, which the goal (30 with --jobs 2) does not judge
    assert data["class"]["submissions"] == 4 and data["class"]["met"] is None
    assert data["goals"][-1]["met"] is None and "a class of 4" in data["goals"][-1]["why_not_judged"]
    assert data["labs"][0]["lost"] == data["class"]["lost"] == ["ex2_speed (0 / 1: timed out)"]
    table = gb.render_table(data)
    assert "not judged" in table and "- 00_token_factory: ex2_speed (0 / 1: timed out)" in table


def test_an_unknown_lab_is_an_error(course, graded, capsys):
    assert cli.main(["--course", str(course), "grading-bench", "--labs", "42"]) == 2
    assert "no lab 42" in capsys.readouterr().err and graded == []


def test_readme_block_from_the_json_or_not_measured_yet(course, graded, tmp_path):
    """On a copy of the real README: its markers are there; without a JSON the block says so; with one, it is the
    table; a second run changes nothing; the rest of README is kept."""
    readme = course / "README.md"
    shutil.copy(REPO_ROOT / "README.md", readme)
    original = readme.read_text()
    assert gb.BEGIN in original and gb.END in original
    performance = original.split("## Performance", 1)[1].split("\n## ", 1)[0]
    assert gb.BEGIN in performance and "make bench" in performance

    assert cli.main(["--course", str(course), "grading-bench", "--readme"]) == 0
    text = readme.read_text()
    assert gb.NOT_MEASURED in text

    assert cli.main(["--course", str(course), "grading-bench", "--labs", "00", "--class-size", "2", "--jobs", "2"]) == 0
    out = course / gb.DEFAULT_OUT
    assert out.exists()
    assert cli.main(["--course", str(course), "grading-bench", "--readme"]) == 0
    text = readme.read_text()
    block = text.split(gb.BEGIN, 1)[1].split(gb.END, 1)[0]
    assert block == "\n" + gb.render_table(json.loads(out.read_text()))
    assert text.split(gb.BEGIN)[0] == original.split(gb.BEGIN)[0]
    assert text.split(gb.END)[1] == original.split(gb.END)[1]
    assert not gb.sync_readme(readme, gb.readme_table(out))                  # in step: nothing to change

    (tmp_path / "bare.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="grading-bench markers"):
        gb.sync_readme(tmp_path / "bare.md", "x\n")


def test_cell_times_read_from_nbgrader_output():
    from autograder.grading import preprocessors
    from autograder.grading.nbgrader_runs import cell_times

    mark = preprocessors.TIME_MARK
    out = (f"[AutogradeApp | INFO] {mark} 0 course 1.50 -\nnoise\n[AutogradeApp | INFO] {mark} 4 test 12.25 ex2_check\n"
           f"[AutogradeApp | INFO] {mark} 5\n")
    assert cell_times(out) == [{"index": 0, "kind": "course", "seconds": 1.5, "grade_id": None},
                               {"index": 4, "kind": "test", "seconds": 12.25, "grade_id": "ex2_check"}]
