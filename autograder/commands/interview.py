"""interview [-n N] [--seed S] [--topic T ...]: interview practice with fresh numbers, graded and diagnosed."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "interview practice: questions with fresh numbers, graded and explained"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from autograder.interview.session import TOPICS

    p.add_argument("-n", type=int, default=10, help="number of questions (default 10)")
    p.add_argument("--seed", type=int, help="repeat a session (default: a new seed, printed)")
    p.add_argument("--topic", action="append", choices=TOPICS, help="only this topic (repeatable)")
    p.add_argument("--history", type=Path, help="score history file (default: .interview_history.jsonl "
                                                "in the course root, or $COURSE_INTERVIEW_HISTORY)")
    p.add_argument("--no-history", action="store_true", help="do not record this session")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.interview import session

    history = None if args.no_history else (args.history or session.history_path())
    session.run_session(args.n, args.seed, tuple(args.topic or session.TOPICS), history=history)
    return 0
