"""Witness plans: what each test cell of the course's labs guards, refuses and asks for, so that its witness can start
before the cell has run anywhere.

A test cell whose checks refuse the reference is graded in a witness (autograder/judging/witness.py) whose package
lacks what the checks guarded. Without a plan the judge learns that list by running the cell against the learner's
kernel first, and then runs it again in the witness: every check of a passing cell runs twice. With a plan (the
lists the cell's checks produced when the solution was graded: autograder/witness_plans.json) the judge starts the
witness from it at once (judge.witness_first), and the kernel only waits for the values the cell assigns.

What stays guaranteed: the verdict of a passing cell is still a witness's, and it stands only if that witness lacked
everything its own run's checks guarded and refused and had the memory they asked for (judge.covered); otherwise the
plan is stale and the cell is graded as without one, kernel first. A stale plan costs time, never a wrong verdict,
and shows as a note in the grading report; `python -m autograder witness-plans` writes the file again.

    plan_for(source) -> {"guarded", "refused", "memory_allowance"} or None     (COURSE_WITNESS_PLANS=0: always None)
    cell_key(source) -> the file's key of a test cell: the SHA-256 of its source, first 16 hex digits
    plans_logged(out) -> the PLAN_MARK lines of an nbgrader run's output: {"grade_id", "cell", "used", "stale",
                         "lists"} each (lists: what the run's checks guarded, refused, asked for)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from functools import lru_cache

from autograder.paths import WITNESS_PLANS

__all__ = ["cell_key", "plan_for", "plans_logged", "stale_note", "PLAN_MARK"]

PLAN_MARK = "course-witness-plan:"      # nbgrader's log line of a witnessed test cell: its plan, used or learnt


def cell_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def _plans() -> dict[str, dict]:
    try:
        labs = json.loads(WITNESS_PLANS.read_text())
    except (OSError, ValueError):
        return {}
    return {key: plan for cells in labs.values() for key, plan in cells.items()}


def plan_for(source: str) -> dict | None:
    """The plan of the test cell with this source (None: none, or plans turned off with COURSE_WITNESS_PLANS=0)."""
    if os.environ.get("COURSE_WITNESS_PLANS", "1") == "0":
        return None
    plan = _plans().get(cell_key(source))
    return None if plan is None else {k: plan[k] for k in ("guarded", "refused", "memory_allowance")}


def plans_logged(out: str) -> list[dict]:
    found = []
    for line in out.splitlines():
        if PLAN_MARK in line:
            with contextlib.suppress(ValueError):
                found.append(json.loads(line.split(PLAN_MARK, 1)[1]))
    return found


def stale_note(logged: list[dict]) -> str | None:
    """The grading report's note when a cell's plan did not cover its checks (graded kernel first instead)."""
    stale = sorted({str(p.get("grade_id")) for p in logged if p.get("stale")})
    return (f"witness plans out of date for {', '.join(stale)} (graded the slower way; `python -m autograder "
            "witness-plans` writes them again)") if stale else None
