"""runall [--fix]: does Run All reach the last cell of each released notebook? (maintenance)"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run released notebooks as Run All would; list (or tag) raising cells"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--assignment", action="append")
    p.add_argument("--fix", action="store_true", help="tag raising cells raises-exception in solutions/, re-release")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import nbgrader_runs, runall

    stuck = 0
    for a in args.assignment or nbgrader_runs.assignments(course):
        for nb_path in sorted((course / "labs" / a).glob("*.ipynb")):
            missing = runall.untagged(runall.run_released(nb_path))
            stuck += bool(missing)
            for c in missing:
                print(f"{nb_path.relative_to(course)}: cell {c.index + 1} ({c.grade_id or c.cell_id}) raises "
                      f"{c.ename} without the {runall.TAG} tag")
            if args.fix:
                added = runall.tag_cells(course / "solutions" / a / nb_path.name, {c.cell_id for c in missing})
                print(f"solutions/{a}/{nb_path.name}: {added} cell(s) tagged")
        if args.fix:
            nbgrader_runs.release(course, [a])
    return 1 if stuck and not args.fix else 0
