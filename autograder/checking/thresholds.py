"""Speed thresholds, read from the calibration files that `make calibrate` writes.

    fraction = threshold("lab01_cached_speedup", "cpu")     # from autograder/calibration/lab01_cached_speedup.cpu.json

A speed check passes when the learner's ratio reaches `fraction` times the reference's, measured in the same run
(`autograder.harness.check_speedup`); a memory check when the learner's peak memory grows at most `threshold`
times per doubling of the sequence. Each threshold is chosen by `python -m autograder calibrate` on one device
class (`minigpt.timing.device_class()`: "cpu", "cuda-sm90", ...) and stored in
`autograder/calibration/<check>.<device class>.json`. There is no fallback between classes and no default:

* no file for this device class      -> `Uncalibrated`: "uncalibrated on <device>; run `make calibrate`";
* a file that says `"graded": false` -> `Uncalibrated`: the reference and the slow implementations overlapped
  on this device, so the check cannot separate them here and is ungraded.

`Uncalibrated` is an AssertionError, so under nbgrader autograde such a check awards nothing, like a missing GPU.
`fixed(value)` overrides every threshold inside a block: `calibrate` uses it to measure without judging.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from autograder.machine import cpu_name
from autograder.paths import CALIBRATION_DIR

__all__ = ["CALIBRATION_DIR", "calibration_dir", "Uncalibrated", "calibration_path", "read_calibration", "threshold",
           "status", "fixed", "device_name"]

_override: list[float] = []


class Uncalibrated(AssertionError):
    """This check has no usable threshold for this device class (no calibration file, or an ungraded one)."""


def calibration_dir() -> Path:
    """autograder/calibration/, or $COURSE_CALIBRATION_DIR when set (tests; a class's own thresholds elsewhere)."""
    return Path(os.environ.get("COURSE_CALIBRATION_DIR") or CALIBRATION_DIR)


def calibration_path(check: str, device_class: str, directory: Path | None = None) -> Path:
    return (directory or calibration_dir()) / f"{check}.{device_class}.json"


def device_name(device_class: str) -> str:
    """The CPU model or the GPU's name, for messages and calibration files."""
    if device_class.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else device_class
    return cpu_name()


def read_calibration(check: str, device_class: str, directory: Path | None = None) -> dict[str, Any] | None:
    path = calibration_path(check, device_class, directory)
    return json.loads(path.read_text()) if path.exists() else None


def status(check: str, device_class: str, directory: Path | None = None) -> tuple[float | None, str]:
    """(fraction, "") when `check` is graded on this device class, else (None, why not)."""
    if _override:
        return _override[-1], ""
    data = read_calibration(check, device_class, directory)
    where = f"{device_name(device_class)} (device class {device_class})"
    if data is None:
        return None, (f"{check} is uncalibrated on {where}; run `make calibrate` on this machine "
                      f"(it writes {calibration_path(check, device_class).name})")
    if not data.get("graded") or data.get("threshold") is None:
        return None, (f"{check} is ungraded on {where}: {data.get('decision', 'the calibration separated nothing')} "
                      f"(see autograder/calibration/{calibration_path(check, device_class).name})")
    return float(data["threshold"]), ""


def threshold(check: str, device_class: str, directory: Path | None = None) -> float:
    """The calibrated threshold of `check` on this device class; raises Uncalibrated when there is none."""
    fraction, why = status(check, device_class, directory)
    if fraction is None:
        raise Uncalibrated(why)
    return fraction


@contextlib.contextmanager
def fixed(value: float) -> Iterator[None]:
    """Every threshold is `value` inside the block (calibration measures with 0.0; tests pin one)."""
    _override.append(float(value))
    try:
        yield
    finally:
        _override.pop()
