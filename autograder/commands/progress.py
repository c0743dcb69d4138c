"""progress: each lab's score in the learner's workspace (CPU and GPU points apart)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "each lab's score in the workspace"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, help="the workspace (default: workspace/ in the course root)")
    p.add_argument("--lab", action="append", help="only labs starting with this (e.g. 02; repeatable)")
    p.add_argument("--regrade", action="store_true", help="grade again even notebooks that did not change")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.learner import progress

    rows = progress.progress(course, args.dir or course / "workspace", labs=args.lab, regrade=args.regrade,
                             on_start=lambda lab: print(f"grading {lab} (it changed since it was last graded)",
                                                        flush=True))
    print(progress.format_table(rows))
    return 0
