"""gpu-check: the GPU tier, every GPU check and benchmark, a JSON + Markdown report, resumable."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run the GPU tier and report what it measured (needs a CUDA GPU)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibrate", action="store_true", help="run `calibrate` first (thresholds for this GPU)")
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming the labs already done")
    p.add_argument("--only", action="append", help="only this part (repeatable): lab01, lab03, lab04, lab05, lab08, "
                   "machine, tests")
    p.add_argument("--out", type=Path, help="report folder (default autograder/calibration/)")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.gpu_tier import gpu_check

    return gpu_check.main(course, out_dir=args.out, calibrate=args.calibrate, fresh=args.fresh, only=args.only)
