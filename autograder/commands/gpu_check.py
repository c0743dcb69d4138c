"""gpu-check: the GPU tier, every GPU check and benchmark, a JSON + Markdown report, resumable."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run the GPU tier and report what it measured (needs a CUDA GPU)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibrate", action="store_true", help="run `calibrate` first (thresholds for this GPU)")
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming the labs already done")
    p.add_argument("--only", action="append", help="only this part (repeatable): lab01, lab03, lab04, lab05, lab08, "
                   "machine, tests, mutation (the mutants only a GPU tells apart)")
    p.add_argument("--out", type=Path, help="report folder (default autograder/calibration/)")


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder.gpu_tier import gpu_check

    status = gpu_check.main(course, out_dir=args.out, calibrate=args.calibrate, fresh=args.fresh, only=args.only)
    if args.only is None or "mutation" in args.only:
        status = max(status, _gpu_only_mutants(course, args.out))
    return status


def _gpu_only_mutants(course: Path, out: Path | None) -> int:
    """The mutants known/ lists as GPU-only (autograder/mutation/), graded by their labs' checks on this GPU; the
    report goes beside the GPU tier's (gpu-mutation.md)."""
    import torch

    from autograder.mutation.report import markdown
    from autograder.mutation.run import load_known, run_lab
    from autograder.paths import AUTOGRADER_DIR

    if not torch.cuda.is_available():
        print("gpu-check: GPU-only mutants not run: no CUDA GPU here")
        return 0
    labs = [p.name for p in sorted((course / "solutions").iterdir()) if p.is_dir() and load_known(p.name)["gpu_only"]]
    results = [run_lab(lab, gpu_only=True) for lab in labs]
    report = (out or AUTOGRADER_DIR / "calibration") / "gpu-mutation.md"
    report.write_text(f"# GPU-only mutants on {torch.cuda.get_device_name()}\n\n{markdown(results)}\n")
    print(f"gpu-check: GPU-only mutants of {len(labs)} labs graded: {report}")
    return 1 if any(r.ids("survived") or r.baseline_failures for r in results) else 0
