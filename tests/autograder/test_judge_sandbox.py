"""Where the kernel is sandboxed (COURSE_SANDBOX set, as under autograde) the judge is too: a test cell run there
cannot read a file outside, write beside it, see the instructor's environment, reach the host's loopback or leave
a process behind (autograder/judging/judge.py's JudgeProcess, autograder/judging/sandbox.py's bubblewrap policy)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from autograder.checking import framing
from autograder.judging import forked_judges, sandbox
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
            with contextlib.suppress(framing.ChannelClosed, OSError):     # a judge killed while it served
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
@pytest.mark.parametrize("forked", [False, True], ids=["fresh", "forked by the zygote"])
def test_a_test_cell_in_the_sandboxed_judge_reaches_nothing_outside(tmp_path, monkeypatch, forked):
    canary = tmp_path / "canary.txt"
    canary.write_text("instructor's secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    policy = sandbox.SandboxPolicy(cpu_seconds=120).to_env()
    monkeypatch.setenv(sandbox.ENV_VAR, policy)
    monkeypatch.delenv(forked_judges.ENV_VAR, raising=False)
    if forked:       # the zygote starts before the instructor's secret is set: the judge could not see it anyway
        monkeypatch.setenv(forked_judges.ENV_VAR, forked_judges.zygote_env({sandbox.ENV_VAR: policy})[forked_judges.ENV_VAR])
    monkeypatch.setenv("INSTRUCTOR_SECRET", "hunter2")
    socket_dir = tempfile.mkdtemp(prefix="kernel-")     # in /tmp, as the kernel's: a Unix socket path is <= 107 bytes
    judge = JudgeProcess(socket_dir)
    try:
        assert judge.sandboxed and judge.forked == forked
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


def _within(seconds: float, condition) -> bool:
    """Whether `condition()` holds within `seconds` (asked every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(condition())


def _judged(judge: JudgeProcess, source: str, token: str) -> dict:
    kernel = _serve_once(judge.path, token)
    judge.run(source, token, timeout=120)
    kernel.join(180)
    return judge.result(wait=120)


def _judge_one_cell(source: str, token: str, cwd: str | None = None) -> tuple[JudgeProcess, dict]:
    """A judge started in a kernel's socket folder of its own, one cell judged, the judge closed: (judge, result).
    A forked judge's socket, which the grading process bound, is gone once it is closed."""
    socket_dir = tempfile.mkdtemp(prefix="kernel-")
    try:
        judge = JudgeProcess(socket_dir, cwd=cwd)
        try:
            result = _judged(judge, source, token)
        finally:
            judge.close()
        assert not (judge.forked and Path(judge.path).exists()), "the forked judge's socket was left behind"
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    return judge, result


@pytest.fixture
def zygote(monkeypatch):
    """A zygote of the sandbox policy this test grades under, named in the environment as autograde names it."""
    policy = sandbox.SandboxPolicy(cpu_seconds=120).to_env()
    monkeypatch.setenv(sandbox.ENV_VAR, policy)
    address = forked_judges.zygote_env({sandbox.ENV_VAR: policy})[forked_judges.ENV_VAR]
    monkeypatch.setenv(forked_judges.ENV_VAR, address)
    return address


@pytest.mark.slow
def test_judges_forked_by_one_zygote_hand_each_other_nothing(zygote):
    """What one forked judge does to its modules (a check's constant, a module it imported) the next one, forked
    by the same zygote, does not see: each starts from the zygote's memory, which never ran a cell."""
    first, seen = _judge_one_cell("import os, json, autograder.harness as h\nh.SPEED_ROUNDS = 99\n"
                                  "import autograder.lab00\nprint(json.dumps([os.getpid(), h.SPEED_ROUNDS]))", "one")
    second, later = _judge_one_cell("import os, sys, json, autograder.harness as h\n"
                                    "print(json.dumps([os.getpid(), h.SPEED_ROUNDS, 'autograder.lab00' in sys.modules]))",
                                    "two")
    assert first.forked and second.forked
    assert seen["error"] is None and later["error"] is None, (seen, later)
    (pid_one, rounds_one), (pid_two, rounds_two, lab00_there) = (json.loads(r["stdout"].splitlines()[-1])
                                                                 for r in (seen, later))
    assert rounds_one == 99 and pid_one != pid_two
    assert rounds_two != 99 and not lab00_there, "a forked judge saw what the one before it did"


@pytest.mark.slow
def test_a_forked_judge_that_never_answers_is_killed_with_what_it_started(zygote):
    """A judge stuck in a cell is killed (JudgeProcess.kill, as the grader does after a JudgeTimeout), and so is a
    process it started in a session of its own; the zygote goes on forking judges."""
    socket_dir = tempfile.mkdtemp(prefix="kernel-")
    try:
        stuck = JudgeProcess(socket_dir)
        kernel = _serve_once(stuck.path, "stuck")
        stuck.run("import subprocess, sys\n"
                  f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {MARK!r}], "
                  "start_new_session=True)\nwhile True:\n    pass\n", "stuck", timeout=120)
        assert _within(60, _processes_marked), "the stuck judge's process never started"
        stuck.kill()
        kernel.join(10)
        assert _within(10, lambda: not _processes_marked()), "a process the stuck judge started outlived it"
        assert stuck.proc.poll() is not None
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    after, result = _judge_one_cell("print('still judging')", "after")
    assert after.forked and result["error"] is None and "still judging" in result["stdout"], result


