"""`python -m autograder similarity`: copied answers are found, own answers and the untouched stub are not; the
package's reference carried where no earlier report saw it (marshalled, renamed with statements without effect, pasted
into a cell the learner added) is reported with the cell, the function and how much."""

from __future__ import annotations

import csv
import inspect
import marshal
import os
import re
import shutil

import nbformat
import pytest

import similarity_lab03 as lab03_answers   # noqa: E402  (tests/instructor/ is on sys.path under pytest)
from autograder.grading import similarity
from autograder.cli import main
from minigpt.cache.block_pool import BlockPool
from minigpt.engine.scheduler import Scheduler

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
    assert all(max(m.similarity, m.other_similarity) >= 0.5 for m in matches)
    assert any(n.startswith("eve:") and "symbolic link" in n for n in notes), notes


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


# --- lab 03: the reference carried three ways, and an honest answer --------------------------------------------------

SCRIPT_IN_A_COMMENT = "# <script>alert('not markup')</script>\n"


def _submit(root, released, student: str, cells: dict[str, str], added_after: str | None = None,
            added: str = "") -> None:
    """A submission of the released notebook with these grade ids' cells replaced, and a code cell without nbgrader
    metadata inserted after `added_after` (as a learner adds one in JupyterLab)."""
    nb = nbformat.reads(nbformat.writes(released), as_version=4)
    for gid, src in cells.items():
        _set_cell(nb, gid, src)
    if added_after:
        at = next(i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                  == added_after)
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell(added))
    (root / "submitted" / student / lab03_answers.A).mkdir(parents=True)
    nbformat.write(nb, str(root / "submitted" / student / lab03_answers.A / lab03_answers.NB))


@pytest.fixture(scope="module")
def lab03_report(tmp_path_factory, repo_root):
    """Lab 03 compared for five students, with its CSV and HTML reports."""
    L = lab03_answers
    root = tmp_path_factory.mktemp("lab03")
    for part in ("labs", "solutions"):
        shutil.copytree(repo_root / part / L.A, root / part / L.A)
    released = nbformat.read(str(root / "labs" / L.A / L.NB), as_version=4)
    _submit(root, released, "marshal", {"ex2_code": L.marshalled_scheduler()})
    _submit(root, released, "renamer", {"ex2_code": L.renamed_scheduler()})
    _submit(root, released, "adder", {}, added_after="ex1_code", added=SCRIPT_IN_A_COMMENT + L.VERBATIM_PACK_CHUNKS)
    _submit(root, released, "honest", {"ex1_code": L.HONEST_PACK_CHUNKS, "ex2_code": L.HONEST_SCHEDULER})
    _submit(root, released, "filer", {"ex1_code": "from helper import pack_chunks\n"})
    (root / "submitted" / "filer" / L.A / "helper.py").write_text(L.VERBATIM_PACK_CHUNKS)
    (root / "submitted" / "filer" / L.A / "sched.bin").write_bytes(marshal.dumps(Scheduler.schedule.__code__))
    out = tmp_path_factory.mktemp("lab03-report")
    matches, notes = similarity.compare(root, L.A, threshold=0.5, html=out / "report.html")
    similarity.write_csv(matches, out / "report.csv")
    return matches, notes, out


def _rows(matches, student: str, other: str) -> list[similarity.Match]:
    return [m for m in matches if m.student == student and m.other == other]


def test_marshalled_reference_is_carried_code_naming_the_function(lab03_report):
    matches, _, _ = lab03_report
    [row] = _rows(matches, "marshal", similarity.CARRIED)
    assert (row.exercise, row.cell) == ("ex2_code", "ex2_code")
    for what in ("the bytecode of minigpt.engine.scheduler.Scheduler.schedule",
                 "the bytecode of minigpt.engine.scheduler.Scheduler._admit", "base64 -> zlib", "import marshal",
                 "types.FunctionType"):
        assert what in row.detail, row.detail
    assert row.similarity is None and row.evidence is not None and row.evidence.lines


