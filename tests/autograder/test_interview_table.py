"""README's interview-question table stays true: each named cell is a graded cell of that lab's solution,
and a lab that exists names the cells that grade its questions."""

from __future__ import annotations

import re

import nbformat

from autograder.grading import nbgrader_runs as grading


def _rows(readme: str) -> list[tuple[str, str, str, list[str]]]:
    """(number, question, lab, [grade_id, ...]) for each row of the interview table."""
    section = readme.split("## Interview questions", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|(.+?)\|\s*(\d\d)\s*\|(.*)\|\s*$", line)
        if m:
            rows.append((m[1], m[2].strip(), m[3], re.findall(r"`([^`]+)`", m[4])))
    return rows


def _graded_ids(repo_root, lab: str) -> set[str] | None:
    folders = [a for a in grading.assignments(repo_root) if a.startswith(lab + "_")]
    if not folders:
        return None
    ids = set()
    for path in (repo_root / "solutions" / folders[0]).glob("*.ipynb"):
        for cell in nbformat.read(str(path), as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                ids.add(meta["grade_id"])
    return ids


def test_the_table_numbers_its_questions_in_order(repo_root):
    rows = _rows((repo_root / "README.md").read_text())
    assert len(rows) >= 17 and [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)), (
        "README's interview table must list its questions numbered 1, 2, 3, ...")


def test_every_named_cell_is_graded_and_existing_labs_name_theirs(repo_root):
    for number, question, lab, cells in _rows((repo_root / "README.md").read_text()):
        graded = _graded_ids(repo_root, lab)
        if graded is None:
            assert not cells, f"question {number} names cells {cells} of lab {lab}, which does not exist yet"
            continue
        assert cells, f"lab {lab} exists: question {number} ({question}) must name the cells that grade it"
        missing = [c for c in cells if c not in graded]
        assert not missing, f"question {number}: {missing} are not graded cells of lab {lab}'s solution notebook"
