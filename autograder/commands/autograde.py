"""autograde: grade every submission under submitted/<student>/<assignment>/, each in its own sandbox (instructor)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "grade every submission (instructor)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from autograder.grading.basics import SUBMISSION_TIMEOUT_S

    p.add_argument("--assignment", action="append", help="only this assignment (repeatable)")
    p.add_argument("--student", action="append", help="only this student (repeatable)")
    p.add_argument("--timeout", type=float, default=SUBMISSION_TIMEOUT_S, help="wall-clock seconds per submission")
    p.add_argument("--json", type=Path, help="also write all results as JSON here")
    p.add_argument("--jobs", type=int, default=None,
                   help="submissions graded at once, each with one torch thread (default: the machine's cores)")
    p.add_argument("--scheduler", help="grade on Dask: a scheduler address (tcp://host:8786), or 'local' "
                                       "for a LocalCluster of --jobs workers (pip install '.[cluster]')")
    p.add_argument("--unsafe", action="store_true",
                   help="grade even where no sandbox can start: learners' code then runs with your rights")
    p.add_argument("--memory", type=float, default=3.0, help="GiB of address space per kernel (RLIMIT_AS)")
    p.add_argument("--disk", type=float, default=0.5, help="GiB of writable tmpfs per kernel")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.grading import batch
    from autograder.judging import sandbox

    policy = sandbox.SandboxPolicy(memory_bytes=int(args.memory * sandbox.GiB), tmp_bytes=int(args.disk * sandbox.GiB),
                                   cpu_seconds=int(args.timeout) + 5)
    results = batch.autograde(course, args.assignment, args.student, timeout=args.timeout, jobs=args.jobs,
                              scheduler=args.scheduler, unsafe=args.unsafe, policy=policy)
    if not results:
        print(f"no submissions under {course / 'submitted'}/<student>/<assignment>/")
    else:
        bad = [r for r in results if r.status != "ok"]
        print(f"graded {len(results)} submission(s); {len(bad)} with problems (see status column)")
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=1))
    return 0
