"""The grading process's side of the judge zygote (autograder/judging/judge_zygote.py): starting a zygote per sandbox
policy (`zygote_env`), asking it for a judge (`ForkedJudge.fork`), and the forked judge as JudgeProcess holds it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

ENV_VAR = "COURSE_JUDGE_ZYGOTE"
MAX_MESSAGE = 1 << 16


@dataclass
class _Zygote:
    proc: subprocess.Popen
    folder: str
    path: str


_zygotes: dict[str, _Zygote] = {}
_lock = threading.Lock()


def zygote_env(env: dict[str, str]) -> dict[str, str]:
    """`env` (an nbgrader environment) with COURSE_JUDGE_ZYGOTE naming a zygote for its sandbox policy (COURSE_SANDBOX;
    none or disabled: one unsandboxed zygote), started here when there is none yet; `env` unchanged where the zygote
    is off (COURSE_JUDGE_ZYGOTE=0) or cannot start."""
    from autograder.judging import sandbox

    if os.environ.get(ENV_VAR) == "0" or env.get(ENV_VAR) == "0" or not hasattr(os, "fork"):
        return env
    policy = env.get(sandbox.ENV_VAR, "")
    try:
        policy = policy if policy and sandbox.SandboxPolicy(**json.loads(policy)).enabled else ""
    except (TypeError, ValueError):
        return env
    with _lock:
        zygote = _zygotes.get(policy)
        if zygote is None or zygote.proc.poll() is not None:
            try:
                zygote = _zygotes[policy] = _start(policy)
            except (OSError, RuntimeError):
                return env
    return {**env, ENV_VAR: zygote.path}


def unsandboxed_env() -> dict[str, str]:
    """An unsandboxed judge's environment before its NBGRADER_EXECUTION is set: this process's, on one thread, without
    the sandbox's policy or the zygote's address."""
    from autograder.judging import sandbox

    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, sandbox.ENV_VAR, "NBGRADER_EXECUTION")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _start(policy: str) -> _Zygote:
    """The zygote of a sandbox policy, in a sandbox of that policy (its environment built from nothing, as a fresh
    judge's), or unsandboxed (policy ""; each judge then takes the environment and folder its request names),
    listening on a socket in a folder of /tmp only this user may enter."""
    from autograder.judging import sandbox

    folder = tempfile.mkdtemp(prefix="judge-zygote-", dir="/tmp")       # 0700; short enough for any socket
    path = os.path.join(folder, "zygote.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    cmd = [sys.executable, "-P", "-m", "autograder.judging.judge_zygote", str(listener.fileno()), policy]
    if policy:
        argv = sandbox.bwrap_argv(sandbox.SandboxPolicy(**json.loads(policy)), cmd, submission_dir=None,
                                  socket_dir=None)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    else:
        argv, env = cmd, unsandboxed_env()
    try:
        proc = subprocess.Popen(argv, pass_fds=[listener.fileno()], cwd="/", stdin=subprocess.PIPE, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        listener.close()
    if not _zygotes:
        atexit.register(close_all)
    return _Zygote(proc, folder, path)


def close_all() -> None:
    """End every zygote this process started (its judges with it) and remove their folders."""
    import shutil

    from autograder.processes import kill_group

    with _lock:
        for zygote in _zygotes.values():
            with contextlib.suppress(OSError):
                zygote.proc.stdin.close()
            try:
                zygote.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                kill_group(zygote.proc)
                zygote.proc.wait()
            shutil.rmtree(zygote.folder, ignore_errors=True)
        _zygotes.clear()


class ForkedJudge:
    """A judge forked by the zygote, as JudgeProcess holds its process: `poll`, `wait`, `kill`."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid                      # in the zygote's PID namespace
        self.returncode: int | None = None

    @classmethod
    def fork(cls, address: str, policy: str, execution: str | None, fds: list[int], timeout: float, *,
             env: dict[str, str] | None = None, cwd: str | None = None) -> "ForkedJudge":
        """Ask the zygote at `address` for a judge serving `fds` (its control line, the kernel's listening socket);
        unsandboxed (policy ""), the judge's environment and folder (`env`, `cwd`), as a fresh one would have them.
        RuntimeError when it cannot (no zygote, another policy), and the caller starts a fresh judge."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.settimeout(timeout)
        try:
            conn.connect(address)
            request = {"policy": policy, "execution": execution, "env": env, "cwd": cwd}
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            reply = json.loads(conn.recv(MAX_MESSAGE) or b"{}")
        except (OSError, ValueError) as exc:
            conn.close()
            raise RuntimeError(f"the judge zygote did not answer: {exc}") from None
        if "pid" not in reply:
            conn.close()
            raise RuntimeError(f"the judge zygote refused: {reply.get('error', 'no reason')}")
        conn.settimeout(None)
        return cls(conn, int(reply["pid"]))

    def poll(self) -> int | None:
        """None while the judge runs; 0 once the zygote closed the connection (the judge exited)."""
        if self.returncode is None:
            ready, _, _ = select.select([self.conn], [], [], 0)
            if ready and not self._read():
                self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        ready, _, _ = select.select([self.conn], [], [], timeout)
        while self.returncode is None:
            if not ready:
                raise subprocess.TimeoutExpired(f"judge {self.pid}", timeout or 0)
            if not self._read():
                self.returncode = 0
                break
            ready, _, _ = select.select([self.conn], [], [], timeout)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(b"kill")

    def _read(self) -> bytes:
        try:
            return self.conn.recv(16)
        except OSError:
            return b""


