"""release: regenerate labs/ from solutions/ (nbgrader generate_assignment) and normalize."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "regenerate labs/ from solutions/"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--assignment", action="append")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import nbgrader_runs

    for folder in nbgrader_runs.release(course, args.assignment):
        print(f"released {folder.relative_to(course)}")
    return 0
