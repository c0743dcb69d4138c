"""nbgrader itself, in a subprocess: course folders, nbgrader's commands, what a submission scored.

Everything runs `nbgrader` in a subprocess inside a *course root* (a folder holding
nbgrader_config.py, `solutions/<assignment>/` and, for instructors, `submitted/<student>/<assignment>/`).

* `release`, `generate_feedback`, `export_grades`: nbgrader's commands on a whole course.
* `autograde_one(...)`: `nbgrader autograde` of one submission in place, its kernel not sandboxed (the course's
  own notebooks, tests/test_notebooks.py).
* `precheck`, `read_executed`, `read_scores`: a submission before grading, its executed notebook, its scores.

Learners' notebooks are graded by autograder/grading/batch.py, which stands on this module and is never imported by it:
`batch.autograde` grades every submission under submitted/, each in its own sandbox, and `batch.grade_notebook`
grades one notebook (`make grade`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat

from autograder.grading import output_limits, preprocessors
from autograder.grading.basics import GradingError, SUBMISSION_TIMEOUT_S
from autograder.judging import forked_judges
from autograder.harness import gpu_available
from autograder.grading.notebooks import normalize_file
from autograder.paths import REPO_ROOT
from autograder.grading.preprocessors import LimitOutputSize  # noqa: F401  (named by nbgrader_config.py of older courses)
from autograder.processes import kill_group

CONFIG_NAME = "nbgrader_config.py"
DEFAULT_STUDENT = "learner"

@dataclass
class CellScore:
    grade_id: str
    score: float
    max_score: float
    note: str = ""            # "", "timed out", "AssertionError: ...", "missing from the submission", ...


@dataclass
class SubmissionResult:
    student: str
    assignment: str
    score: float
    max_score: float
    status: str                       # "ok", "invalid-notebook", "kernel-died", "timeout", "error"
    notes: list[str] = field(default_factory=list)
    cells: list[CellScore] = field(default_factory=list)
    seconds: float = 0.0              # wall time of grading it (its job), recording not included
    record_seconds: float = 0.0       # wall time of recording it into the gradebook (in the parent)
    witness_plans: list[dict] = field(default_factory=list)   # its witnessed cells' plans (witness_plans.plans_logged)
    cell_times: list[dict] = field(default_factory=list)      # every code cell run: cell_times(nbgrader's output)

    def line(self) -> str:
        """One status line for the instructor's batch report."""
        extra = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"{self.student:<16} {self.assignment:<20} {_fmt(self.score)} / {_fmt(self.max_score)}  {self.status}{extra}"

    def to_dict(self) -> dict:
        return {"student": self.student, "assignment": self.assignment, "score": self.score,
                "max_score": self.max_score, "status": self.status, "notes": self.notes,
                "cells": [c.__dict__ for c in self.cells], "seconds": round(self.seconds, 2),
                "record_seconds": round(self.record_seconds, 3)}


def _fmt(x: float) -> str:
    return f"{x:g}"


# ----------------------------------------------------------------------------- nbgrader subprocesses

def nbgrader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for nbgrader: this interpreter's bin dir first on PATH (nbgrader shells out to alembic)."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.pop("NBGRADER_EXECUTION", None)
    # The notebooks' Triton kernels are compiled only where torch sees a GPU and interpreted elsewhere, whatever this
    # process's environment says (a script or a test may have set TRITON_INTERPRET=0 for itself).
    if not gpu_available():
        env["TRITON_INTERPRET"] = "1"
    if extra:
        env.update(extra)
    return env


def cell_times(out: str) -> list[dict]:
    """The code cells a grading ran, from nbgrader's output (preprocessors.TIME_MARK lines), in order: index, kind
    ('course', 'solution' or 'test'), seconds, grade_id (None for a cell without one)."""
    rows = []
    for line in out.splitlines():
        if preprocessors.TIME_MARK not in line:
            continue
        fields = line.split(preprocessors.TIME_MARK, 1)[1].split()
        if len(fields) < 3:
            continue
        grade_id = fields[3] if len(fields) > 3 and fields[3] != "-" else None
        rows.append({"index": int(fields[0]), "kind": fields[1], "seconds": float(fields[2]), "grade_id": grade_id})
    return rows


