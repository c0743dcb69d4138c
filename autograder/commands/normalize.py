"""normalize [--check] [PATHS]: strip outputs and execution counts from notebooks (or only check)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "strip outputs from notebooks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true", help="only report; exit 1 if a notebook is not normalized")
    p.add_argument("paths", nargs="*", type=Path)


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import notebooks

    paths = args.paths or notebooks.find_notebooks(course)
    changed = [p for p in paths if not notebooks.is_normalized(p)]
    if args.check:
        for p in changed:
            print(f"not normalized: {p} (run `python -m autograder normalize`)")
        return 1 if changed else 0
    for p in changed:
        notebooks.normalize_file(p)
        print(f"normalized {p}")
    return 0
