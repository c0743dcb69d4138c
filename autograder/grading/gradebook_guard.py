"""The instructor's gradebook during a batch: backed up, written by the grading process only, checked.

* `backup(db)` copies gradebook.db (sqlite's online backup) to gradebook.db.backup-<UTC time> before a batch.
* `Guard(db)` keeps a private copy of the gradebook as it was after the grader's own last write. Before
  recording a submission it checks that the file is still exactly that (anything else changing it: a
  learner's process, in `--unsafe` mode, rewriting scores, deleting rows or the file) and, if not,
  puts the copy back; after recording, it checks that only the graded student's rows changed and that the
  student has no manual score that was not there before.
"""

from __future__ import annotations

import datetime
import shutil
import sqlite3
import tempfile
from pathlib import Path

# rows of these tables belong to one student (nbgrader 0.9 schema), found by these joins
_STUDENT_ROWS = {
    "student": "SELECT * FROM student WHERE id = :s",
    "submitted_assignment": "SELECT * FROM submitted_assignment WHERE student_id = :s",
    "submitted_notebook": "SELECT n.* FROM submitted_notebook n JOIN submitted_assignment a "
                          "ON n.assignment_id = a.id WHERE a.student_id = :s",
    "grade": "SELECT g.* FROM grade g JOIN submitted_notebook n ON g.notebook_id = n.id "
             "JOIN submitted_assignment a ON n.assignment_id = a.id WHERE a.student_id = :s",
    "comment": "SELECT c.* FROM comment c JOIN submitted_notebook n ON c.notebook_id = n.id "
               "JOIN submitted_assignment a ON n.assignment_id = a.id WHERE a.student_id = :s",
}
_MANUAL = ("SELECT g.cell_id, g.manual_score, g.extra_credit FROM grade g JOIN submitted_notebook n "
           "ON g.notebook_id = n.id JOIN submitted_assignment a ON n.assignment_id = a.id "
           "WHERE a.student_id = :s AND (g.manual_score IS NOT NULL OR g.extra_credit IS NOT NULL)")


def _connect(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def backup(db: Path, dest: Path | None = None) -> Path | None:
    """Copy the gradebook with sqlite's backup API; None if there is no gradebook yet."""
    db = Path(db)
    if not db.exists():
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = Path(dest or db.with_name(f"{db.name}.backup-{stamp}"))
    with _connect(db) as src, sqlite3.connect(dest) as out:
        src.backup(out)
    return dest


def dump(db: Path) -> dict[str, list[tuple]] | None:
    """Every row of every table, sorted; None if the file is missing or not a database."""
    if not Path(db).exists():
        return None
    try:
        with _connect(db) as con:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            return {t: sorted(con.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    except sqlite3.DatabaseError:
        return None


def student_rows(db: Path, student: str) -> dict[str, list[tuple]]:
    with _connect(db) as con:
        return {t: sorted(con.execute(q, {"s": student}).fetchall(), key=repr) for t, q in _STUDENT_ROWS.items()}


def manual_scores(db: Path, student: str) -> list[tuple]:
    if not Path(db).exists():
        return []
    with _connect(db) as con:
        return sorted(con.execute(_MANUAL, {"s": student}).fetchall(), key=repr)


def _without(full: dict[str, list[tuple]], part: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    return {t: [r for r in rows if r not in set(part.get(t, []))] for t, rows in full.items()}


class Guard:
    """Known-good copy of the gradebook, refreshed after each of the grader's own writes."""

    def __init__(self, db: Path):
        self.db = Path(db)
        self._dir = tempfile.TemporaryDirectory(prefix="gradebook-guard-")
        self._copy = Path(self._dir.name) / "known-good.db"
        self.accept()

    def accept(self) -> None:
        """The gradebook as it is now is the grader's own state."""
        self._copy.unlink(missing_ok=True)
        backup(self.db, self._copy)
        self._state = dump(self.db)

    def intact(self) -> bool:
        return dump(self.db) == self._state

    def restore(self) -> None:
        """Put the known-good copy back (the file may have been deleted or rewritten)."""
        for extra in (self.db.with_name(self.db.name + "-journal"), self.db.with_name(self.db.name + "-wal")):
            extra.unlink(missing_ok=True)
        tmp = self.db.with_name(self.db.name + ".restoring")
        shutil.copyfile(self._copy, tmp)
        tmp.replace(self.db)

    def check_record(self, student: str, before_manual: list[tuple]) -> list[str]:
        """After recording `student`: what changed that should not have (empty if nothing)."""
        now = dump(self.db)
        if now is None:
            return ["the gradebook is gone"]
        problems = []
        before_others = _without(self._state or {}, student_rows(self._copy, student)) if self._state else {}
        now_others = _without(now, student_rows(self.db, student))
        if self._state and before_others != {t: now_others.get(t, []) for t in before_others}:
            problems.append("rows of other students or of the assignment changed")
        if manual_scores(self.db, student) != before_manual:
            problems.append("a manual score appeared or changed for this student")
        return problems

    def close(self) -> None:
        self._dir.cleanup()
