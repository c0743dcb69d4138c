"""witness-plans [--labs 06 ...]: grade each lab's solution and write what its witnessed test cells guard, refuse and ask
for (autograder/witness_plans.json; autograder/judging/witness_plans.py says what the plans are for)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

HELP = "regenerate autograder/witness_plans.json by grading each lab's solution (minutes)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labs", nargs="*", default=None, help="only these labs (00 ... 11); the others keep their plans")


def learnt_plans(course: Path, assignment: str) -> dict[str, dict]:
    """{cell key: plan} of one lab: its solution graded as tests/test_notebooks.py grades it, with no plans (every
    witnessed cell runs against the kernel first, and the judge logs what its checks guarded there)."""
    import shutil

    from autograder.grading import nbgrader_runs as grading, notebooks

    with tempfile.TemporaryDirectory(prefix="witness-plans-") as tmp:
        temp = grading.make_temp_course(course, assignment, Path(tmp) / "course")
        db = Path(tmp) / "gradebook.db"
        folder = grading.generate_assignment(temp, assignment, db=db)
        for nb in folder.glob("*.ipynb"):
            notebooks.normalize_file(nb)
        submitted = temp / "submitted" / "solution" / assignment
        submitted.mkdir(parents=True)
        for nb in (temp / "solutions" / assignment).glob("*.ipynb"):
            shutil.copy(nb, submitted / nb.name)
        result = grading.autograde_one(temp, assignment, "solution", db=db, released=folder,
                                       env=grading.nbgrader_env({"COURSE_WITNESS_PLANS": "0"}))
    lost = [c.grade_id for c in result.cells if c.score != c.max_score and "needs a GPU" not in c.note]
    if lost:
        raise SystemExit(f"{assignment}: the solution lost points in {', '.join(lost)}: no plans written for it")
    return {p["cell"]: {"grade_id": p["grade_id"], **p["lists"]} for p in result.witness_plans if p.get("lists")}


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import nbgrader_runs as grading
    from autograder.paths import WITNESS_PLANS

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    labs = grading.assignments(course)
    if args.labs:
        labs = [a for a in labs if a[:2] in args.labs]
    plans = json.loads(WITNESS_PLANS.read_text()) if WITNESS_PLANS.exists() else {}
    for assignment in labs:
        plans[assignment] = learnt_plans(course, assignment)
        print(f"{assignment}: {len(plans[assignment])} witnessed test cells", flush=True)
    plans = {a: plans[a] for a in sorted(plans) if a in grading.assignments(course)}
    WITNESS_PLANS.write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n")
    print(f"wrote {WITNESS_PLANS}")
    return 0
