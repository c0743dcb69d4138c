"""What this machine is, for messages, calibration files and `make doctor`; imports nothing of the course."""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_name"]


def cpu_name() -> str:
    """The CPU model ("AMD EPYC 7763 64-Core Processor"), or the platform's processor or machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
