"""Folders for the grader's Unix sockets, short enough to bind.

A Unix socket's path must fit `sun_path`: 108 bytes on Linux with its terminating NUL, so 107 characters. Below
its folder the grader adds at most `SOCKET_TAIL` characters (the judge's `judge-XXXXXXXX/judge.sock`, the kernel's
`k-N` ipc endpoints); a TMPDIR deep enough to push that past the limit (pytest's `tmp_path`, a long home) would
make bind() fail and the judge die before it says a word, so the folder goes to /tmp instead.
"""

from __future__ import annotations

import os
import tempfile

SUN_PATH_MAX = 107
SOCKET_TAIL = len("/judge-XXXXXXXX/judge.sock")
FALLBACK = "/tmp"


def fits(path: str) -> bool:
    """Whether a Unix socket can be bound at `path`."""
    return len(os.fsencode(path)) <= SUN_PATH_MAX


def socket_folder(prefix: str) -> str:
    """A new private folder (mkdtemp) for sockets: in TMPDIR when every socket below it fits, else in /tmp."""
    for base in (tempfile.gettempdir(), FALLBACK):
        probe = os.path.join(base, prefix + "X" * 8)
        if fits(probe + "X" * SOCKET_TAIL):
            return tempfile.mkdtemp(prefix=prefix, dir=base)
    raise OSError(f"no folder short enough for the grader's Unix sockets ({SUN_PATH_MAX} characters at most): "
                  f"set TMPDIR to a short path")
