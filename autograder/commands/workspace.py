"""workspace: create or update the learner's workspace copy of labs/ (never overwrites their edits)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "create or update the learner's workspace from labs/"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, help="the workspace (default: workspace/ in the course root)")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.learner import workspace

    print(workspace.sync(course, args.dir or course / "workspace").summary())
    return 0
