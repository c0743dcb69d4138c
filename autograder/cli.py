"""`python -m autograder COMMAND`: the course's grading and maintenance commands.

    grade PATH [--assignment A]      grade one notebook as nbgrader autograde would (last line: score: X / Y);
                                     in the bubblewrap sandbox where one can start
    autograde [--assignment A ...]   instructor: grade every submission under submitted/<student>/<assignment>/,
              [--jobs N]             each in its own sandbox, N at a time (default: the machine's cores),
              [--scheduler ADDR]     or on Dask workers (ADDR: tcp://host:8786, or "local" for a LocalCluster);
              [--unsafe]             refuses where no sandbox can start, unless --unsafe
    feedback [--assignment A]        instructor: nbgrader generate_feedback (HTML under feedback/)
    export [--csv grades.csv]        instructor: gradebook to CSV
    hub setup|start|status|teardown  instructor, as root: a class on JupyterHub on this machine (system users,
        [--students N] [--port P]    nbgrader's exchange, the hub on 127.0.0.1; docs/hub.md)
    similarity --assignment A        instructor: every code cell (and file handed in) against the package's
               [--threshold T]       reference, the course's solution and classmates, on a normal form, and code
               [--csv F] [--html F]  carried in (code objects, marshal, exec, blobs); a lead to read, not a verdict
    release [--assignment A ...]     regenerate labs/ from solutions/ (nbgrader generate_assignment) and normalize
    normalize [--check] [PATHS]      strip outputs / execution counts from notebooks (or only check)
    doctor                           what this machine can run
    calibrate [--lab NN] [--runs N] [--check NAME]
                                     measure every speed check of this device class (reference vs plausible slow
                                     implementations) and write its threshold to autograder/calibration/
    gpu-check [--calibrate] [--fresh] [--only LAB ...]
                                     the GPU tier: every GPU check and benchmark, a JSON + Markdown report, resumable
    workspace [--dir D]              learner: create/update the workspace copy of labs/ (never overwrites your edits)
    progress [--dir D] [--lab NN]    learner: each lab's score in the workspace (CPU and GPU points apart)
    runall [--fix] [--assignment A]  maintenance: does Run All reach the last cell of each released notebook?
    exercise-map [--check]           maintenance: which check and learner function belong to which exercise
    interview [-n N] [--seed S] [--topic T ...]   interview practice with fresh numbers, graded and diagnosed
    mutation --lab NN [--sample N] [--exercise ID ...]
                                     maintenance: mutants of the lab's solution cells graded by its checks; the
                                     score, the survivors (wrong code the checks pass)
    grading-bench [--labs NN ...]    maintenance: seconds to grade each lab's solution (sandboxed, witness on) and
              [--class-size 30]      a class of lab 05 with --jobs N; data/bench/grading.json and a Markdown table
              [--jobs 2] [--quick]   (--quick: lab 00 and a class of 4); --readme: README's table from that JSON
    witness-plans [--labs NN ...]    maintenance: grade each lab's solution and write what each witnessed test cell
                                     guards (autograder/witness_plans.json: its witness starts before the cell runs)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from autograder.commands import COMMANDS
from autograder.paths import REPO_ROOT


def _command(name: str):
    return importlib.import_module(f"autograder.commands.{COMMANDS[name]}")


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    """Every command is listed; only the one named in `argv` (all, when none is) gets its arguments, so a light
    command does not pay for a heavy one's imports."""
    chosen = next((arg for arg in argv if arg in COMMANDS), None)
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--course", type=Path, default=REPO_ROOT,
                   help="course root holding nbgrader_config.py and solutions/ (default: this repository)")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        command = _command(name)
        parser = sub.add_parser(name, help=command.HELP)
        if chosen in (None, name):
            command.add_arguments(parser)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the command's module (autograder/commands/), return its exit status; 2 on a
    grading error (nbgrader failed), with its message."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(argv).parse_args(argv)
    from autograder.grading.basics import GradingError

    try:
        return _command(args.command).run(args, args.course.resolve())
    except GradingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
