"""Submissions per minute of `autograde --jobs N` on this machine (sandboxed), for the issue's estimate.

    python scripts/measure_autograde_throughput.py --assignment 03_continuous_batching --students 4 --jobs 1 2

Builds a throwaway course holding one assignment, submits its solution notebook (or, with --release, the
released stub) as N students, and grades the class once per --jobs value, in turn.
The course and the timing are autograder/commands/grading_bench.py's (`make bench` measures with it too).
Prints one JSON line per run: jobs, submissions, seconds, submissions per minute, seconds per submission.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autograder.commands.grading_bench import build_class, time_autograde  # noqa: E402
from autograder.grading import nbgrader_runs as grading  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--assignment", required=True)
    p.add_argument("--students", type=int, default=4)
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--release", action="store_true", help="submit the released stub instead of the solution")
    args = p.parse_args()
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
            course = build_class(grading.REPO_ROOT, args.assignment, Path(tmp) / "course", args.students,
                                 release=args.release)
            dt, results = time_autograde(course, jobs, timeout=grading.SUBMISSION_TIMEOUT_S, log=print)
            print(json.dumps({"jobs": jobs, "submissions": len(results), "seconds": round(dt, 1),
                              "per_minute": round(60 * len(results) / dt, 2),
                              "seconds_per_submission": round(dt / len(results), 1),
                              "job_seconds": sorted(round(r.seconds, 1) for r in results),
                              "record_seconds": sorted(round(r.record_seconds, 2) for r in results),
                              "statuses": sorted({r.status for r in results}),
                              "scores": sorted({r.score for r in results})}), flush=True)


if __name__ == "__main__":
    main()
