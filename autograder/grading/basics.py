"""What the command line needs of the nbgrader flow without importing nbgrader: the error it reports and the
whole-submission time limit (so `gpu-check` and `calibrate` run on a GPU machine that has no nbgrader)."""

from __future__ import annotations

__all__ = ["GradingError", "SUBMISSION_TIMEOUT_S"]

SUBMISSION_TIMEOUT_S = 1800   # wall-clock limit for one whole submission (cells have their own limit)


class GradingError(RuntimeError):
    """The grading machinery itself failed (not the learner's notebook)."""
