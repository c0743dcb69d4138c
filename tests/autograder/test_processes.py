"""autograder.processes: stopping a grading run leaves none of its processes behind."""

import subprocess

from autograder import processes


def test_kill_group_reaches_processes_in_other_sessions():
    """Kernels run in sessions of their own; a stopped submission must not leave them running."""
    import os
    import time
    proc = subprocess.Popen(["bash", "-c", "setsid sleep 120 & sleep 120"], start_new_session=True)
    try:
        for _ in range(50):
            kids = processes.descendants(proc.pid)
            if len(kids) >= 2:
                break
            time.sleep(0.1)
        assert len(kids) >= 2
    finally:
        processes.kill_group(proc)
        proc.wait(timeout=10)
    time.sleep(0.2)

    def alive(pid):
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False
    assert not any(alive(p) for p in kids)
