"""Which submissions hold code their authors did not write: every code cell of every submission, compared with the
package's reference function by function, with the course's solution and with every classmate's cells, and the
ways code is carried in without being written.

    python -m autograder similarity --assignment 03_continuous_batching [--threshold 0.5] [--csv F] [--html F]

The graded checks refuse the reference handed in as an object (autograder.checking.reference_guard), and the witness
takes the guarded reference out of the package; code pasted into a cell, or brought in as data, is the learner's
code to both. So the report reads every code cell of a submission, with or without nbgrader metadata (a cell the
learner added counts), and the files handed in beside the notebook, as graded (autograder.grading.intake stages
them). Each cell is reduced to its normal form (autograder.grading.normal_form: no formatting, comments,
docstrings, annotations or statements without effect; the names it binds alike, strings alike), plus the Python
source its strings carry, and fingerprinted (autograder.grading.fingerprints). A cell is reported against

* a function, class or method of the package (autograder.grading.package_index), a cell of the course's solution,
  or a classmate's cell, when they share at least MIN_SHARED_TOKENS normalised tokens (MIN_REFERENCE_TOKENS with
  the package) and `threshold` of the cell's fingerprints (or twice the tokens and `threshold` of the other's); the
  released notebook is boilerplate (its fingerprints never count), and so are the package's idioms (fingerprints
  in IDIOM_UNITS of its functions and classes);
* "carried code" when it brings code in without writing it (autograder.grading.carried: code objects, marshal,
  exec/eval/compile, pickle, encoded or compressed blobs, importlib, IPython's %run...); a blob holding the bytecode
  of one of the package's functions names it. A file beside the notebook is carried code too.

A high share is a lead for the instructor to read, not a verdict: short exercises admit few different answers, and
the course's own solutions share much with the package they were written with.
"""

from __future__ import annotations

import csv
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import nbformat

from autograder.grading import carried, intake, nbgrader_runs as grading, normal_form, package_index
from autograder.grading.fingerprints import Fingerprints, fingerprints
from autograder.grading.normal_form import Token

REFERENCE = "package reference"
SOLUTION = "course solution"
CARRIED = "carried code"
MIN_SHARED_TOKENS = 25      # normalised tokens (three to five lines): less shared code is never reported
MIN_REFERENCE_TOKENS = 40   # with the package: among its ~1,800 functions, a 25-token idiom is found by chance
IDIOM_UNITS = 4             # a fingerprint in this many of the package's functions and classes is an idiom, not a copy
MAX_CODE_FILE = 1 << 20     # bytes: a file beside the notebook this large or smaller is also read as code
_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


@dataclass(frozen=True)
class Evidence:
    """What the HTML report shows of a match: both sources, and the lines of each that are shared or carry code."""
    source: str
    lines: frozenset[int]
    other_source: str = ""
    other_lines: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Match:
    """`student`'s `cell` (an answer to `exercise`, or '' for a cell without a grade id) shares `similarity` of its
    fingerprints with `other` (a classmate, REFERENCE, SOLUTION), which has `other_similarity` of its own in the cell;
    `detail` names what of the other's (a package function, a cell). For CARRIED, `detail` says what carries code
    and both shares are None."""
    exercise: str
    student: str
    other: str
    similarity: float | None
    other_similarity: float | None
    overlap_tokens: int
    cell: str = ""
    detail: str = ""
    evidence: Evidence | None = field(default=None, compare=False, repr=False)

    @property
    def strength(self) -> float:
        return 2.0 if self.similarity is None else max(self.similarity, self.other_similarity or 0.0)


@dataclass(frozen=True)
class Cell:
    """A piece of code compared: a learner's cell or file, a solution cell, or a function of the package."""
    owner: str                  # the student, SOLUTION or REFERENCE
    label: str                  # grade id, "cell 7 (no grade id)", "file helper.py", or the package function's name
    exercise: str
    source: str
    fingerprints: Fingerprints
    family: str | None = None   # a method's class


