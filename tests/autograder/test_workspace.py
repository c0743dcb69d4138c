"""The learner's workspace (`make lab`) and `make progress`: a course update never touches a learner's edits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.grading import nbgrader_runs as grading
from autograder.learner import progress, workspace
from autograder.cli import main


def _lab_notebook(gid_points: dict[str, tuple[int, str]], title: str = "v1") -> str:
    """A released-style notebook: a markdown title and one graded cell per grade_id (source, points)."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(f"# Lab {title}"))
    answer = nbformat.v4.new_code_cell("def ex1():\n    raise NotImplementedError()")
    answer.metadata["nbgrader"] = {"grade": False, "grade_id": "ex1_code", "solution": True, "locked": False,
                                   "schema_version": 3}
    nb.cells.append(answer)
    for gid, (points, source) in gid_points.items():
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "points": points, "solution": False,
                                     "locked": True, "schema_version": 3}
        nb.cells.append(cell)
    return nbformat.writes(nb)


@pytest.fixture
def course(tmp_path):
    root = tmp_path / "course"
    for lab in ("00_intro", "01_cache"):
        d = root / "labs" / lab
        d.mkdir(parents=True)
        (d / f"{lab}.ipynb").write_text(_lab_notebook({"ex1_check": (2, "check_ex1()"),
                                                        "gpu_check": (3, "if require_gpu('x'):\n    check()")}))
    (root / "labs" / "01_cache" / "data.txt").write_text("released data\n")
    return root


def _release(course, rel: str, text: str) -> None:
    (course / "labs" / rel).write_text(text)


def test_first_sync_copies_labs(course, tmp_path):
    ws = tmp_path / "ws"
    report = workspace.sync(course, ws)
    assert report.created and sorted(report.copied) == ["00_intro/00_intro.ipynb", "01_cache/01_cache.ipynb",
                                                        "01_cache/data.txt"]
    for rel in report.copied:
        assert (ws / rel).read_bytes() == (course / "labs" / rel).read_bytes()
    again = workspace.sync(course, ws)
    assert not (again.copied or again.updated or again.kept) and "up to date" in again.summary()


def test_the_start_page_is_copied_to_the_top_and_updated_like_a_release(course, tmp_path, repo_root):
    (course / "docs").mkdir()
    (course / "docs" / "START_HERE.md").write_text("# Start here\n")
    ws = tmp_path / "ws"
    report = workspace.sync(course, ws)
    assert "START_HERE.md" in report.copied and "Open START_HERE.md first" in report.summary()
    (course / "docs" / "START_HERE.md").write_text("# Start here, newer\n")
    assert workspace.sync(course, ws).updated == ["START_HERE.md"]
    assert (ws / "START_HERE.md").read_text() == "# Start here, newer\n"
    assert (repo_root / "docs" / "START_HERE.md").is_file(), "the course's own start page"


def test_update_replaces_unedited_and_keeps_edited(course, tmp_path):
    ws = tmp_path / "ws"
    workspace.sync(course, ws)
    mine = "my own work, not a notebook the course wrote"
    (ws / "00_intro" / "00_intro.ipynb").write_text(mine)
    new = _lab_notebook({"ex1_check": (2, "check_ex1()")}, title="v2")
    _release(course, "00_intro/00_intro.ipynb", new)
    _release(course, "01_cache/01_cache.ipynb", new)
    (course / "labs" / "02_new").mkdir()
    _release(course, "02_new/02_new.ipynb", new)

    report = workspace.sync(course, ws)
    assert (ws / "00_intro" / "00_intro.ipynb").read_text() == mine, "a learner's edit was overwritten"
    assert report.kept == ["00_intro/00_intro.ipynb"]
    assert (ws / workspace.NEW_RELEASES / "00_intro" / "00_intro.ipynb").read_text() == new
    assert report.updated == ["01_cache/01_cache.ipynb"] and (ws / "01_cache" / "01_cache.ipynb").read_text() == new
    assert report.copied == ["02_new/02_new.ipynb"]
    summary = report.summary()
    assert "00_intro/00_intro.ipynb has a newer release; your copy is kept" in summary
    assert "make release" not in summary and "git checkout" not in summary


def test_a_learner_file_the_course_does_not_know_is_kept(course, tmp_path):
    ws = tmp_path / "ws"
    (ws / "00_intro").mkdir(parents=True)
    (ws / "00_intro" / "00_intro.ipynb").write_text("made before the manifest existed")
    report = workspace.sync(course, ws)
    assert (ws / "00_intro" / "00_intro.ipynb").read_text() == "made before the manifest existed"
    assert report.kept == ["00_intro/00_intro.ipynb"]


def test_learner_outputs_and_checkpoints_never_travel(course, tmp_path):
    (course / "labs" / "00_intro" / ".ipynb_checkpoints").mkdir()
    (course / "labs" / "00_intro" / ".ipynb_checkpoints" / "x.ipynb").write_text("{}")
    report = workspace.sync(course, tmp_path / "ws")
    assert not any(".ipynb_checkpoints" in r for r in report.copied)


def test_graded_points_split_cpu_and_gpu(course):
    cpu, gpu = progress.graded_points(course / "labs" / "00_intro" / "00_intro.ipynb")
    assert cpu == {"ex1_check": 2.0} and gpu == {"gpu_check": 3.0}


def test_gpu_cells_of_the_course_are_found(repo_root):
    cpu, gpu = progress.graded_points(repo_root / "labs" / "04_flash_attention" / "04_flash_attention.ipynb")
    assert gpu and all("gpu" in gid for gid in gpu), gpu


def _fake_grader(calls):
    def grade(path):
        calls.append(path.name)
        return grading.SubmissionResult("learner", path.parent.name, 2, 5, "ok", [],
                                        [grading.CellScore("ex1_check", 2, 2), grading.CellScore("gpu_check", 0, 3)])
    return grade


