"""grade PATH: grade one notebook as nbgrader autograde would (last line: score: X / Y), sandboxed where one starts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "grade one notebook"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from autograder.grading.basics import SUBMISSION_TIMEOUT_S

    p.add_argument("path", type=Path)
    p.add_argument("--assignment", help="assignment id (default: found from the notebook's name)")
    p.add_argument("--timeout", type=float, default=SUBMISSION_TIMEOUT_S, help="wall-clock seconds for the whole notebook")
    p.add_argument("--json", type=Path, help="also write the result as JSON here")
    p.add_argument("--keep", type=Path, help="keep the temporary course folder (autograded notebook) here")
    p.add_argument("--require-full", action="store_true",
                   help="exit 1 unless the notebook scores full marks (nbgrader validate always exits 0)")
    p.add_argument("--unsafe", action="store_true", help="run the kernel without the sandbox")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import batch
    from autograder.judging import sandbox
    from autograder.learner import progress

    sandboxed = not args.unsafe
    if sandboxed and (why := sandbox.probe()):
        print(f"note: no sandbox here ({why}); grading your notebook without one", file=sys.stderr)
        sandboxed = False
    print(f"{args.path}: grading (a line per check as it finishes; the first waits for the cells before it)",
          flush=True)
    res = batch.grade_notebook(args.path, assignment=args.assignment, course_root=course, timeout=args.timeout,
                               keep=args.keep, sandboxed=sandboxed, cell_log=lambda line: print(f"  {line}", flush=True))
    print(f"{args.path}: assignment {res.assignment}, status {res.status}")
    for note in res.notes:
        print(f"  note: {note}")
    for c in res.cells:
        extra = f"  ({c.note})" if c.note else ""
        print(f"  {c.grade_id:<28} {c.score:g} / {c.max_score:g}{extra}")
    if args.json:
        args.json.write_text(json.dumps(res.to_dict(), indent=1))
    progress.record(args.path, res.to_dict())          # in a workspace: `make progress` need not grade it again
    print(f"score: {res.score:g} / {res.max_score:g}")
    return 1 if args.require_full and res.score < res.max_score else 0
