"""export: the gradebook to CSV (instructor)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "gradebook to CSV (instructor)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--csv", type=Path)


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import nbgrader_runs

    print(f"grades exported to {nbgrader_runs.export_grades(course, args.csv)}")
    return 0
