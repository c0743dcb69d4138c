"""calibrate: measure every speed check of this device class (reference vs plausible slow implementations) and
write its threshold to autograder/calibration/."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "set the speed thresholds of this device class from measurements"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lab", help="only this lab's checks (e.g. 04)")
    p.add_argument("--runs", type=int, default=5, help="runs per implementation (default 5)")
    p.add_argument("--check", help="only this check (e.g. lab04_flash_speed)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="tier to calibrate (default: cuda when present, else cpu)")
    p.add_argument("--out", type=Path, help="write the files here instead of autograder/calibration/")
    p.add_argument("--small", action="store_true", help="small shapes: tests the machinery, calibrates nothing")
    p.add_argument("--note", default="", help="recorded in each file (e.g. 'machine shared with other jobs')")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.gpu_tier import calibrate

    return calibrate.main(lab=args.lab, runs=args.runs, check=args.check, small=args.small, out_dir=args.out,
                          device=args.device, note=args.note)