def run_nbgrader(args: list[str], course_root: Path, *, timeout: float | None = None,
                 env: dict[str, str] | None = None,
                 on_progress: Callable[[str], None] | None = None) -> tuple[int | None, str]:
    """Run `nbgrader ARGS` in course_root. Returns (exit code or None on timeout, combined output).

    on_progress(text) is called, as they come, with each graded cell's progress line ("ex1_check: passed (3.2 s)",
    preprocessors.PROGRESS_MARK). The command is a fork of a process that imported nbgrader once
    (autograder/grading/nbgrader_fork.py; COURSE_NBGRADER_FORK=0, or where that cannot start: `python -m nbgrader`).
    It gets its own session so that on timeout it and its kernels are killed together.
    """
    env = env or nbgrader_env()
    if os.environ.get("COURSE_NBGRADER_FORK", "1") != "0" and hasattr(os, "fork"):
        from autograder.grading import nbgrader_fork

        kept: list[str] = []
        try:
            rc = nbgrader_fork.run(list(args), str(Path(course_root).resolve()), env, timeout,
                                   lambda line: _keep_line(line, kept, on_progress))
            return rc, "".join(kept)
        except nbgrader_fork.NotStarted:
            pass                          # nothing ran: as a subprocess, below
    cmd = [sys.executable, "-m", "nbgrader", *args]
    proc = subprocess.Popen(cmd, cwd=course_root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines, on_progress), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
        reader.join()
        return proc.returncode, "".join(lines)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.wait()
        reader.join(timeout=10)
        return None, "".join(lines)
    except BaseException:          # interrupted (Ctrl-C, a test timeout): leave no kernel behind
        kill_group(proc)
        proc.wait()
        raise


def _read_lines(stream, lines: list[str], on_progress: Callable[[str], None] | None) -> None:
    """Keep every line of `stream`; hand progress lines (after the mark) to on_progress."""
    for line in stream:
        _keep_line(line, lines, on_progress)
    stream.close()


def _keep_line(line: str, lines: list[str], on_progress: Callable[[str], None] | None) -> None:
    lines.append(line)
    if on_progress is not None and preprocessors.PROGRESS_MARK in line:
        on_progress(line.split(preprocessors.PROGRESS_MARK, 1)[1].strip())


def db_url_for(path: Path) -> str:
    return "sqlite:///" + str(Path(path).resolve())


# ----------------------------------------------------------------------------- course folders

def find_assignment(notebook: Path, course_root: Path = REPO_ROOT) -> str:
    """The assignment a notebook belongs to: the solutions/<a>/ folder holding a notebook of that name."""
    notebook = Path(notebook)
    src = Path(course_root) / "solutions"
    parent = notebook.resolve().parent.name
    if (src / parent / notebook.name).exists():
        return parent
    matches = sorted(p.parent.name for p in src.glob(f"*/{notebook.name}"))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise GradingError(f"no assignment in {src} has a notebook named {notebook.name!r}; "
                           "pass --assignment explicitly")
    raise GradingError(f"{notebook.name!r} is in several assignments {matches}; pass --assignment")


def assignments(course_root: Path = REPO_ROOT) -> list[str]:
    """Assignment ids: folders under solutions/ that hold at least one notebook."""
    src = Path(course_root) / "solutions"
    return sorted(p.name for p in src.iterdir() if p.is_dir() and any(p.glob("*.ipynb"))) if src.exists() else []


