"""LimitOutputSize bounds every output a graded notebook keeps, whatever its type (autograder/grading/output_limits.py):
text is cut, anything else too large becomes a note, a cell and a notebook have budgets, and the grade nbgrader
reads from the outputs never changes."""

from __future__ import annotations

import base64
import copy

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from nbgrader.utils import determine_grade

from autograder.grading.output_limits import MB, NOTE_PREFIX, TRUNCATED, LimitOutputSize, is_limit_note, stored_size

BIG = 3 * MB          # over the 2 MB per-output default
PLOT = 300_000        # a course plot is about this (base64 PNG)


def _b64(n_bytes: int) -> str:
    """A base64 string that stores n_bytes (like a PNG of 3/4 of that)."""
    return base64.b64encode(b"\x89PNG" + bytes(n_bytes * 3 // 4 - 4)).decode()


def _limited(*cells, **limits):
    """A notebook of these cells after LimitOutputSize (valid nbformat, checked)."""
    nb = new_notebook(cells=list(cells))
    nb, _ = LimitOutputSize(**limits).preprocess(nb, {})
    nbformat.validate(nb)
    return nb


def _display(mime: str, value, kind: str = "display_data"):
    extra = {"execution_count": 1} if kind == "execute_result" else {}
    return new_output(kind, data={mime: value}, **extra)


def _note(out) -> str:
    return out.text if out.output_type == "stream" else out.data["text/plain"]


# ----------------------------------------------------------------------------- one output of each kind

LARGE_VALUES = {
    "image/png": lambda: _b64(BIG),
    "image/jpeg": lambda: _b64(BIG),
    "image/gif": lambda: _b64(BIG),
    "application/pdf": lambda: _b64(BIG),
    "image/svg+xml": lambda: "<svg>" + "<g/>" * (BIG // 4) + "</svg>",
    "text/html": lambda: "<div>" * (BIG // 5),
    "text/markdown": lambda: "# x\n" * (BIG // 4),
    "text/latex": lambda: "$x$" * (BIG // 3),
    "application/javascript": lambda: "var a = 1;\n" * (BIG // 11),
    "application/json": lambda: {"values": list(range(BIG // 7))},
    "application/vnd.jupyter.widget-view+json": lambda: {"model_id": "x" * BIG, "version_major": 2,
                                                         "version_minor": 0},
    "application/x-custom": lambda: "z" * BIG,
}


@pytest.mark.parametrize("mime", list(LARGE_VALUES))
@pytest.mark.parametrize("kind", ["display_data", "execute_result"])
def test_a_large_value_of_any_type_becomes_a_note_saying_what_and_how_large(mime, kind):
    value = LARGE_VALUES[mime]()
    nb = _limited(new_code_cell("x", outputs=[_display(mime, value, kind)]))
    [out] = nb.cells[0].outputs
    assert out.output_type == kind and list(out.data) == ["text/plain"], f"expected only the note, got {list(out.data)}"
    note = out.data["text/plain"]
    assert note.startswith(NOTE_PREFIX) and mime in note and f"{stored_size(value):,} bytes" in note, note
    assert "2 MB per-output limit" in note, note
    assert stored_size(out) < 1000


def test_a_course_sized_plot_is_kept_as_it_is():
    out = _display("image/png", _b64(PLOT))
    out.data["text/plain"] = "<Figure size 1600x350 with 3 Axes>"
    out.metadata = {"image/png": {"width": 1600, "height": 350}}
    kept = copy.deepcopy(out)
    nb = _limited(new_code_cell("plot()", outputs=[out]))
    assert nb.cells[0].outputs == [kept]


def test_long_text_plain_is_cut_not_replaced():
    nb = _limited(new_code_cell("x", outputs=[_display("text/plain", "a" * 300_000, "execute_result")]))
    text = nb.cells[0].outputs[0].data["text/plain"]
    assert text == "a" * 100_000 + TRUNCATED


def test_large_output_metadata_is_removed_with_a_note():
    out = _display("image/png", _b64(PLOT))
    out.metadata = {"image/png": {"alt": "m" * BIG}}
    nb = _limited(new_code_cell("x", outputs=[out]))
    [out] = nb.cells[0].outputs
    assert out.metadata == {} and "output metadata of" in out.data["text/plain"]


@pytest.mark.parametrize("name", ["stdout", "stderr"])
def test_a_long_stream_is_cut_and_keeps_its_name(name):
    nb = _limited(new_code_cell("x", outputs=[new_output("stream", name=name, text="line\n" * 1_000_000)]))
    [out] = nb.cells[0].outputs
    assert out.name == name and out.text.endswith(TRUNCATED) and len(out.text) == 100_000 + len(TRUNCATED)


def test_an_error_is_cut_and_stays_an_error():
    error = new_output("error", ename="E" * 200_000, evalue="v" * BIG, traceback=["t" * 60_000] * 100)
    nb = _limited(new_code_cell("x", outputs=[error]))
    [out] = nb.cells[0].outputs
    assert out.output_type == "error"
    assert len(out.ename) <= 100_000 + len(TRUNCATED) and len(out.evalue) <= 100_000 + len(TRUNCATED)
    assert sum(map(len, out.traceback)) <= 100_000 + len(TRUNCATED) and out.traceback[-1].endswith(TRUNCATED)


# ----------------------------------------------------------------------------- budgets

def test_outputs_past_the_cell_budget_become_one_note():
    outputs = [_display("image/png", _b64(int(1.5 * MB))) for _ in range(4)]     # 6 MB in all, 1.5 MB each
    nb = _limited(new_code_cell("x", outputs=outputs))
    outs = nb.cells[0].outputs
    assert [is_limit_note(o) for o in outs] == [False, False, True], "two fit the 4 MB budget, then one note"
    assert outs[-1].name == "stdout" and "2 output(s)" in outs[-1].text and "4 MB per-cell limit" in outs[-1].text


def test_removed_stderr_leaves_its_note_on_stderr():
    outputs = [new_output("stream", name="stderr", text="e" * 90_000) for _ in range(3)]
    nb = _limited(new_code_cell("x", outputs=outputs), max_cell_bytes=200_000)
    outs = nb.cells[0].outputs
    assert [(o.name, is_limit_note(o)) for o in outs] == [("stderr", False), ("stderr", False), ("stderr", True)]


def test_outputs_past_the_notebook_budget_become_notes():
    cells = [new_code_cell("x", outputs=[_display("image/png", _b64(int(1.9 * MB)))]) for _ in range(8)]
    nb = _limited(*cells)
    noted = [is_limit_note(c.outputs[-1]) for c in nb.cells]
    assert noted == [False] * 5 + [True] * 3, noted
    assert "10 MB per-notebook limit" in nb.cells[-1].outputs[-1].text
    assert stored_size(nb) < 10 * MB + 10_000


def test_an_error_stays_past_every_budget_so_the_grade_is_unchanged():
    def grade_cell():
        cell = new_code_cell("check()", outputs=[_display("text/html", "<p>" * 1000),
                                                 new_output("error", ename="AssertionError", evalue="wrong",
                                                            traceback=["AssertionError: wrong"])])
        cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t", "points": 2,
                                     "schema_version": 3}
        return cell
    before = determine_grade(grade_cell())
    nb = _limited(grade_cell(), max_cell_bytes=1000, max_notebook_bytes=1000)
    outs = nb.cells[0].outputs
    assert [o.output_type for o in outs] == ["error", "stream"] and is_limit_note(outs[-1]), outs
    assert determine_grade(nb.cells[0]) == before == (0, 2.0)


def test_minus_one_turns_the_limits_off():
    value = _b64(BIG)
    nb = _limited(new_code_cell("x", outputs=[_display("image/png", value)]),
                  max_output_bytes=-1, max_cell_bytes=-1, max_notebook_bytes=-1)
    assert nb.cells[0].outputs[0].data["image/png"] == value


# ----------------------------------------------------------------------------- what else a submission controls

def test_a_large_markdown_attachment_becomes_a_note_under_its_name():
    cell = new_markdown_cell("![plot](attachment:plot.png) ![small](attachment:small.png)")
    cell.attachments = {"plot.png": {"image/png": _b64(BIG)}, "small.png": {"image/png": _b64(PLOT)}}
    nb = _limited(cell)
    attachments = nb.cells[0].attachments
    assert set(attachments) == {"plot.png", "small.png"}, "a name the markdown uses must stay"
    assert list(attachments["plot.png"]) == ["text/plain"]
    assert "attachment image/png of" in attachments["plot.png"]["text/plain"]
    assert attachments["small.png"]["image/png"] == _b64(PLOT)


def test_attachments_count_towards_the_notebook_budget():
    cells = []
    for i in range(8):
        cell = new_markdown_cell(f"![a](attachment:a{i}.png)")
        cell.attachments = {f"a{i}.png": {"image/png": _b64(int(1.9 * MB))}}
        cells.append(cell)
    nb = _limited(*cells)
    noted = [list(c.attachments.values())[0].get("text/plain", "") for c in nb.cells]
    assert [n.startswith(NOTE_PREFIX) for n in noted] == [False] * 5 + [True] * 3


def test_large_widget_state_in_the_notebook_metadata_is_removed_and_named():
    nb = new_notebook(cells=[new_code_cell("w")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {"m": {"model_name": "x", "state": {"value": "v" * BIG}}}, "version_major": 2, "version_minor": 0}}
    nb, _ = LimitOutputSize().preprocess(nb, {})
    nbformat.validate(nb)
    assert "widgets" not in nb.metadata and nb.metadata["kernelspec"]["name"] == "python3"
    assert "'widgets'" in nb.metadata["output_limits"] and "1 MB limit" in nb.metadata["output_limits"]


def test_small_metadata_is_left_alone():
    nb = new_notebook(cells=[])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2,
                                                                           "version_minor": 0}}
    kept = copy.deepcopy(nb.metadata)
    nb, _ = LimitOutputSize().preprocess(nb, {})
    assert nb.metadata == kept


# ----------------------------------------------------------------------------- through nbgrader

HUGE_OUTPUTS = '''from IPython.display import HTML, Image, display
import ipywidgets
display(Image(data=b"\\\\x89PNG\\\\r\\\\n\\\\x1a\\\\n" + bytes(100 * 2**20), format="png"))     # a 100 MB PNG
display(HTML("<b>" * 10_000_000))                                                  # 30 MB of HTML
print("y" * 30_000_000)                                                            # 30 MB on stdout
display(ipywidgets.Textarea(value="w" * 3_000_000))                                # 3 MB of widget state
'''
ANSWERS = {"ex1_code": HUGE_OUTPUTS + "def add(a, b):\n    return a + b",
           "ex2_code": "def mean(xs):\n    return sum(xs) / len(xs)",
           "q1_answer": "answer = 4"}


def _huge_submission(lab) -> str:
    """The released notebook answered right, displaying huge outputs, with a 10 MB markdown attachment."""
    nb = nbformat.read(str(lab), as_version=4)
    for cell in nb.cells:
        cell.source = ANSWERS.get(cell.metadata.get("nbgrader", {}).get("grade_id"), cell.source)
    picture = new_markdown_cell("![big](attachment:big.png)")
    picture.attachments = {"big.png": {"image/png": _b64(10 * MB)}}
    nb.cells.append(picture)
    return nbformat.writes(nb)


@pytest.mark.slow
def test_huge_outputs_leave_a_small_graded_notebook_and_feedback_and_the_grade(fixture_course):
    from autograder.grading import batch, nbgrader_runs as grading
    from autograder.judging import sandbox

    env = grading.nbgrader_env({"COURSE_CELL_TIMEOUT": "120"})
    grading.release(fixture_course, env=env)
    lab = fixture_course / "labs" / "ex_fixture" / "ex_fixture.ipynb"
    submitted = fixture_course / "submitted" / "huge" / "ex_fixture"
    submitted.mkdir(parents=True)
    (submitted / lab.name).write_text(_huge_submission(lab))
    lines: list[str] = []
    [result] = batch.autograde(fixture_course, timeout=600, env=env, log=lines.append, progress=False, jobs=1,
                                 unsafe=sandbox.probe() is not None)
    assert (result.score, result.status) == (4, "ok"), "\n".join(lines)
    assert any("outputs over the size limits removed in: ex1_code" in n for n in result.notes), result.notes

    graded = fixture_course / "autograded" / "huge" / "ex_fixture" / lab.name
    text = graded.read_text()
    assert len(text) < 3 * MB, f"the graded notebook is {len(text):,} bytes"
    for note in ("image/png of", "text/html of", TRUNCATED.strip(), "attachment image/png of",
                 "notebook metadata 'widgets'"):
        assert note in text, f"{note!r} is not in the graded notebook"

    feedback = grading.generate_feedback(fixture_course, env=env) / "huge" / "ex_fixture" / "ex_fixture.html"
    html = feedback.read_text()
    assert len(html) < 3 * MB, f"the feedback page is {len(html):,} bytes"
    assert "image/png of" in html and "text/html of" in html and TRUNCATED.strip() in html
