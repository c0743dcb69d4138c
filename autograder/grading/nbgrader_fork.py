"""`nbgrader` commands forked from a process that imported nbgrader once.

A grading runs nbgrader many times (generate_assignment once per assignment, autograde once per submission, then
feedback and export), and each `python -m nbgrader` spent about 1.1 s of its 1.4-2 s importing nbgrader, nbconvert,
SQLAlchemy and Jupyter before it read a file. A fork server imports them once; every command is then a fork of it:

    grading process                              fork server (nbgrader imported; nothing else done)
    run(args, cwd, env) --- request + pipe ----> fork --> child: own session, cwd, environment, argv;
                                                                 stdout and stderr the pipe; `python -m nbgrader`
      reads the child's output from the pipe <------------------
      <--------------- {"pid"}, then {"rc"} ---- waits for the child

What a child starts from: the server's memory after the imports, and nothing else (the server never runs a command,
opens no file, database or socket besides its line to the grading process, starts no thread). A child is then what
`python -m nbgrader ARGS` with that environment would be: `PYTHONPATH` and `PYTHONWARNINGS` are applied as the
interpreter applies them at start. Learner code never runs in either process (it runs in the sandboxed kernel
that the child's nbgrader starts), so nothing of one submission's grading reaches the next one's.

One server serves one command at a time; `run` takes an idle one or starts another (two grading jobs at once: two
servers), and they end with the process that started them (their line closes). COURSE_NBGRADER_FORK=0, or a server
that cannot start, runs `python -m nbgrader` as a subprocess instead (`nbgrader_runs.run_nbgrader`).

`python -m autograder.grading.nbgrader_fork FD` is the server; FD its end of the line (a SOCK_SEQPACKET socket).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Callable

from autograder.processes import kill_session, start_as

PRELOAD = ("nbgrader.apps.nbgraderapp", "nbgrader.apps.autogradeapp", "nbgrader.apps.generateassignmentapp",
           "nbgrader.apps.generatefeedbackapp", "nbgrader.apps.exportapp", "nbclient", "jupyter_client",
           "sqlalchemy.dialects.sqlite")
MAX_MESSAGE = 1 << 20          # one request: argv, folder and environment as JSON
START_TIMEOUT_S = 60


# ----------------------------------------------------------------------------- the server process

def main(argv: list[str]) -> int:
    line = socket.socket(fileno=int(argv[0]))
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    os.chdir("/")                          # it holds no folder of a grading
    line.send(json.dumps({"ready": True}).encode())
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(line, MAX_MESSAGE, 1)
        except OSError:
            return 0
        if not message:                    # the grading process closed the line (or died)
            return 0
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            line.send(json.dumps({"error": "a request comes with exactly one descriptor (its output)"}).encode())
            continue
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            line.close()
            _child(request, fds[0])        # never returns
        os.close(fds[0])
        line.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        line.send(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict, out: int) -> None:
    """`python -m nbgrader ARGS` in this forked process: its own session, folder, environment and output."""
    code = 1
    try:
        os.setsid()
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        start_as(request["env"], request["cwd"])
        sys.argv = ["nbgrader", *request["args"]]
        import runpy

        runpy.run_module("nbgrader", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:                                    # noqa: BLE001  (reported as nbgrader would)
        import traceback

        traceback.print_exc()
    finally:
        for finish in (atexit._run_exitfuncs, sys.stdout.flush, sys.stderr.flush):    # as the interpreter's exit
            with contextlib.suppress(BaseException):
                finish()
        os._exit(code)


# ----------------------------------------------------------------------------- the grading process's side

class NotStarted(RuntimeError):
    """The fork server could not take a command (nothing ran): run it as a subprocess instead."""


class ForkServer:
    """One fork server: `run` one nbgrader command at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        own = {k: v for k, v in env.items() if k != "PYTHONPATH"}      # each command's own PYTHONPATH, not the first's
        self.proc = subprocess.Popen([sys.executable, "-m", "autograder.grading.nbgrader_fork", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=own, cwd="/", stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.line = ours
        self.line.settimeout(START_TIMEOUT_S)
        try:
            said = self._receive()
        except (OSError, ValueError) as exc:
            self.close()
            raise NotStarted(f"the nbgrader fork server did not start: {exc}") from None
        if not said.get("ready"):
            self.close()
            raise NotStarted("the nbgrader fork server did not start")
        self.line.settimeout(None)

    def _receive(self) -> dict:
        message = self.line.recv(MAX_MESSAGE)
        if not message:
            raise OSError("the fork server's line closed")
        return json.loads(message)

    def run(self, args: list[str], cwd: str, env: dict[str, str], timeout: float | None,
            on_line: Callable[[str], None]) -> int | None:
        """Run `nbgrader ARGS` in cwd with env; on_line gets each line of its output as it comes. The exit code,
        or None when it ran past `timeout` (then it and every process it started are killed). NotStarted when
        the server did not take the command; a server that stops during it: exit code 1."""
        read, write = os.pipe()
        try:
            try:
                socket.send_fds(self.line, [json.dumps({"args": args, "cwd": cwd, "env": env}).encode()], [write])
            finally:
                os.close(write)
            reader = threading.Thread(target=_read_lines, args=(read, on_line), daemon=True)
            reader.start()
        except BaseException:
            os.close(read)
            raise
        try:
            said = self._receive()
            pid = said["pid"]
        except (OSError, ValueError, KeyError) as exc:
            reader.join(timeout=10)
            raise NotStarted(f"the nbgrader fork server did not start the command: {exc}") from None
        self.line.settimeout(timeout)
        try:
            rc = self._receive()["rc"]
        except TimeoutError:
            kill_session(pid)
            self.line.settimeout(None)
            with contextlib.suppress(OSError, ValueError):
                self._receive()               # the server reaped it
            reader.join(timeout=10)
            return None
        except (OSError, ValueError, KeyError):   # the server stopped during the command
            kill_session(pid)
            reader.join(timeout=10)
            return 1
        except BaseException:                    # interrupted (Ctrl-C, a test's timeout): leave no kernel behind
            kill_session(pid)
            raise
        finally:
            self.line.settimeout(None)
        reader.join()
        return rc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.line.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read_lines(fd: int, on_line: Callable[[str], None]) -> None:
    with open(fd, encoding="utf-8", errors="replace") as stream:
        for line in stream:
            on_line(line)


_idle: list[ForkServer] = []
_lock = threading.Lock()


def run(args: list[str], cwd: str, env: dict[str, str], timeout: float | None,
        on_line: Callable[[str], None]) -> int | None:
    """ForkServer.run on an idle server (or a new one, started with env). NotStarted when none could take it."""
    with _lock:
        server = _idle.pop() if _idle else None
    if server is None or server.proc.poll() is not None:
        try:
            server = ForkServer(env)
        except (OSError, RuntimeError) as exc:
            raise NotStarted(str(exc)) from None
    try:
        rc = server.run(args, cwd, env, timeout, on_line)
    except BaseException:
        server.close()                    # it failed, or was interrupted mid-command (its reply may still come)
        raise
    with _lock:
        _idle.append(server)
    return rc


@atexit.register
def _close_all() -> None:
    with _lock:
        servers, _idle[:] = list(_idle), []
    for server in servers:
        server.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
