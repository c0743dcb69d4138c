"""The submission's processes, held and measured by the grading process while the judge times a call.

What a submission's own code reports about time or memory is its to forge, and what it starts beside a timed call
can bend the call's clock (a process that busies the cores while the judge times the baseline makes the learner's
code look fast). So the judge asks the grading process, which runs outside every sandbox, to act on the
submission's processes through the operating system, where learner code has no say:

    stop_all()                    SIGSTOP every process of the submission (the judge times its own baseline)
    stop_others(serving)          SIGSTOP all but the process serving the judge (the learner's call is timed)
    resume()                      SIGCONT what was stopped
    cpu_seconds()                 user + system CPU time of every process of the submission (children reaped
                                  included), from /proc: a timed call's share of the cores, whatever it says

A process is the submission's when it descends from one of `roots` (the sandboxes' bubblewrap processes, or an
unsandboxed kernel). Stopping repeats its scan until a scan finds nothing new: a stopped process cannot fork, so a
submission cannot outrun it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, Iterable

from autograder.processes import descendants

__all__ = ["SubmissionProcesses", "SubmissionHold"]

TICKS = os.sysconf("SC_CLK_TCK")
STOP_WAIT_S = 2.0          # a process in uninterruptible sleep stops when it wakes


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 onwards), or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class SubmissionProcesses:
    """The processes under `roots`; the serving process of one root is its oldest process that is not bubblewrap
    (the kernel or the witness: a learner's process always starts after it)."""

    def __init__(self, roots: Iterable[int]) -> None:
        self.roots = [int(r) for r in roots]
        self.stopped: set[int] = set()

    def pids(self) -> list[int]:
        return [pid for root in self.roots for pid in ([] if _comm(root) == "bwrap" else [root]) + descendants(root)]

    @staticmethod
    def serving(root: int) -> int | None:
        """The process that runs the kernel (or witness) under `root`: root itself when it is not bubblewrap
        (unsandboxed), else its first-started descendant that is not bubblewrap."""
        if root and _comm(root) not in ("bwrap", ""):
            return root
        started = []
        for pid in descendants(root):
            fields = _stat(pid)
            if fields is not None and _comm(pid) != "bwrap":
                started.append((int(fields[19]), pid))        # field 22: start time, in clock ticks since boot
        return min(started)[1] if started else None

    # ------------------------------------------------------------------------------------------ holding them

    def stop_all(self) -> int:
        """Stop every process of the submission; how many."""
        return self._stop(keep=set())

    def stop_others(self, serving: int) -> int:
        """Stop every process of the submission but `serving` (its threads run on); how many."""
        return self._stop(keep={serving})

    def _stop(self, keep: set[int]) -> int:
        while True:
            new = [pid for pid in self.pids() if pid not in keep and pid not in self.stopped]
            if not new:
                return len(self.stopped)
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                    self.stopped.add(pid)
                except (ProcessLookupError, PermissionError):
                    keep.add(pid)          # gone, or not ours to stop: not looked at again this round
            _wait_stopped(new)

    def resume(self) -> None:
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        self.stopped.clear()

    # ------------------------------------------------------------------------------------------ measuring them

    def cpu_seconds(self) -> dict[int, float]:
        """{pid: user + system seconds, its reaped children's included} of every process of the submission."""
        out = {}
        for pid in self.pids():
            fields = _stat(pid)
            if fields is not None:
                out[pid] = sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS   # utime stime cutime cstime
        return out

    @staticmethod
    def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
        """CPU seconds the submission used between two `cpu_seconds()` (a process born in between counts whole)."""
        return sum(max(0.0, seconds - before.get(pid, 0.0)) for pid, seconds in after.items())


def _wait_stopped(pids: list[int], timeout: float = STOP_WAIT_S) -> None:
    """Until each process is stopped (or gone): a signal is delivered when the process is next scheduled."""
    deadline = time.monotonic() + timeout
    todo = list(pids)
    while todo and time.monotonic() < deadline:
        todo = [pid for pid in todo if (fields := _stat(pid)) is not None and fields[0] not in "TtZX"]
        if todo:
            time.sleep(0.0005)


class SubmissionHold:
    """The grading process's answer to a judge's `autograder.checking.isolation` request, for one test cell.

    `roots()` gives the sandboxes' root processes: {"kernel": pid, "witness": pid or None}, and under "serving"
    {phase: pid} the process serving the judge where it is not the root's oldest (a witness is a fork of the
    notebook's witness process: autograder/judging/witness.py). Requests:
    {"do": "stop_all"}, {"do": "stop_others", "phase": "kernel" or "witness"} (with a CPU snapshot), and
    {"do": "resume"} (answered with the CPU seconds the submission used since the snapshot)."""

    def __init__(self, roots: Callable[[], dict]) -> None:
        self.roots = roots
        self.held: SubmissionProcesses | None = None
        self.before: dict[int, float] | None = None

    def handle(self, request: dict) -> dict:
        what = request.get("do")
        if what == "resume":
            return self._resume()
        if what not in ("stop_all", "stop_others"):
            return {"error": f"unknown request {what!r}"}
        self._resume()
        roots = dict(self.roots())
        known = roots.pop("serving", None) or {}      # {phase: pid} where the root's oldest process does not serve
        self.held = SubmissionProcesses(pid for pid in roots.values() if pid)
        if what == "stop_all":
            return {"stopped": self.held.stop_all()}
        phase = request.get("phase", "kernel")
        serving = known.get(phase) or SubmissionProcesses.serving(roots.get(phase) or 0)
        if serving is None:
            self.held = None
            return {"error": "no process serves the judge"}
        self.before = self.held.cpu_seconds()
        return {"stopped": self.held.stop_others(serving)}

    def release(self) -> None:
        """Resume whatever a judge left stopped (a judge that died holding the submission)."""
        self._resume()

    def _resume(self) -> dict:
        reply: dict = {}
        if self.held is not None:
            if self.before is not None:
                reply["cpu_seconds"] = self.held.cpu_between(self.before, self.held.cpu_seconds())
            self.held.resume()
        self.held, self.before = None, None
        return reply