@pytest.mark.slow
def test_a_zygote_of_another_policy_is_not_used_and_a_fresh_judge_starts(zygote, monkeypatch):
    monkeypatch.setenv(sandbox.ENV_VAR, sandbox.SandboxPolicy(cpu_seconds=121).to_env())
    judge, result = _judge_one_cell("print('fresh')", "fresh")
    assert judge.sandboxed and not judge.forked
    assert result["error"] is None and "fresh" in result["stdout"], result


def test_the_zygote_ends_with_the_process_that_started_it():
    """Its line to the grading process closes when that process ends, and the zygote (its sandbox) goes with it,
    its folder removed."""
    import subprocess
    import sys

    script = ("import json, os\nfrom autograder.judging import forked_judges, sandbox\n"
              "policy = sandbox.SandboxPolicy(cpu_seconds=120).to_env()\n"
              "address = forked_judges.zygote_env({sandbox.ENV_VAR: policy})[forked_judges.ENV_VAR]\n"
              "zygote = forked_judges._zygotes[policy]\n"
              "print(json.dumps([zygote.proc.pid, address]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != forked_judges.ENV_VAR})
    pid, address = json.loads(out.stdout.strip().splitlines()[-1])
    assert _within(10, lambda: not _running(pid)), "the zygote outlived the process that started it"
    assert not Path(address).parent.exists(), "the zygote's folder was left behind"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
def test_an_unsandboxed_forked_judge_starts_where_and_as_a_fresh_one_would(tmp_path, monkeypatch):
    """Without a sandbox (the course's own notebooks under `make test`, `--unsafe`) one zygote serves the grading
    process, and each judge it forks takes the environment and folder of its request: a variable set after the
    zygote started is seen, the judge's folder is the one JudgeProcess names, grading runs as autograde."""
    monkeypatch.delenv(sandbox.ENV_VAR, raising=False)
    monkeypatch.delenv(forked_judges.ENV_VAR, raising=False)
    monkeypatch.setenv(forked_judges.ENV_VAR, forked_judges.zygote_env({})[forked_judges.ENV_VAR])
    monkeypatch.setenv("COURSE_PROBE_ZYGOTE", "set after the zygote started")
    judge, result = _judge_one_cell("import json, os, sys\nprint(json.dumps([os.environ.get('COURSE_PROBE_ZYGOTE'), "
                                    "os.getcwd(), os.environ.get('NBGRADER_EXECUTION'), "
                                    "os.environ.get('OMP_NUM_THREADS')]))", "plain", cwd=str(tmp_path))
    assert judge.forked and not judge.sandboxed
    assert result["error"] is None, result
    probe, cwd, execution, threads = json.loads(result["stdout"].strip().splitlines()[-1])
    assert probe == "set after the zygote started" and Path(cwd) == tmp_path.resolve()
    assert execution == "autograde" and threads == "1"