def _answer(nb: Path, code: str = "return 1") -> None:
    """Write the learner's cell of a workspace notebook (its outputs alone do not count as work)."""
    book = nbformat.read(str(nb), as_version=4)
    cell = next(c for c in book.cells if c.metadata.get("nbgrader", {}).get("solution"))
    cell.source = f"def ex1():\n    {code}"
    nbformat.write(book, str(nb))


def test_progress_scores_an_untouched_release_zero_without_grading(course, tmp_path):
    ws = tmp_path / "ws"
    workspace.sync(course, ws)
    nb = ws / "00_intro" / "00_intro.ipynb"
    book = nbformat.read(str(nb), as_version=4)
    book.cells[-1].outputs = [nbformat.v4.new_output("stream", text="ran\n")]      # Run All, autosaved: no work
    book.cells[-1].execution_count = 3
    nbformat.write(book, str(nb))
    calls: list[str] = []
    rows = progress.progress(course, ws, grade=_fake_grader(calls))
    assert calls == [] and [(r.cpu_score, r.gpu_score, r.status) for r in rows] == [(0, 0, "not started")] * 2


def test_progress_grades_changed_notebooks_only(course, tmp_path):
    ws = tmp_path / "ws"
    workspace.sync(course, ws)
    for lab in ("00_intro", "01_cache"):
        _answer(ws / lab / f"{lab}.ipynb")
    calls: list[str] = []
    rows = progress.progress(course, ws, grade=_fake_grader(calls))
    assert calls == ["00_intro.ipynb", "01_cache.ipynb"]
    assert [(r.cpu_score, r.cpu_max, r.gpu_score, r.gpu_max, r.status) for r in rows] == [(2, 2, 0, 3, "graded")] * 2
    progress.progress(course, ws, grade=_fake_grader(calls))
    assert len(calls) == 2, "unchanged notebooks were graded again"
    _answer(ws / "01_cache" / "01_cache.ipynb", "return 2")
    rows = progress.progress(course, ws, grade=_fake_grader(calls))
    assert calls[2:] == ["01_cache.ipynb"] and [r.status for r in rows] == ["cached", "graded"]
    table = progress.format_table(rows)
    assert "4 / 4" in table and "0 / 6" in table and "GPU-tier points need a CUDA GPU" in table


def test_progress_reports_missing_and_failed(course, tmp_path):
    ws = tmp_path / "ws"
    workspace.sync(course, ws)
    shutil.rmtree(ws / "00_intro")
    _answer(ws / "01_cache" / "01_cache.ipynb")

    def broken(path):
        raise grading.GradingError("nbgrader failed")
    rows = progress.progress(course, ws, grade=broken)
    assert rows[0].status == "not in workspace" and rows[0].cpu_score is None
    assert rows[1].status.startswith("error") and rows[1].cpu_score is None
    assert "- / 2" in progress.format_table(rows)


def test_workspace_command(course, tmp_path, capsys):
    ws = tmp_path / "ws"
    assert main(["--course", str(course), "workspace", "--dir", str(ws)]) == 0
    assert "created from labs/" in capsys.readouterr().out
    assert json.loads((ws / workspace.MANIFEST).read_text())


def test_a_grading_of_a_workspace_notebook_is_remembered(course, tmp_path):
    """`make grade` records its result where `make progress` looks: the same notebook is not graded again."""
    ws = tmp_path / "ws"
    workspace.sync(course, ws)
    nb = ws / "01_cache" / "01_cache.ipynb"
    _answer(nb)
    progress.record(nb, _fake_grader([])(nb).to_dict())
    progress.record(tmp_path / "elsewhere.ipynb", {"status": "ok", "cells": []})      # outside: ignored
    calls: list[str] = []
    rows = progress.progress(course, ws, labs=["01"], grade=_fake_grader(calls))
    assert calls == [] and [(r.cpu_score, r.status) for r in rows] == [(2, "cached")]


def test_run_all_and_autosave_do_not_make_a_notebook_the_learners(course, tmp_path):
    """Outputs and execution counts written by Run All are not an edit: the next release replaces the notebook in
    place (issue 40: labs 04 and 09 landed in .new-releases/ after a Run All)."""
    ws = tmp_path / "ws"
    workspace.sync(course, ws)
    nb = ws / "01_cache" / "01_cache.ipynb"
    book = nbformat.read(str(nb), as_version=4)
    book.cells[-1].outputs = [nbformat.v4.new_output("stream", text="ran\n")]
    book.cells[-1].execution_count = 7
    book.metadata["widgets"] = {"state": {}}
    nbformat.write(book, str(nb))
    new = _lab_notebook({"ex1_check": (2, "check_ex1()")}, title="v2")
    _release(course, "01_cache/01_cache.ipynb", new)
    report = workspace.sync(course, ws)
    assert report.updated == ["01_cache/01_cache.ipynb"] and not report.kept
    assert nb.read_text() == new


def test_a_manifest_of_bytes_still_recognises_an_unedited_notebook(course, tmp_path):
    """Workspaces made before fingerprints recorded each release's sha256: an unedited copy is still updated."""
    ws = tmp_path / "ws"
    workspace.sync(course, ws)
    manifest = ws / workspace.MANIFEST
    old = {rel: workspace.sha256(ws / rel) for rel in json.loads(manifest.read_text())}
    manifest.write_text(json.dumps(old))
    _release(course, "00_intro/00_intro.ipynb", _lab_notebook({"ex1_check": (2, "check_ex1()")}, title="v2"))
    assert workspace.sync(course, ws).updated == ["00_intro/00_intro.ipynb"]