def _fingerprinted(source: str, boilerplate: set[int]) -> Fingerprints:
    """The cell's fingerprints, with the Python source its strings carry read as if written where they are."""
    tokens = normal_form.tokens(source)
    for text, line in carried.hidden_sources(source):
        tokens += [Token(t.text, line) for t in normal_form.tokens(text)]
    return fingerprints(tokens).without(boilerplate)


def _code_cells(nb) -> list[tuple[str, str, str]]:
    """(label, grade id or '', source) of the notebook's code cells that hold code."""
    out = []
    for n, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = str(meta.get("grade_id") or "") if isinstance(meta, dict) else ""
        out.append((gid or f"cell {n} (no grade id)", gid, cell.source))
    return out


def _without_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if line.strip() not in _MARKERS)


@dataclass
class _Classroom:
    """What the comparison reads: the release, the solution, the package and every submission's cells."""
    released: dict[str, object]
    boilerplate: set[int]
    released_sources: set[str]
    released_findings: set[str]
    solution: list[Cell]
    students: list[str]
    cells: list[Cell] = field(default_factory=list)
    findings: dict[tuple[str, str], tuple[Cell, list[carried.Carried]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _read_release(course_root: Path, assignment: str) -> _Classroom:
    released = {p.name: nbformat.read(str(p), as_version=4)
                for p in (course_root / "labs" / assignment).glob("*.ipynb")}
    if not released:
        raise grading.GradingError(f"no released notebook under labs/{assignment}/ (an assignment name such as "
                                   "02_paged_kv_cache; `python -m autograder release` writes labs/)")
    sources = [src for nb in released.values() for _, _, src in _code_cells(nb)]
    boilerplate = set().union(*(fingerprints(normal_form.tokens(src)).hashes for src in sources))
    solution = []
    for path in sorted((course_root / "solutions" / assignment).glob("*.ipynb")):
        for cell in nbformat.read(str(path), as_version=4).cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.cell_type == "code" and meta.get("solution") and meta.get("grade_id"):
                source = _without_markers(cell.source)
                solution.append(Cell(SOLUTION, str(meta["grade_id"]), str(meta["grade_id"]), source,
                                     _fingerprinted(source, boilerplate)))
    findings = {c.what for src in sources for c in carried.findings(src)}
    return _Classroom(released, boilerplate, {s.strip() for s in sources}, findings, solution,
                  grading.submissions(course_root, assignment))


def _notebook_pieces(data: bytes, rel: str, group: _Classroom) -> list[tuple[str, str, str]]:
    """(label, grade id, source) of the notebook's code cells that differ from every released cell."""
    nb = nbformat.reads(data.decode("utf-8", "replace"), as_version=4)
    return [(f"{label} in {rel}" if len(group.released) > 1 else label, gid, src)
            for label, gid, src in _code_cells(nb) if src.strip() not in group.released_sources]


def _file_pieces(student: str, data: bytes, rel: str, group: _Classroom) -> list[tuple[str, str, str]]:
    """A file beside the notebook: carried code, and, if it is Python, a piece of code to compare."""
    label = f"file {rel}"
    text = data[:MAX_CODE_FILE].decode("utf-8", "replace")
    group.findings[(student, label)] = (Cell(student, label, "", text, Fingerprints()),
                                        [carried.file_finding(rel, data)])
    return [(label, "", text)] if len(data) <= MAX_CODE_FILE and normal_form.parse(text) is not None else []


def _read_submission(course_root: Path, assignment: str, student: str, group: _Classroom, work: Path) -> None:
    """The student's cells and files into group, staged as grading stages them (no links, bounded, neutralised)."""
    staged = work / student
    notes = intake.stage_submission(course_root / "submitted" / student / assignment, staged, group.released)
    group.notes += [f"{student}: {n}" for n in notes if n.startswith(("left out", "could not read"))]
    for path in sorted(p for p in staged.rglob("*") if p.is_file()):
        rel = path.relative_to(staged).as_posix()
        if rel == "timestamp.txt":
            continue
        if rel not in group.released:
            pieces = _file_pieces(student, path.read_bytes(), rel, group)
        else:
            try:
                pieces = _notebook_pieces(path.read_bytes(), rel, group)
            except Exception as exc:  # not a notebook: nothing to compare
                group.notes.append(f"{student}: left out {rel} (not a notebook: {type(exc).__name__})")
                continue
        for label, gid, source in pieces:
            cell = Cell(student, label, gid, source, _fingerprinted(source, group.boilerplate))
            group.cells.append(cell)
            found = [c for c in carried.findings(source) if c.what not in group.released_findings]
            if found:
                group.findings.setdefault((student, label), (cell, []))[1].extend(found)


def _reference_cells(boilerplate: set[int]) -> list[Cell]:
    """The package's units as cells, the release's fingerprints and the package's idioms left out."""
    units = package_index.units()
    spread: dict[int, int] = defaultdict(int)
    for unit in units:
        if unit.owner is None:
            for h in unit.fingerprints.runs:
                spread[h] += 1
    idioms = {h for h, n in spread.items() if n >= IDIOM_UNITS}
    return [Cell(REFERENCE, u.name, "", u.source, u.fingerprints.without(boilerplate | idioms), u.owner)
            for u in units]


class _Index:
    """Which of `cells` hold each fingerprint."""

    def __init__(self, cells: list[Cell]) -> None:
        self.cells = cells
        self.postings: dict[int, list[int]] = defaultdict(list)
        for i, cell in enumerate(cells):
            for h in cell.fingerprints.runs:
                self.postings[h].append(i)

    def shared(self, cell: Cell) -> dict[int, set[int]]:
        """{index of a cell sharing fingerprints with `cell`: the hashes shared}."""
        out: dict[int, set[int]] = defaultdict(set)
        for h in cell.fingerprints.runs:
            for i in self.postings.get(h, ()):
                out[i].add(h)
        return out


def _match(cell: Cell, other: Cell, shared: set[int], threshold: float,
           min_tokens: int = MIN_SHARED_TOKENS) -> Match | None:
    """The match of cell with other, if they share enough: min_tokens and `threshold` of the cell's fingerprints,
    or twice as many tokens and `threshold` of the other's (a short function of the package is what anyone
    writes; a long one found whole in a larger cell is not)."""
    tokens = cell.fingerprints.tokens_of(shared)
    if tokens < min_tokens or not cell.fingerprints or not other.fingerprints:
        return None
    mine, theirs = len(shared) / len(cell.fingerprints), len(shared) / len(other.fingerprints)
    if mine < threshold and (theirs < threshold or tokens < 2 * min_tokens):
        return None
    evidence = Evidence(cell.source, frozenset(cell.fingerprints.lines_of(shared)), other.source,
                        frozenset(other.fingerprints.lines_of(shared)))
    return Match(cell.exercise, cell.owner, other.owner, mine, theirs, tokens, cell.label, other.label, evidence)


def _most_specific(rows: list[tuple[Cell, Match]]) -> list[Match]:
    """Per cell and class of the package: the one method that matches, or else the class (its methods together,
    those that match named)."""
    out, families = [], defaultdict(list)
    for unit, row in rows:
        families[(row.student, row.cell, unit.family or unit.label)].append((unit, row))
    for members in families.values():
        whole = [row for unit, row in members if unit.family is None]
        methods = [row for unit, row in members if unit.family is not None]
        if whole and len(methods) != 1:
            names = ", ".join(row.detail.rsplit(".", 1)[1] for row in methods)
            out += [replace(row, detail=f"{row.detail} ({names})") if names else row for row in whole]
        else:
            out += methods
    return out


def _against_reference(group: _Classroom, threshold: float) -> list[Match]:
    index = _Index(_reference_cells(group.boilerplate))
    rows = []
    for cell in group.cells:
        for i, shared in index.shared(cell).items():
            match = _match(cell, index.cells[i], shared, threshold, MIN_REFERENCE_TOKENS)
            if match is not None:
                rows.append((index.cells[i], match))
    return _most_specific(rows)


def _against_solution(group: _Classroom, threshold: float) -> list[Match]:
    index = _Index(group.solution)
    return [m for cell in group.cells for i, shared in index.shared(cell).items()
            if (m := _match(cell, index.cells[i], shared, threshold)) is not None]


def _between_classmates(group: _Classroom, threshold: float) -> list[Match]:
    """One line per pair of cells of two students, from the side of the one whose cell is more the other's."""
    index = _Index(group.cells)
    out = []
    for i, cell in enumerate(group.cells):
        for j, shared in index.shared(cell).items():
            other = group.cells[j]
            if j <= i or other.owner == cell.owner:
                continue
            both = [m for m in (_match(cell, other, shared, threshold), _match(other, cell, shared, threshold)) if m]
            if both:
                out.append(max(both, key=lambda m: m.similarity))
    return out


def _carried(group: _Classroom) -> list[Match]:
    out = []
    for (student, label), (cell, found) in group.findings.items():
        evidence = Evidence(cell.source, frozenset(c.line for c in found))
        out.append(Match(cell.exercise, student, CARRIED, None, None, 0, label,
                         "; ".join(dict.fromkeys(c.what for c in found)), evidence))
    return out


def compare(course_root: Path, assignment: str, *, threshold: float = 0.5,
            html: Path | None = None) -> tuple[list[Match], list[str]]:
    """Every carried-code finding, then every cell whose share of fingerprints found in a function of the package,
    a cell of the course's solution or a classmate's cell (or the other's share found in it) is at least
    `threshold`, most similar first; and notes on what could not be read."""
    course_root = Path(course_root).resolve()
    group = _read_release(course_root, assignment)
    with tempfile.TemporaryDirectory(prefix="similarity-") as tmp:
        for student in group.students:
            _read_submission(course_root, assignment, student, group, Path(tmp))
    if not group.cells and not group.findings:
        return [], group.notes + [f"no submission of {assignment} has an answer to compare"]
    matches = (_carried(group) + _against_reference(group, threshold) + _against_solution(group, threshold)
               + _between_classmates(group, threshold))
    matches.sort(key=lambda m: (-m.strength, m.student, m.cell, m.other, m.detail))
    if html is not None:
        from autograder.grading import similarity_html

        similarity_html.write(Path(html), matches, group.notes, assignment=assignment, threshold=threshold)
    return matches, group.notes


COLUMNS = ["exercise", "student", "other", "similarity", "other_similarity", "overlap_tokens", "cell", "detail"]


def write_csv(matches: list[Match], path: Path) -> None:
    """One row per match: the columns of COLUMNS (shares blank for carried code)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for m in matches:
            shares = ["" if s is None else f"{s:.3f}" for s in (m.similarity, m.other_similarity)]
            writer.writerow([m.exercise, m.student, m.other, *shares, m.overlap_tokens, m.cell, m.detail])


def format_table(matches: list[Match]) -> str:
    if not matches:
        return "no answer reaches the threshold, and no cell carries code"
    rows = [("student", "cell", "shares with", "what", "share", "of other", "tokens")]
    for m in matches:
        shares = ("", "") if m.similarity is None else (f"{m.similarity:.0%}", f"{m.other_similarity:.0%}")
        rows.append((m.student, m.cell, m.other, m.detail, *shares, str(m.overlap_tokens or "")))
    widths = [min(max(len(r[i]) for r in rows), 60) for i in range(len(rows[0]))]
    return "\n".join(" ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)