def make_temp_course(course_root: Path, assignment: str, dest: Path) -> Path:
    """A throwaway course folder: the course's nbgrader_config.py and one assignment's source folder."""
    course_root = Path(course_root)
    src = course_root / "solutions" / assignment
    if not src.is_dir():
        raise GradingError(f"no source folder {src}")
    dest.mkdir(parents=True, exist_ok=True)
    config = course_root / CONFIG_NAME
    if not config.exists():
        config = REPO_ROOT / CONFIG_NAME
    shutil.copy(config, dest / CONFIG_NAME)
    shutil.copytree(src, dest / "solutions" / assignment,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.pyc"))
    return dest


def generate_assignment(course_root: Path, assignment: str, *, db: Path | str, release_dir: Path | None = None,
                        env: dict[str, str] | None = None) -> Path:
    """`nbgrader generate_assignment` into release_dir (default: the course's labs/). Returns the release folder."""
    course_root = Path(course_root)
    args = ["generate_assignment", assignment, "--force", f"--db={db if isinstance(db, str) else db_url_for(db)}"]
    if release_dir is not None:
        args.append(f"--CourseDirectory.release_directory={Path(release_dir).resolve()}")
    rc, out = run_nbgrader(args, course_root, timeout=600, env=env)
    if rc != 0:
        raise GradingError(f"nbgrader generate_assignment {assignment} failed (exit {rc}):\n{out[-4000:]}")
    return (Path(release_dir) if release_dir is not None else course_root / "labs") / assignment


# ----------------------------------------------------------------------------- inspecting submissions

def _graded_ids(nb) -> dict[str, dict]:
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if "grade_id" in meta:
            out[meta["grade_id"]] = cell
    return out


def precheck(submission: Path, released: Path, source: Path | None = None) -> tuple[str, list[str]]:
    """Look at a submission before grading: ("ok"|"invalid-notebook", notes for the instructor).

    A locked cell counts as edited when it matches neither the released nor the source version
    (the source version carries hidden tests, so a solution notebook is not "edited").
    """
    from nbgrader.utils import compute_checksum

    try:
        text = Path(submission).read_text(encoding="utf-8")
        json.loads(text)
        nb = nbformat.reads(text, as_version=4)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return "invalid-notebook", [f"not a valid notebook file ({type(exc).__name__}: {exc})"]
    except Exception as exc:  # nbformat's own errors (missing keys, wrong version...)
        return "invalid-notebook", [f"not a valid notebook ({type(exc).__name__}: {exc})"]
    notes = []
    ref = nbformat.read(str(released), as_version=4)
    ref_cells, sub_cells = _graded_ids(ref), _graded_ids(nb)
    src_sums = {}
    if source is not None and Path(source).exists():
        for gid, cell in _graded_ids(nbformat.read(str(source), as_version=4)).items():
            try:
                src_sums[gid] = compute_checksum(cell)
            except Exception:
                pass
    missing = [gid for gid in ref_cells if gid not in sub_cells]
    if missing:
        notes.append("cells deleted (no points for them): " + ", ".join(missing))
    edited = []
    for gid, cell in sub_cells.items():
        ref_cell = ref_cells.get(gid)
        if ref_cell is None or not ref_cell.metadata.nbgrader.get("locked"):
            continue
        try:
            if compute_checksum(cell) not in (ref_cell.metadata.nbgrader.get("checksum"), src_sums.get(gid)):
                edited.append(gid)
        except Exception:
            edited.append(gid)
    if edited:
        notes.append("locked cells edited (restored from the source before grading): " + ", ".join(edited))
    return "ok", notes


def read_scores(db: Path | str, assignment: str, student: str) -> tuple[float, float, list[CellScore]]:
    """Total and per-cell scores of one submission from the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    url = db if isinstance(db, str) else db_url_for(db)
    with Gradebook(url) as gb:
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:
            a = gb.find_assignment(assignment)
            return 0.0, float(a.max_score), [CellScore(g.name, 0.0, float(g.max_score), "not graded")
                                            for nb in a.notebooks for g in nb.grade_cells]
        cells = [CellScore(g.name, float(g.score or 0.0), float(g.max_score))
                 for nb in sub.notebooks for g in nb.grades]
        return float(sub.score or 0.0), float(sub.max_score), cells


# ----------------------------------------------------------------------------- reading executed notebooks

_LIMIT_SIGNS = (("MemoryError", "memory limit"), ("No space left on device", "disk limit"),
                ("File too large", "disk limit"), ("Resource temporarily unavailable", "process limit"),
                ("Network is unreachable", "no network"), ("Connection refused", "no network"),
                ("Temporary failure in name resolution", "no network"), ("Name or service not known", "no network"),
                ("gaierror", "no network"))


@dataclass
class Reading:
    """What an executed notebook's outputs say: a status, notes for the instructor, each graded cell's error."""

    status: str = "ok"
    notes: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def read_executed(text: str) -> Reading:
    """Status and notes from an executed notebook's outputs."""
    r = Reading()
    nb = nbformat.reads(text, as_version=4)
    timed, truncated, removed, limits, not_run = [], [], [], [], 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        label = gid or f"cell {i + 1}"
        for out in cell.get("outputs", []):
            shown = f"{out.get('ename', '')} {out.get('evalue', '')} {out.get('text', '')}"
            for sign, what in _LIMIT_SIGNS:       # the sandbox's limits, as the cell ran into them
                if sign in shown and f"{what} ({label})" not in limits:
                    limits.append(f"{what} ({label})")
            if out.output_type == "error":
                evalue = out.get("evalue") or ""
                if out.ename == preprocessors.NOT_RUN_ENAME:
                    not_run += 1
                    msg = "not run"
                elif out.ename == preprocessors.STUCK_ENAME:
                    timed.append(label)
                    msg = "timed out"
                    if evalue == preprocessors.STUCK_NOTE:
                        r.status = "timeout"
                        r.notes.append(f"{label} {preprocessors.STUCK_NOTE}; later cells not run, "
                                       "points of the cells before it kept")
                elif out.ename == preprocessors.DEAD_ENAME:
                    r.status = "kernel-died" if r.status == "ok" else r.status
                    r.notes.append(f"the kernel died in {label} (os._exit, a crash or a resource limit); "
                                   "later cells not run")
                    msg = "kernel died"
                else:
                    msg = preprocessors.said_to_learner(out)[:200]      # as the notebook says it
                if gid:
                    r.errors.setdefault(gid, msg)
            if output_limits.is_limit_note(out) and label not in removed:
                removed.append(label)
            if out.output_type == "stream":
                if "... Output truncated ..." in out.get("text", "") and label not in truncated:
                    truncated.append(label)
                if out.name == "stderr" and gid:
                    r.errors.setdefault(gid, "wrote to stderr (nbgrader fails a test cell that does)")
    if timed:
        r.notes.append("timed out: " + ", ".join(dict.fromkeys(timed)))
    if truncated:
        r.notes.append("output truncated in: " + ", ".join(truncated))
    if removed:
        r.notes.append("outputs over the size limits removed in: " + ", ".join(removed))
    if limits:
        r.notes.append("ran into the sandbox: " + ", ".join(limits))
    return r


# ----------------------------------------------------------------------------- autograde

def autograde_one(course_root: Path, assignment: str, student: str, *, db: Path | str,
                  released: Path, timeout: float = SUBMISSION_TIMEOUT_S,
                  env: dict[str, str] | None = None) -> SubmissionResult:
    """Autograde submitted/<student>/<assignment>/ with nbgrader, in place, kernel NOT sandboxed (the course's
    own notebooks in tests/test_notebooks.py); never raises for a bad submission. Learners' submissions go
    through `autograde` (autograder.grading.batch): sandboxed, neutralised, recorded by the parent."""
    course_root = Path(course_root)
    sub_dir = course_root / "submitted" / student / assignment
    url = db if isinstance(db, str) else db_url_for(db)
    status, notes = "ok", []
    for nb_path in sorted(Path(released).glob("*.ipynb")):
        sub_nb = sub_dir / nb_path.name
        if not sub_nb.exists():
            notes.append(f"{nb_path.name} not submitted")
            continue
        s, n = precheck(sub_nb, nb_path, course_root / "solutions" / assignment / nb_path.name)
        notes += n
        if s != "ok":
            status = s
    rc, out = run_nbgrader(["autograde", assignment, f"--student={student}", "--force", f"--db={url}"],
                           course_root, timeout=timeout, env=forked_judges.zygote_env(env or nbgrader_env()))
    if rc is None:
        status = "timeout"
        notes.append(f"grading stopped after {timeout:g} s (kernel unresponsive?)")
    elif rc != 0 and status == "ok":
        if "DeadKernelError" in out or "Kernel died" in out:
            status = "kernel-died"
            notes.append("the kernel died while running the notebook (os._exit, segfault or out of memory)")
        else:
            status = "error"
            last = [l for l in out.splitlines() if l.strip() and "SAWarning" not in l]
            notes.append("nbgrader failed: " + (last[-1].strip()[:200] if last else f"exit {rc}"))
    from autograder.judging.witness_plans import plans_logged, stale_note

    logged = plans_logged(out or "")
    stale = stale_note(logged)
    if stale:
        notes.append(stale)
    total, max_total, cells = read_scores(url, assignment, student)
    if rc == 0:
        for nb_path in sorted(Path(released).glob("*.ipynb")):
            done = course_root / "autograded" / student / assignment / nb_path.name
            if not done.exists():
                continue
            rn = read_executed(done.read_text(encoding="utf-8"))
            notes += rn.notes
            if status == "ok":
                status = rn.status
            for c in cells:
                if c.grade_id in rn.errors and not c.note:
                    c.note = rn.errors[c.grade_id]
    for c in cells:
        if c.score < c.max_score and not c.note:
            c.note = "failed" if rc == 0 else "not graded"
    return SubmissionResult(student, assignment, total, max_total, status, notes, cells, witness_plans=logged,
                            cell_times=cell_times(out or ""))


def submissions(course_root: Path, assignment: str) -> list[str]:
    """Students with a folder submitted/<student>/<assignment>/."""
    base = Path(course_root) / "submitted"
    return sorted(p.parent.name for p in base.glob(f"*/{assignment}") if p.is_dir())


# ----------------------------------------------------------------------------- feedback and export

def generate_feedback(course_root: Path = REPO_ROOT, assignment: str | None = None, *,
                      db: Path | str | None = None, env: dict[str, str] | None = None) -> Path:
    """`nbgrader generate_feedback` (HTML per student under feedback/)."""
    course_root = Path(course_root).resolve()
    url = db_url_for(db or course_root / "gradebook.db") if not isinstance(db, str) else db
    for a in [assignment] if assignment else assignments(course_root):
        if not submissions(course_root, a):
            continue
        rc, out = run_nbgrader(["generate_feedback", a, "--force", f"--db={url}"], course_root, timeout=1800, env=env)
        if rc != 0:
            raise GradingError(f"nbgrader generate_feedback {a} failed (exit {rc}):\n{out[-4000:]}")
    return course_root / "feedback"


def export_grades(course_root: Path = REPO_ROOT, csv_path: Path | None = None, *,
                  db: Path | str | None = None, env: dict[str, str] | None = None) -> Path:
    """`nbgrader export` of the gradebook to CSV (default grades.csv in the course root)."""
    course_root = Path(course_root).resolve()
    url = db_url_for(db or course_root / "gradebook.db") if not isinstance(db, str) else db
    csv_path = Path(csv_path or course_root / "grades.csv").resolve()
    rc, out = run_nbgrader(["export", f"--db={url}", f"--CsvExportPlugin.to={csv_path}"], course_root,
                           timeout=600, env=env)
    if rc != 0 or not csv_path.exists():
        raise GradingError(f"nbgrader export failed (exit {rc}):\n{out[-4000:]}")
    return csv_path


def release(course_root: Path = REPO_ROOT, assignment_ids: list[str] | None = None, *,
            release_dir: Path | None = None, env: dict[str, str] | None = None) -> list[Path]:
    """Regenerate labs/ (or release_dir) from solutions/ with a temporary gradebook, then normalize."""
    course_root = Path(course_root).resolve()
    out = []
    with tempfile.TemporaryDirectory(prefix="release-db-") as tmp:
        db = Path(tmp) / "release.db"
        for a in assignment_ids or assignments(course_root):
            folder = generate_assignment(course_root, a, db=db, release_dir=release_dir, env=env)
            for nb in sorted(folder.glob("*.ipynb")):
                normalize_file(nb)
            out.append(folder)
    return out
