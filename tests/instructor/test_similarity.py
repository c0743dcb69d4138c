"""`python -m autograder similarity`: copied answers are found, own answers and the untouched stub are not."""

from __future__ import annotations

import inspect
import os
import re
import shutil

import nbformat
import pytest

from autograder.grading import similarity
from autograder.cli import main
from minigpt.cache.block_pool import BlockPool

A = "02_paged_kv_cache"
NB = f"{A}.ipynb"

# An answer to exercise 2 written independently of the reference (a different shape of code).
OWN_SLOT_OF = '''def slot_of(table: list[int], position: int, block_size: int) -> int:
    """Physical slot of a logical position."""
    if position < 0:
        raise IndexError("negative position")
    which, offset = divmod(position, block_size)
    try:
        physical = table[which]
    except IndexError:
        raise IndexError(f"position {position} is past the table ({len(table)} blocks)") from None
    return physical * block_size + offset
'''


def _set_cell(nb, grade_id: str, source: str) -> None:
    cell = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)
    cell.source = source


def _renamed(source: str) -> str:
    """The same code with its local names changed, as a student hiding a copy would."""
    for old, new in {"block": "blk", "table": "tbl", "position": "pos", "num": "count", "free": "avail"}.items():
        source = re.sub(rf"\b{old}\b", new, source)
    return source


@pytest.fixture(scope="module")
def course(tmp_path_factory, repo_root):
    root = tmp_path_factory.mktemp("course")
    for part in ("labs", "solutions"):
        shutil.copytree(repo_root / part / A, root / part / A)
    released = nbformat.read(str(root / "labs" / A / NB), as_version=4)

    def submit(student: str, cells: dict[str, str]) -> None:
        nb = nbformat.reads(nbformat.writes(released), as_version=4)
        for gid, src in cells.items():
            _set_cell(nb, gid, src)
        (root / "submitted" / student / A).mkdir(parents=True)
        nbformat.write(nb, str(root / "submitted" / student / A / NB))

    submit("alice", {"ex2_code": OWN_SLOT_OF})
    submit("bob", {"ex1_code": _renamed(inspect.getsource(BlockPool))})          # the reference, renamed
    submit("carol", {"ex2_code": _renamed(OWN_SLOT_OF)})                         # alice's answer, renamed
    submit("dave", {})                                                            # the stub as released
    (root / "submitted" / "eve" / A).mkdir(parents=True)
    os.symlink("/etc/hostname", root / "submitted" / "eve" / A / NB)             # not a notebook file
    return root


def test_copies_are_found_and_own_work_is_not(course):
    matches, notes = similarity.compare(course, A, threshold=0.5)
    found = {(m.student, m.exercise, m.other) for m in matches}
    assert ("bob", "ex1_code", similarity.REFERENCE) in found, matches
    assert {("carol", "ex2_code", "alice"), ("alice", "ex2_code", "carol")} & found, matches   # one line per pair
    assert not any(m.student == "dave" or m.other == "dave" for m in matches), "the untouched stub is boilerplate"
    assert not any(m.student == "alice" and m.other in (similarity.REFERENCE, similarity.SOLUTION) for m in matches)
    assert all(m.similarity >= 0.5 for m in matches)
    assert any("eve" in n and "not a plain file" in n for n in notes), notes


def test_command_prints_table_and_writes_csv_and_html(course, tmp_path, capsys):
    csv_path, html = tmp_path / "matches.csv", tmp_path / "report.html"
    assert main(["--course", str(course), "similarity", "--assignment", A, "--csv", str(csv_path),
                 "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "bob" in out and similarity.REFERENCE in out
    assert csv_path.read_text().splitlines()[0].startswith("exercise,student,other,similarity")
    assert html.stat().st_size > 0


def test_unknown_assignment_is_a_clear_error(course, capsys):
    assert main(["--course", str(course), "similarity", "--assignment", "nope"]) == 2
    assert "no released notebook under labs/nope/" in capsys.readouterr().err
