"""Where the course's folders are: the one module that finds them from its own file.

    from autograder.paths import REPO_ROOT, CALIBRATION_DIR
    config = REPO_ROOT / "nbgrader_config.py"

Every other module asks here instead of counting `Path(__file__).parents`, so moving a module into a subfolder
changes no path. AUTOGRADER_DIR and SHARED_DIR are also a trust boundary: `wire.installed_module`,
`reference_guard` and the sandbox accept course code only from these two folders.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["AUTOGRADER_DIR", "REPO_ROOT", "SHARED_DIR", "CALIBRATION_DIR", "EXERCISE_MAP", "SANDBOX_BOOT",
           "MUTATION_KNOWN", "WITNESS_PLANS"]

AUTOGRADER_DIR = Path(__file__).resolve().parent          # the autograder package
REPO_ROOT = AUTOGRADER_DIR.parent                         # the course: solutions/, labs/, nbgrader_config.py, data/
SHARED_DIR = REPO_ROOT / "shared"                         # the minigpt package learners import
CALIBRATION_DIR = AUTOGRADER_DIR / "calibration"          # speed thresholds, one file per check and device class
EXERCISE_MAP = AUTOGRADER_DIR / "exercise_map.json"       # check and learner names -> exercise labels
SANDBOX_BOOT = AUTOGRADER_DIR / "judging" / "sandbox_boot.py"     # the first process inside every grading sandbox
MUTATION_KNOWN = AUTOGRADER_DIR / "mutation" / "known"      # per lab: equivalent, surviving and GPU-only mutants
WITNESS_PLANS = AUTOGRADER_DIR / "witness_plans.json"     # per lab and test cell: what its witness starts without
