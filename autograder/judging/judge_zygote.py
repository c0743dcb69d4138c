"""Judges forked from one process that prepared itself before any submission existed.

Every graded notebook has a judge (autograder/judging/judge.py), and a fresh judge spends most of its start, about
1.5 CPU-s, importing torch and the checks' modules: a class of 30 submissions paid that 30 times. The zygote pays it
once per grading process and forks one judge per notebook:

    grading process                                 zygote (sandboxed like a judge; judge.prepare() done)
    `zygote_env(env)`: starts it, listening ------>  waits for connections
    JudgeProcess: connect, send {policy, mode} -->  fork -> child: its own process group, NBGRADER_EXECUTION = mode,
                  + its control line and the               judge.serve(the kernel's listening socket, control line)
                    kernel's listening socket
                  <------------------------- {"pid"}
    `kill` (or the connection closed) ---------->  SIGKILL to the child's group
                  <---- the connection closed once the child has exited and been reaped

What a judge starts from: the zygote's memory after `judge.prepare()` and nothing else. The zygote runs no check,
opens no file of a course, reads no submission and holds only its listening socket and one connection per judge it
forked; it starts no thread. A child closes the zygote's sockets, so no judge can reach another or the zygote. The
grading process binds the judge's socket where the kernel can reach it (in the kernel's socket folder) and hands it
over, so the zygote's sandbox needs no folder of a submission.

What changes against a fresh sandbox per judge: the judges of one grading process share the zygote's sandbox and its
unprivileged uid (a fresh judge had a uid of its own), so they count against one RLIMIT_NPROC and could signal each
other; each is made undumpable (no ptrace, no /proc/PID/mem of another). Judges run the course's checks, never
learner code (what the kernel sends is data, autograder/checking/wire.py), so this is defence in depth given up, not
a path for learner code. Memory, CPU-time and file-size limits are per process, as before.

The grading process's side is autograder/judging/forked_judges.py. It names the zygote's socket in COURSE_JUDGE_ZYGOTE (a folder only its own user may enter); a
JudgeProcess without it, or one the zygote refuses (another sandbox policy), starts a fresh judge as before.
COURSE_JUDGE_ZYGOTE=0 in the grading process's environment turns the zygote off.

Sandboxed, a judge's environment is the sandbox's, built from nothing, and so is the zygote's. Unsandboxed (the
course's own notebooks in `make test`, `--unsafe`), one zygote serves the grading process and each judge it forks
takes the environment and folder its request names, those a fresh judge would have started with.

`python -P -m autograder.judging.judge_zygote FD POLICY` is the zygote; FD its listening socket, POLICY the sandbox
policy it runs under (COURSE_SANDBOX's JSON, "" unsandboxed); it ends when its standard input closes (the grading
process went).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys

from autograder.judging.forked_judges import MAX_MESSAGE
from autograder.processes import start_as

REAP_POLL_S = 0.2
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


# ----------------------------------------------------------------------------- the zygote process

def main(argv: list[str]) -> int:
    listener = socket.socket(fileno=int(argv[0]))
    policy = argv[1]
    from autograder.judging import judge

    judge.prepare()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)    # what a judge starts and leaves behind comes back here, to be killed
    children: dict[socket.socket, int] = {}          # connection -> its judge's pid
    killed: set[socket.socket] = set()               # told to go (or the grading side closed): not read again
    orphans: list[int] = []
    while True:
        watched = [c for c in children if c not in killed]
        tick = REAP_POLL_S if children or orphans else None       # idle, it waits without spending CPU time
        ready, _, _ = select.select([listener, sys.stdin, *watched], [], [], tick)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):       # the grading process went
            for pid in children.values():
                _kill(pid)
            return 0
        if listener in ready:
            conn, _ = listener.accept()
            pid = _fork_judge(conn, policy, listener, children)
            if pid is not None:
                children[conn] = pid
        for conn in [c for c in ready if c in children]:
            with contextlib.suppress(OSError):
                conn.recv(16)                 # "kill", or the connection closed: either way the judge goes
            _kill(children[conn])
            killed.add(conn)
        orphans = _orphans(set(children.values()))
        for pid in orphans:                   # a process a judge started, whose parent ended
            _kill(pid)
        reaped = _reap()
        for conn, pid in list(children.items()):
            if pid in reaped:                 # exited and reaped: the grading process sees the connection close
                del children[conn]
                killed.discard(conn)
                conn.close()


def _orphans(judges: set[int]) -> list[int]:
    """The zygote's children that are not judges: processes a judge started, reparented here when their parent
    ended (the zygote is the sandbox's subreaper). No judge needs a process its own ancestors no longer hold."""
    me = os.getpid()
    try:                                  # the kernel's list of this thread's children (the zygote has one thread)
        with open(f"/proc/{me}/task/{me}/children") as listed:
            return [pid for pid in map(int, listed.read().split()) if pid not in judges]
    except OSError:                       # a kernel without CONFIG_PROC_CHILDREN: every process's parent, read
        pass
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in judges:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == me:
            found.append(int(entry))
    return found


def _reap() -> set[int]:
    """Every child that has exited, waited for (judges and the orphans killed above)."""
    reaped = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.add(pid)


def _fork_judge(conn: socket.socket, policy: str, listener: socket.socket,
                children: dict[socket.socket, int]) -> int | None:
    """Fork a judge for the request on `conn`; its pid, or None when the request is refused (the reply says why)."""
    try:
        message, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 2)
        request = json.loads(message)
    except (OSError, ValueError):
        conn.close()
        return None
    if len(fds) != 2 or request.get("policy") != policy:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"error": "another sandbox policy" if len(fds) == 2 else "no sockets"}).encode())
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        _child(request, fds, [listener, conn, *children])
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.send(json.dumps({"pid": pid}).encode())
    return pid


def _child(request: dict, fds: list[int], theirs: list[socket.socket]) -> None:
    """In the forked judge: never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        _undumpable()
        for sock in theirs:
            sock.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)                # in place of the zygote's line to the grading process
        os.close(devnull)
        if request.get("env") is not None:           # unsandboxed: the environment and folder of a fresh judge
            start_as(request["env"], request.get("cwd"))
        if request.get("execution"):
            os.environ["NBGRADER_EXECUTION"] = request["execution"]
        else:
            os.environ.pop("NBGRADER_EXECUTION", None)
        from autograder.judging import judge

        control, server = (socket.socket(fileno=fd) for fd in fds)
        code = judge.serve(server, control)
    except BaseException:                  # noqa: BLE001  (the grading process sees the judge stop)
        code = 1
    finally:
        os._exit(code)


def _undumpable() -> None:
    """PR_SET_DUMPABLE 0: another process of the same uid cannot ptrace this one or read its memory."""
    _prctl(PR_SET_DUMPABLE, 0)


def _prctl(option: int, value: int) -> None:
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def _kill(pid: int) -> None:
    """SIGKILL to pid's process group (a judge leads its own) and to pid itself (an orphan may lead none)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
