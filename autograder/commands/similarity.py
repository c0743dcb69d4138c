"""similarity --assignment A: answers sharing code with a classmate's, the package's reference or the course's
solution, per exercise (copydetect), most similar first; a lead to read, not a verdict (instructor)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "answers sharing code with others or with the reference (instructor)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--assignment", required=True)
    p.add_argument("--threshold", type=float, default=0.5,
                   help="report an answer when at least this share of its fingerprints is found in another's")
    p.add_argument("--csv", type=Path, help="also write the matches as CSV here")
    p.add_argument("--html", type=Path, help="also write copydetect's side-by-side HTML report here")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import similarity

    matches, notes = similarity.compare(course, args.assignment, threshold=args.threshold, html=args.html)
    for note in notes:
        print(f"note: {note}")
    print(similarity.format_table(matches))
    if args.csv:
        similarity.write_csv(matches, args.csv)
    return 0
