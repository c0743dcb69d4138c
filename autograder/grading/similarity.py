"""Which submissions share code: each exercise's answer against the same exercise of every other student, the
package's reference and the course's solution, with copydetect's winnowed fingerprints.

    python -m autograder similarity --assignment 02_paged_kv_cache [--threshold 0.5] [--html report.html]

The graded checks refuse the reference handed in as an object (autograder.checking.reference_guard), but copying its source
into a cell, or a classmate's answer, can only be found by comparing texts. Per exercise (the learner's cells of one
grade id), copydetect tokenizes the code (names become V/F/O, strings S), hashes every k-gram, keeps a winnowed
subset and reports the share of one file's fingerprints found in the other. The released stub is boilerplate: the
signature and docstring every student starts from do not count. A high score is a lead for the instructor to read,
not a verdict: short exercises admit few different answers.
"""

from __future__ import annotations

import ast
import csv
import importlib
import inspect
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.grading import nbgrader_runs as grading, intake

REFERENCE = "package reference"
SOLUTION = "course solution"
MIN_TOKENS = 25          # copydetect's noise threshold, in filtered characters: shorter matches are not counted


@dataclass(frozen=True)
class Match:
    """`student`'s answer to `exercise` shares `similarity` of its fingerprints with `other`'s."""
    exercise: str
    student: str
    other: str
    similarity: float
    other_similarity: float
    overlap_tokens: int


def _solution_cells(nb) -> dict[str, str]:
    """{grade_id: source} of the cells learners write (nbgrader solution cells, code only)."""
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and isinstance(meta, dict) and meta.get("solution") and meta.get("grade_id"):
            out[str(meta["grade_id"])] = cell.source
    return out


def _without_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines()
                     if not re.match(r"\s*#+\s*(BEGIN|END) SOLUTION", line))


def _reference_source(answer: str, lab: str) -> str:
    """Source of the package objects with the names this answer defines (functions and classes), as
    autograder/exercise_map.json maps them, or ''."""
    from autograder.checking.learner_errors import exercise_map

    references = exercise_map()["learner"]
    try:
        names = [n.name for n in ast.parse(answer).body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    except SyntaxError:
        return ""
    parts = []
    for name in names:
        where = references.get(f"{lab}:{name}", {}).get("reference")
        if where:
            module, _, attr = where.rpartition(".")
            try:
                parts.append(inspect.getsource(getattr(importlib.import_module(module), attr)))
            except (OSError, TypeError):
                pass
    return "\n\n".join(parts)


def _write(path: Path, text: str) -> None:
    if text.strip():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def _stage(course_root: Path, assignment: str, work: Path) -> tuple[list[str], list[str]]:
    """Lay out work/students/<student>/<grade_id>.py, work/others/<reference|solution>/<grade_id>.py and
    work/stubs/<grade_id>.py; returns (students, notes)."""
    notes: list[str] = []
    released = {p.name: nbformat.read(str(p), as_version=4)
                for p in (course_root / "labs" / assignment).glob("*.ipynb")}
    solutions = {p.name: nbformat.read(str(p), as_version=4)
                 for p in (course_root / "solutions" / assignment).glob("*.ipynb")}
    if not released:
        raise grading.GradingError(f"no released notebook under labs/{assignment}/ (an assignment name such as "
                                   "02_paged_kv_cache; `python -m autograder release` writes labs/)")
    stubs = {gid: src for nb in released.values() for gid, src in _solution_cells(nb).items()}
    for gid, src in stubs.items():
        _write(work / "stubs" / f"{gid}.py", src)
    for nb in solutions.values():
        for gid, src in _solution_cells(nb).items():
            if gid in stubs:
                _write(work / "others" / SOLUTION / f"{gid}.py", _without_markers(src))
                _write(work / "others" / REFERENCE / f"{gid}.py", _reference_source(src, assignment[:2]))
    students = grading.submissions(course_root, assignment)
    for student in students:
        for name in released:
            rel = f"submitted/{student}/{assignment}/{name}"
            data = intake._read_regular(course_root / rel, notes, rel)
            if data is None:
                continue
            try:
                nb = nbformat.reads(data.decode("utf-8", "replace"), as_version=4)
            except Exception as exc:  # not a notebook: nothing to compare
                notes.append(f"left out {rel} (not a notebook: {type(exc).__name__})")
                continue
            for gid, src in _solution_cells(nb).items():
                if gid in stubs:
                    _write(work / "students" / student / f"{gid}.py", src)
    return students, notes


def compare(course_root: Path, assignment: str, *, threshold: float = 0.5,
            html: Path | None = None) -> tuple[list[Match], list[str]]:
    """Every (student, exercise) answer whose share of fingerprints found in another student's answer to the same
    exercise, the package's reference or the course's solution is at least `threshold`, most similar first."""
    from copydetect import CopyDetector

    course_root = Path(course_root).resolve()
    with tempfile.TemporaryDirectory(prefix="similarity-") as tmp:
        work = Path(tmp)
        students, notes = _stage(course_root, assignment, work)
        if not (work / "students").is_dir():
            return [], notes + [f"no submission of {assignment} has an answer to compare"]
        ref_dirs = [str(work / "students")] + ([str(work / "others")] if (work / "others").is_dir() else [])
        detector = CopyDetector(test_dirs=[str(work / "students")], ref_dirs=ref_dirs,
                                boilerplate_dirs=[str(work / "stubs")], extensions=["py"], same_name_only=True,
                                ignore_leaf=True, display_t=threshold, noise_t=MIN_TOKENS, guarantee_t=MIN_TOKENS,
                                autoopen=False, silent=True, out_file=str(html or work / "report.html"))
        detector.run()
        matches = []
        for sim, other_sim, test_file, ref_file, *_, overlap in detector.get_copied_code_list():
            test, ref = Path(test_file), Path(ref_file)
            matches.append(Match(exercise=test.stem, student=test.parent.name, other=ref.parent.name,
                                 similarity=float(sim), other_similarity=float(other_sim),
                                 overlap_tokens=int(overlap)))
        if html is not None and matches:
            with warnings.catch_warnings():          # copydetect 0.5.0 reads its template with a deprecated call
                warnings.simplefilter("ignore", DeprecationWarning)
                detector.generate_html_report()
    matches.sort(key=lambda m: (-m.similarity, m.exercise, m.student, m.other))
    return matches, notes


def write_csv(matches: list[Match], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["exercise", "student", "other", "similarity", "other_similarity", "overlap_tokens"])
        for m in matches:
            writer.writerow([m.exercise, m.student, m.other, f"{m.similarity:.3f}", f"{m.other_similarity:.3f}",
                             m.overlap_tokens])


def format_table(matches: list[Match]) -> str:
    if not matches:
        return "no answer reaches the threshold"
    rows = [f"{'exercise':<14} {'student':<16} {'shares with':<20} {'share':>6} {'tokens':>7}"]
    rows += [f"{m.exercise:<14} {m.student:<16} {m.other:<20} {m.similarity:>6.0%} {m.overlap_tokens:>7}"
             for m in matches]
    return "\n".join(rows)
