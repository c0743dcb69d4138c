"""The grading process holds and measures a submission's processes from outside (autograder/judging/
submission_processes.py): stopped processes run no code, and CPU time is counted whatever a process says."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.judging.submission_processes import SubmissionHold, SubmissionProcesses

SPIN = "import time\nwhile True:\n    pass\n"


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def family(tmp_path):
    """A parent that starts two spinning children (a submission's hogs) and sleeps."""
    code = (f"import subprocess, sys, time\n"
            f"kids = [subprocess.Popen([sys.executable, '-c', {SPIN!r}]) for _ in range(2)]\n"
            f"open({str(tmp_path / 'ready')!r}, 'w').close()\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield proc
    processes = SubmissionProcesses([proc.pid])
    processes.resume()
    for pid in processes.pids():
        subprocess.run(["kill", "-9", str(pid)], check=False)
    proc.wait()


def test_stop_all_stops_every_process_and_resume_lets_them_run(family):
    processes = SubmissionProcesses([family.pid])
    pids = processes.pids()
    assert len(pids) == 3 and pids[0] == family.pid          # unsandboxed: the root itself serves
    assert processes.stop_all() == 3
    assert {_state(pid) for pid in pids} == {"T"}
    before = processes.cpu_seconds()
    time.sleep(0.3)
    assert processes.cpu_between(before, processes.cpu_seconds()) < 0.02     # nothing of it ran
    processes.resume()
    assert "T" not in {_state(pid) for pid in pids}


def test_stop_others_leaves_the_serving_process_and_counts_what_runs(family):
    import psutil       # an independent reader of the same counters

    def psutil_seconds(pids):
        total = 0.0
        for pid in pids:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        return total

    processes = SubmissionProcesses([family.pid])
    assert SubmissionProcesses.serving(family.pid) == family.pid
    processes.stop_others(family.pid)
    assert _state(family.pid) != "T" and {_state(p) for p in processes.pids() if p != family.pid} == {"T"}
    processes.stop_all()              # measured while nothing runs, so both readers see the same instant
    pids = processes.pids()
    ours, theirs = processes.cpu_seconds(), psutil_seconds(pids)
    processes.resume()
    time.sleep(0.5)
    processes.stop_all()
    used = processes.cpu_between(ours, processes.cpu_seconds())
    processes.resume()
    assert used > 0                   # the two spinning children ran
    assert used == pytest.approx(psutil_seconds(pids) - theirs, abs=0.03)


def test_the_hold_answers_a_judge_and_releases_what_it_stopped(family):
    hold = SubmissionHold(lambda: {"kernel": family.pid, "witness": None})
    assert hold.handle({"do": "stop_others", "phase": "kernel"})["stopped"] == 2
    time.sleep(0.2)
    reply = hold.handle({"do": "resume"})
    assert reply["cpu_seconds"] < 0.1           # the hogs were stopped; the parent sleeps
    hold.handle({"do": "stop_all"})
    hold.release()
    assert "T" not in {_state(pid) for pid in SubmissionProcesses([family.pid]).pids()}
