"""How long a class takes on this machine: release a lab to N students, each fetches and submits it (half answered,
half the stub), collect, autograde with --jobs J (sandboxed), generate and release feedback. Run as root; the class
(users, homes, exchange) is removed at the end. Prints each step's wall time, per student where it scales with them,
and the autograding time extrapolated to a larger class on K workers.

    sudo .venv/bin/python scripts/measure_hub_class.py --students 8 --jobs 2 [--class-size 200 --workers 10]

The extrapolation assumes what grading is here: each submission is one sandboxed kernel on one thread, independent
of the others, so a class takes (submissions / (workers * jobs per worker)) * seconds per submission per job, plus the
collect and feedback steps, which run once on the instructor's machine and grow with the class.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from autograder.hub import classroom  # noqa: E402


def _step(roster: classroom.Roster, user: str, command: str) -> float:
    start = time.perf_counter()
    done = classroom.run_as(roster, user, command, timeout=3600)
    if done.returncode:
        raise SystemExit(f"{user}: {command} failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--lab", default="00_token_factory")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--class-size", type=int, default=200, help="extrapolate to this many students")
    parser.add_argument("--workers", type=int, default=10, help="... graded on this many machines")
    parser.add_argument("--jobs-per-worker", type=int, default=8, help="... each grading this many at a time")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the class's students are system users")
    root = Path(tempfile.mkdtemp(prefix="llm-course-hub-"))
    root.chmod(0o755)
    load = os.getloadavg()[0]
    times: dict[str, float] = {}
    try:
        start = time.perf_counter()
        roster = classroom.create_class(root, args.students, prefix="lm" + secrets.token_hex(2))
        times["setup (users, class venv, course clone)"] = time.perf_counter() - start
        lab, solved = args.lab, REPO_ROOT / "solutions" / args.lab / f"{args.lab}.ipynb"
        times["release"] = _step(roster, roster.instructor, f"cd ~/course && nbgrader release_assignment {lab}")
        times["fetch, all students"] = sum(_step(roster, s, f"nbgrader fetch_assignment {lab}") for s in roster.students)
        for s in roster.students[::2]:                            # half of the class answers, half submits the stub
            target = Path(f"/home/{s}/{lab}/{lab}.ipynb")
            shutil.copy(solved, target)
            shutil.chown(target, s, s)
        times["submit, all students"] = sum(_step(roster, s, f"nbgrader submit {lab}") for s in roster.students)
        times["collect"] = _step(roster, roster.instructor, f"cd ~/course && nbgrader collect {lab}")
        times[f"autograde --jobs {args.jobs}"] = _step(
            roster, roster.instructor, f"cd ~/course && python -m autograder autograde --assignment {lab} --jobs {args.jobs}")
        times["feedback + release_feedback"] = _step(
            roster, roster.instructor, f"cd ~/course && python -m autograder feedback --assignment {lab} && "
                                       f"nbgrader release_feedback {lab}")
    finally:
        if (root / classroom.STATE).exists():
            classroom.remove_class(root)
        shutil.rmtree(root, ignore_errors=True)
    n = args.students
    print(f"{n} students, lab {args.lab}, load average {load:.2f} at start, {os.cpu_count()} cores")
    for name, seconds in times.items():
        per = f"  ({seconds / n:.2f} s per student)" if "all students" in name or "autograde" in name else ""
        print(f"  {name:42s} {seconds:8.1f} s{per}")
    grade = times[f"autograde --jobs {args.jobs}"] / n * args.jobs      # seconds of one submission in one job
    slots = args.workers * args.jobs_per_worker
    print(f"one submission takes about {grade:.1f} s in one grading job here; {args.class_size} students on "
          f"{args.workers} workers x {args.jobs_per_worker} jobs: about {args.class_size / slots * grade / 60:.1f} min "
          f"of grading, plus collect and feedback (here {times['collect'] / n:.2f} and "
          f"{times['feedback + release_feedback'] / n:.2f} s per student, on the instructor's machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
