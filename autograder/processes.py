"""Processes a grading run starts and must stop: nbgrader, its kernels, whatever a sandbox leaves behind.

    children(proc.pid)                   # its child processes (Linux /proc; empty elsewhere)
    victims = descendants(proc.pid)      # children, grandchildren, ... (Linux /proc; empty elsewhere)
    kill_group(proc)                     # proc's process group and every descendant, even in other sessions
    kill_session(pid)                    # the same for a process known by its pid (a fork of nbgrader_fork's server)
    start_as(env, cwd)                   # a forked child becomes what a fresh interpreter with env, in cwd, would be
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

__all__ = ["children", "descendants", "kill_group", "kill_session", "start_as"]


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return children


def children(pid: int) -> list[int]:
    """The direct child processes of pid (Linux /proc; empty elsewhere)."""
    return _children_by_parent().get(pid, [])


def descendants(pid: int) -> list[int]:
    """Child processes of pid, recursively (Linux /proc; empty elsewhere)."""
    children = _children_by_parent()
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_group(proc: subprocess.Popen) -> None:
    """Kill proc's process group and all its descendants (jupyter_client starts kernels in sessions of their own)."""
    kill_session(proc.pid)


def kill_session(pid: int) -> None:
    """Kill the process group led by pid and all pid's descendants: kill_group for a process known by its pid."""
    victims = descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_as(env: dict[str, str], cwd: str | None) -> None:
    """In a child forked from a server that imported its modules ahead (nbgrader_fork.py, judge_zygote.py): become what
    a fresh interpreter started with `env` in `cwd` would be, as far as it reads them after its imports: the
    environment replaced, PYTHONPATH first on sys.path, tempfile's folder read again from TMPDIR when first asked, and
    PYTHONWARNINGS applied as the interpreter applies it at start."""
    import sys
    import tempfile
    import warnings

    if cwd:
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    tempfile.tempdir = None
    warnings.resetwarnings()
    for option in filter(None, env.get("PYTHONWARNINGS", "").split(",")):
        warnings._setoption(option)
