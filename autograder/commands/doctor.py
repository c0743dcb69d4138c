"""doctor: what this machine can run."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "what this machine can run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, course: Path) -> int:
    from autograder import doctor

    return doctor.main()
