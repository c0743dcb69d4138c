"""Submissions per minute of `autograde --jobs N` on this machine (sandboxed), for the issue's estimate.

    python scripts/measure_autograde_throughput.py --assignment 03_continuous_batching --students 4 --jobs 1 2

Builds a throwaway course holding one assignment, submits its solution notebook (or, with --release, the
released stub) as N students, and grades the class once per --jobs value, in turn.
Prints one JSON line per run: jobs, submissions, seconds, submissions per minute, seconds per submission.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autograder.grading import batch, nbgrader_runs as grading  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--assignment", required=True)
    p.add_argument("--students", type=int, default=4)
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--release", action="store_true", help="submit the released stub instead of the solution")
    args = p.parse_args()
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
            course = grading.make_temp_course(grading.REPO_ROOT, args.assignment, Path(tmp) / "course")
            src = course / "solutions" / args.assignment / f"{args.assignment}.ipynb"
            if args.release:
                grading.release(course, [args.assignment])
                src = course / "labs" / args.assignment / f"{args.assignment}.ipynb"
            for i in range(args.students):
                d = course / "submitted" / f"s{i:03d}" / args.assignment
                d.mkdir(parents=True)
                shutil.copy(src, d / src.name)
            t0 = time.perf_counter()
            results = batch.autograde(course, [args.assignment], jobs=jobs, progress=False, log=print)
            dt = time.perf_counter() - t0
            print(json.dumps({"jobs": jobs, "submissions": len(results), "seconds": round(dt, 1),
                              "per_minute": round(60 * len(results) / dt, 2),
                              "seconds_per_submission": round(dt / len(results), 1),
                              "job_seconds": sorted(round(r.seconds, 1) for r in results),
                              "record_seconds": sorted(round(r.record_seconds, 2) for r in results),
                              "statuses": sorted({r.status for r in results}),
                              "scores": sorted({r.score for r in results})}), flush=True)


if __name__ == "__main__":
    main()
