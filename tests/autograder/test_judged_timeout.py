"""A judged test cell that runs past its time limit is a timeout: it earns nothing, and the cells around it are
graded as usual (StoppingExecute._judged_cell).

When the limit strikes, nbclient interrupts the kernel, whose serving cell then closes its end of the judge's
connection. The judge sees that as a broken connection (BrokenPipeError when it sends its next request,
KernelStopped when it was waiting for a reply); the cell must say that it ran out of time, not that.
"""

from __future__ import annotations

import nbformat
import pytest

from autograder.grading.preprocessors import STUCK_ENAME, StoppingExecute

LIMIT_S = 3
FAST = "def add(a, b):\n    return a + b"
SLEEPY = "import time\n\ndef add(a, b):\n    time.sleep(60)\n    return a + b"
CHECK = "assert add(2, 3) == 5"
# The judge itself is slow: its second request comes 1.5 limits after the first, once the kernel has given up
SLOW_CHECK = f"import time\nassert add(2, 3) == 5\ntime.sleep({1.5 * LIMIT_S})\nassert add(2, 3) == 5"


def _test_cell(source: str, grade_id: str):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": grade_id, "points": 1,
                                 "schema_version": 3}
    return cell


def _graded(tmp_path, monkeypatch, learner: str, check: str) -> dict[str, list[tuple[str, str]]]:
    """Run [learner code, check t1, passing check t2] judged under a LIMIT_S cell limit; errors per test cell."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(learner), _test_cell(check, "t1"),
                nbformat.v4.new_code_cell("def one():\n    return 1"), _test_cell("assert one() == 1", "t2")]
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("COURSE_JUDGE", "1")
    StoppingExecute(timeout=LIMIT_S).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    return {c.metadata["nbgrader"]["grade_id"]: [(o.ename, o.evalue) for o in c.outputs if o.output_type == "error"]
            for c in nb.cells if "nbgrader" in c.metadata}


def _assert_timed_out(errors: list[tuple[str, str]]) -> None:
    assert len(errors) == 1, f"expected one timeout error, got {errors}"
    ename, evalue = errors[0]
    assert ename == STUCK_ENAME, f"expected {STUCK_ENAME}, got {ename}: {evalue}"
    assert f"time limit of {LIMIT_S} s" in evalue and "no points" in evalue, evalue


@pytest.mark.slow
def test_learner_code_sleeping_past_the_limit_is_a_timeout(tmp_path, monkeypatch):
    errors = _graded(tmp_path, monkeypatch, SLEEPY, CHECK)
    _assert_timed_out(errors["t1"])
    assert errors["t2"] == [], "the check after the timed-out one should still pass"


@pytest.mark.slow
def test_a_judge_still_checking_at_the_limit_is_a_timeout_not_a_broken_pipe(tmp_path, monkeypatch):
    """The kernel waits for the judge's next request when the limit strikes; the judge's next send then finds
    the connection closed (BrokenPipeError, as reported under load; JudgeTimeout when the judge is slower still)."""
    errors = _graded(tmp_path, monkeypatch, FAST, SLOW_CHECK)
    _assert_timed_out(errors["t1"])
    assert errors["t2"] == [], "the check after the timed-out one should still pass"


@pytest.mark.slow
def test_a_judge_that_died_is_replaced_for_the_next_check(tmp_path, monkeypatch):
    """Sending the next cell to a dead judge raised BrokenPipeError in nbgrader itself: the whole notebook failed."""
    errors = _graded(tmp_path, monkeypatch, FAST, "import os\nos._exit(1)")     # the judge's process ends
    assert [ename for ename, _ in errors["t1"]] == ["JudgeFailed"], errors["t1"]
    assert errors["t2"] == [], "the check after it should pass, in a fresh judge"
