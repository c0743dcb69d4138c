"""What failed a graded cell run after a mutant: a check's verdict, the mutant's own code, or neither.

    classify(err, mutant_files) -> "check" | "crash" | "broken"

* "check":  an AssertionError raised by the course's checks (a frame of autograder/ on the way, the error not raised
            in the mutant's own lines): the check told the mutant from the solution and said so, naming the exercise.
* "crash":  the mutant's own code raised (its cell, or a frame of it on the stack: a TypeError inside torch called
            from the mutant counts). A real catch, reported apart: a learner would see their own error, not a verdict.
* "broken": anything else: the check or the harness failed on its own (a TypeError inside the check, a NameError
            in a check cell). Not a kill: a check that breaks on a wrong answer tells the learner nothing.

A mutant that outruns its time limit is a "hang" (run.py decides that; nbgrader's cell timeout scores it 0).
"""

from __future__ import annotations

import traceback
from pathlib import Path

from autograder.paths import AUTOGRADER_DIR

__all__ = ["CHECK", "CRASH", "HANG", "BROKEN", "classify"]

CHECK, CRASH, HANG, BROKEN = "check", "crash", "hang", "broken"


def _in_autograder(filename: str) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(AUTOGRADER_DIR)
    except (OSError, ValueError):
        return False


def classify(err: BaseException, mutant_files: set[str]) -> str:
    """CHECK, CRASH or BROKEN for an exception raised by a graded cell (see the module docstring); `mutant_files`
    are the file names the mutant's cell was compiled under (IPython's `<ipython-input-...>`)."""
    frames = traceback.extract_tb(err.__traceback__)
    raised_in = frames[-1].filename if frames else ""
    if raised_in in mutant_files:
        return CRASH
    if isinstance(err, AssertionError) and any(_in_autograder(f.filename) for f in frames):
        return CHECK
    if any(f.filename in mutant_files for f in frames):
        return CRASH
    return BROKEN
