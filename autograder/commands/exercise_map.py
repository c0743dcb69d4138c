"""exercise-map [--check]: which check and learner function belong to which exercise (maintenance)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "regenerate autograder/exercise_map.json from solutions/"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true", help="only report; exit 1 if it is out of date")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.checking import learner_errors

    if args.check:
        stale = learner_errors.build_map() != learner_errors.exercise_map()
        print("exercise_map.json is out of date: run `python -m autograder exercise-map`" if stale
              else "exercise_map.json is current")
        return 1 if stale else 0
    changed = learner_errors.write_map()
    print(f"{'wrote' if changed else 'unchanged:'} {learner_errors.EXERCISE_MAP}")
    return 0
