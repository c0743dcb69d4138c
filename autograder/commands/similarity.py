"""similarity --assignment A: every code cell of every submission against the package's reference (function by
function), the course's solution and classmates' cells, on a normal form of the code, and the cells that carry code
without writing it (marshal, exec, blobs, importlib...); most similar first; a lead to read, not a verdict
(instructor)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "cells sharing code with others or with the reference, and cells carrying code in (instructor)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--assignment", required=True)
    p.add_argument("--threshold", type=float, default=0.5,
                   help="report a cell when at least this share of its fingerprints is found in the other's code, "
                        "or of the other's in it")
    p.add_argument("--csv", type=Path, help="also write the matches as CSV here")
    p.add_argument("--html", type=Path, help="also write an HTML report here (each match side by side)")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import similarity

    matches, notes = similarity.compare(course, args.assignment, threshold=args.threshold, html=args.html)
    for note in notes:
        print(f"note: {note}")
    print(similarity.format_table(matches))
    if args.csv:
        similarity.write_csv(matches, args.csv)
    return 0
