"""The temporary folder a test's autograde runs under (its TMPDIR), and what the grading left there.

Short and under /tmp (not pytest's deep `tmp_path`), so every socket the grader makes below it fits a Unix
socket's 107 characters and stays in it (autograder/judging/socket_folder.py) where the leftover check looks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    """A fresh folder under /tmp, removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="grading-", dir="/tmp"))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def as_tmpdir(scratch: Path) -> Iterator[None]:
    """TMPDIR=scratch for the processes grading starts, restored afterwards."""
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    try:
        yield
    finally:
        os.environ.pop("TMPDIR") if saved is None else os.environ.update(TMPDIR=saved)


def left_files(scratch: Path) -> list[Path]:
    return list(scratch.iterdir())


def left_running(scratch: Path) -> list[Path]:
    """Processes whose command line names the scratch folder (a sandbox, kernel, judge or witness of the grading)."""
    ours = str(scratch).encode()
    return [p for p in Path("/proc").glob("[0-9]*/cmdline") if ours in _read(p)]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
