"""Where the kernel is sandboxed (COURSE_SANDBOX set, as under autograde) the judge is too: a test cell run there
cannot read a file outside, write beside it, see the instructor's environment, reach the host's loopback or leave
a process behind (autograder/judging/judge.py's JudgeProcess, autograder/judging/sandbox.py's bubblewrap policy)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from autograder.judging import sandbox
from autograder.judging.judge import JudgeProcess
from autograder.judging.observe import kernel_endpoint

pytestmark = pytest.mark.skipif(sandbox.probe() is not None and not os.environ.get("CI"),
                                reason=f"no grading sandbox here ({sandbox.probe()})")

MARK = "judge-sandbox-survivor-4b1e"

CELL = """
import json, os, socket, subprocess, sys
seen = {{}}
try:
    seen["read"] = open({canary!r}).read()
except OSError as exc:
    seen["read"] = type(exc).__name__
try:
    open({written!r}, "w").write("x")
    seen["write"] = "written"
except OSError as exc:
    seen["write"] = type(exc).__name__
seen["secret"] = os.environ.get("INSTRUCTOR_SECRET")
seen["uid"] = os.getuid()
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    seen["loopback"] = "connected"
except OSError as exc:
    seen["loopback"] = type(exc).__name__
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {mark!r}], start_new_session=True)
print(json.dumps(seen))
"""


def _serve_once(path: str, token: str) -> threading.Thread:
    """A stand-in kernel: connect to the judge, say which cell it serves, answer until the verdict."""
    def run() -> None:
        for _ in range(600):
            if os.path.exists(path):
                break
            time.sleep(0.1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            endpoint = kernel_endpoint(sock, {})
            endpoint.hello(token)
            endpoint.serve()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _processes_marked() -> list[str]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if MARK.encode() in cmdline.read_bytes():
                out.append(cmdline.parent.name)
        except OSError:
            continue
    return out


@pytest.mark.slow
def test_a_test_cell_in_the_sandboxed_judge_reaches_nothing_outside(tmp_path, monkeypatch):
    canary = tmp_path / "canary.txt"
    canary.write_text("instructor's secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    monkeypatch.setenv(sandbox.ENV_VAR, sandbox.SandboxPolicy(cpu_seconds=120).to_env())
    monkeypatch.setenv("INSTRUCTOR_SECRET", "hunter2")
    socket_dir = tempfile.mkdtemp(prefix="kernel-")     # in /tmp, as the kernel's: a Unix socket path is <= 107 bytes
    judge = JudgeProcess(socket_dir)
    try:
        assert judge.sandboxed
        source = CELL.format(canary=str(canary), written=str(tmp_path / "written"),
                             port=listener.getsockname()[1], mark=MARK)
        kernel = _serve_once(judge.path, "t0k3n")
        judge.run(source, "t0k3n", timeout=120)
        kernel.join(180)
        result = judge.result(wait=120)
    finally:
        judge.close()
        listener.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert result["error"] is None, result
    seen = json.loads(result["stdout"].strip().splitlines()[-1])
    assert seen["read"] in ("FileNotFoundError", "PermissionError"), seen
    assert seen["write"] in ("FileNotFoundError", "PermissionError", "OSError"), seen
    assert not (tmp_path / "written").exists()
    assert seen["secret"] is None, "the judge saw the instructor's environment"
    assert seen["loopback"] != "connected", "the judge reached the host's loopback"
    if os.geteuid() == 0:
        assert seen["uid"] != 0, "the judge ran as root"
    time.sleep(1)
    assert _processes_marked() == [], "a process the judge started outlived it"