def test_reference_renamed_with_a_no_op_after_every_statement_is_found(lab03_report):
    matches, _, _ = lab03_report
    [row] = _rows(matches, "renamer", similarity.REFERENCE)
    assert (row.exercise, row.cell) == ("ex2_code", "ex2_code")
    assert row.detail.startswith("minigpt.engine.scheduler.Scheduler") and "schedule" in row.detail, row
    assert row.similarity >= 0.6 and row.other_similarity >= 0.8, row


def test_reference_pasted_into_a_cell_the_learner_added_is_found(lab03_report):
    matches, _, _ = lab03_report
    [row] = _rows(matches, "adder", similarity.REFERENCE)
    assert row.exercise == "" and row.cell.endswith("(no grade id)"), row
    assert row.detail == "minigpt.engine.packed_batch.pack_chunks"
    assert row.similarity >= 0.9 and row.other_similarity >= 0.9, row


def test_files_handed_in_beside_the_notebook_are_carried_code_and_compared(lab03_report):
    matches, _, _ = lab03_report
    carried = {m.cell: m.detail for m in _rows(matches, "filer", similarity.CARRIED)}
    assert carried["file sched.bin"].startswith("a file beside the notebook: sched.bin"), carried
    assert "the bytecode of minigpt.engine.scheduler.Scheduler.schedule" in carried["file sched.bin"]
    assert "a file beside the notebook: helper.py" in carried["file helper.py"]
    [row] = _rows(matches, "filer", similarity.REFERENCE)
    assert (row.cell, row.detail) == ("file helper.py", "minigpt.engine.packed_batch.pack_chunks")


def test_an_answer_written_independently_is_not_reported(lab03_report):
    matches, _, _ = lab03_report
    assert not [m for m in matches if m.student == "honest" or m.other == "honest"], matches


def test_independent_answers_pass_the_lab_checks():
    """The honest answers are answers: Exercise 1's and 2's checks pass them (called in-process, as the lab's own
    checks tests call the solution's answers)."""
    from autograder import lab03

    namespace: dict = {}
    exec("import torch\n"
         "from minigpt.cache.block_table import blocks_needed\n"
         "from minigpt.engine.packed_batch import PackedBatch\n"
         "from minigpt.engine.request import SequenceStatus\n"
         "from minigpt.engine.scheduler import Scheduler, SchedulerOutput\n", namespace)
    for name, source in (("ex1", lab03_answers.HONEST_PACK_CHUNKS), ("ex2", lab03_answers.HONEST_SCHEDULER)):
        exec(compile(source, f"/notebook-cells/honest/{name}.py", "exec"), namespace)
    lab03.check_pack_chunks(namespace["pack_chunks"])
    lab03.check_scheduler(namespace["MyScheduler"])


def test_csv_and_html_say_which_cell_which_function_and_how_much(lab03_report):
    matches, _, out = lab03_report
    with open(out / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == similarity.COLUMNS
    adder = next(r for r in rows if r["student"] == "adder" and r["other"] == similarity.REFERENCE)
    assert adder["cell"].endswith("(no grade id)") and adder["detail"] == "minigpt.engine.packed_batch.pack_chunks"
    assert float(adder["similarity"]) >= 0.9 and int(adder["overlap_tokens"]) > 0
    carried = next(r for r in rows if r["other"] == similarity.CARRIED and r["student"] == "marshal")
    assert carried["similarity"] == "" and "Scheduler.schedule" in carried["detail"]
    page = (out / "report.html").read_text()
    for text in ("minigpt.engine.packed_batch.pack_chunks", "minigpt.engine.scheduler.Scheduler", "ex2_code",
                 "(no grade id)", "the bytecode of minigpt.engine.scheduler.Scheduler.schedule"):
        assert text in page, text
    assert "<script>" not in page and "&lt;script&gt;" in page        # a cell's text is never markup
