"""feedback: nbgrader generate_feedback, HTML under feedback/ (instructor)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "nbgrader generate_feedback (instructor)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--assignment")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import nbgrader_runs

    print(f"feedback written under {nbgrader_runs.generate_feedback(course, args.assignment)}")
    return 0
