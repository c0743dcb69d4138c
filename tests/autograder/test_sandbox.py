"""The grading sandbox (bubblewrap), submission intake and the gradebook guard, without nbgrader runs.

A few seconds in all: each sandbox test starts one short Python inside bwrap.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from autograder.grading import gradebook_guard, intake
from autograder.judging import sandbox

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_SRC = REPO_ROOT / "tests" / "fixtures" / "course" / "solutions" / "ex_fixture" / "ex_fixture.ipynb"

needs_sandbox = pytest.mark.skipif(sandbox.probe() is not None, reason=f"no sandbox here: {sandbox.probe()}")


def _in_sandbox(code: str, policy: sandbox.SandboxPolicy | None = None, submission: Path | None = None):
    with tempfile.TemporaryDirectory(prefix="sock-") as sock:
        uid = sandbox.sandbox_uid()
        if os.geteuid() == 0:
            os.chown(sock, uid, uid)
        cmd = sandbox.bwrap_argv(policy or sandbox.SandboxPolicy(), [sys.executable, "-c", code],
                                 submission_dir=str(submission) if submission else None, socket_dir=sock, uid=uid)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@needs_sandbox
def test_sandbox_hides_the_host_and_has_no_network(tmp_path):
    secret = tmp_path / "gradebook.db"
    secret.write_text("secret")
    tmp_path.chmod(0o755)             # the submission folder the sandbox copies (nbgrader's are 0755)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    os.environ["INSTRUCTOR_TOKEN"] = "do-not-leak"
    try:
        code = f"""
import json, os, socket
out = {{"secret": os.path.exists({str(secret)!r}), "repo_solutions": os.path.exists({str(REPO_ROOT / 'solutions')!r}),
       "env": sorted(os.environ), "uid": os.getuid(), "cwd": os.getcwd(), "pids": len(os.listdir('/proc'))}}
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2); out["net"] = True
except OSError:
    out["net"] = False
try:
    open("/usr/evil", "w"); out["usr_writable"] = True
except OSError:
    out["usr_writable"] = False
print(json.dumps(out))
"""
        run = _in_sandbox(code, submission=tmp_path)
    finally:
        os.environ.pop("INSTRUCTOR_TOKEN")
        srv.close()
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["secret"] is False and out["repo_solutions"] is False
    assert out["net"] is False and out["usr_writable"] is False
    assert "INSTRUCTOR_TOKEN" not in out["env"] and out["cwd"] == "/tmp/work"
    assert out["uid"] != 0 or os.geteuid() != 0


@needs_sandbox
def test_a_socket_bound_alone_accepts_connections_and_nothing_can_be_written_beside_it():
    """The witness's view of the judge's folder (autograder/judging/witness.py): its socket, read-only, and nothing
    else, even where the folder is writable by everyone (as the judge's folder is for a kernel of the same user)."""
    with tempfile.TemporaryDirectory(prefix="sock-", dir="/tmp") as folder:
        os.chmod(folder, 0o777)
        (Path(folder) / "left-by-the-kernel.py").write_text("reference = 1")
        path = os.path.join(folder, "judge.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            os.chmod(path, 0o777)
            server.listen(1)
            code = ("import os, socket\n"
                    f"s = socket.socket(socket.AF_UNIX); s.connect({path!r}); s.sendall(b'hello'); s.close()\n"
                    f"print(sorted(os.listdir({folder!r})))\n"
                    "try:\n"
                    f"    open(os.path.join({folder!r}, 'stash.py'), 'w').write('x')\n"
                    "    print('written')\n"
                    "except OSError as exc:\n"
                    "    print('refused', type(exc).__name__)\n")
            cmd = sandbox.bwrap_argv(sandbox.SandboxPolicy(), [sys.executable, "-c", code], submission_dir=None,
                                     socket_dir=None, socket_file=path)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            server.settimeout(60)
            conn, _ = server.accept()
            with conn:
                assert conn.recv(5) == b"hello"
            out, err = proc.communicate(timeout=120)
        assert out.splitlines() == ["['judge.sock']", "refused PermissionError"] or \
            out.splitlines() == ["['judge.sock']", "refused OSError"], (out, err)
        assert sorted(p.name for p in Path(folder).iterdir()) == ["judge.sock", "left-by-the-kernel.py"]


@needs_sandbox
def test_sandbox_limits_memory_and_disk():
    policy = sandbox.SandboxPolicy(memory_bytes=1 << 30, tmp_bytes=16 << 20)
    code = """
try:
    bytearray(1 << 30); print("mem-ok")
except MemoryError:
    print("mem-refused")
try:
    open("/tmp/big", "wb").write(b"x" * (32 << 20)); print("disk-ok")
except OSError as e:
    print("disk-refused", e.errno)
"""
    run = _in_sandbox(code, policy)
    assert "mem-refused" in run.stdout and "disk-refused" in run.stdout, run.stdout + run.stderr


def test_batch_refuses_without_a_sandbox_unless_unsafe(tmp_path, monkeypatch):
    from autograder.grading import batch

    monkeypatch.setattr(sandbox, "probe", lambda policy=None: "user namespaces disabled (test)")
    (tmp_path / "submitted" / "ann" / "ex_fixture").mkdir(parents=True)
    with pytest.raises(batch.SandboxRefused, match="user namespaces disabled.*--unsafe"):
        batch.autograde(tmp_path, ["ex_fixture"], ["ann"], log=lambda line: None, progress=False)
    assert not (tmp_path / "gradebook.db").exists()        # refused before touching anything


def test_no_bwrap_is_reported(monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP", "/nonexistent/bwrap")
    assert "not installed" in sandbox.probe(sandbox.SandboxPolicy(nproc=7))


def test_intake_leaves_out_links_and_neutralises_the_notebook(tmp_path):
    released = nbformat.read(str(FIXTURE_SRC), as_version=4)
    sub = tmp_path / "sub"
    (sub / "data").mkdir(parents=True)
    nb = json.loads(FIXTURE_SRC.read_text())
    nb["metadata"]["kernelspec"]["name"] = "evil"
    nb["cells"][2]["metadata"]["tags"] = ["skip-execution"]
    nb["cells"][2]["metadata"]["nbgrader"]["points"] = 100
    nb["cells"].append({"cell_type": "code", "id": "x", "metadata": {"nbgrader": {"grade": True, "grade_id": "bonus",
                        "points": 9, "solution": False, "locked": True, "schema_version": 3}},
                        "source": "pass", "outputs": [], "execution_count": None})
    (sub / "ex_fixture.ipynb").write_text(json.dumps(nb))
    (sub / "data" / "ok.txt").write_text("fine")
    (sub / "link").symlink_to("/etc/passwd")
    os.link(sub / "data" / "ok.txt", sub / "hard.txt")
    (sub / "timestamp.txt").write_text("not a time")
    os.mkfifo(sub / "pipe")
    notes = intake.stage_submission(sub, tmp_path / "out", {"ex_fixture.ipynb": released})
    staged = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*"))
    assert staged == ["data", "ex_fixture.ipynb"]          # data/ok.txt has a second name: left out too
    text = " | ".join(notes)
    for expected in ("link (a symbolic link)", "hard link", "pipe (not a plain file", "timestamp.txt",
                     "kernelspec 'evil' ignored", "cell tags dropped", "bonus"):
        assert expected in text, (expected, notes)
    out = nbformat.read(str(tmp_path / "out" / "ex_fixture.ipynb"), as_version=4)
    assert out.metadata.kernelspec.name == released.metadata.kernelspec.name
    assert all("tags" not in c.metadata for c in out.cells)
    points = [c.metadata.nbgrader.get("points") for c in out.cells if "nbgrader" in c.metadata]
    assert 100 not in points and 9 not in points


def _gradebook(path: Path) -> str:
    from nbgrader.api import Gradebook

    url = f"sqlite:///{path}"
    with Gradebook(url) as gb:
        gb.add_assignment("a")
        gb.add_notebook("n", "a")
        gb.add_grade_cell("c", "n", "a", max_score=2, cell_type="code")
        gb.add_solution_cell("s", "n", "a")
        for student in ("ann", "bob"):
            gb.add_student(student)
            gb.add_submission("a", student)
    return url


def test_guard_detects_restores_and_scopes_changes(tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])  # alembic

    db = tmp_path / "gradebook.db"
    _gradebook(db)
    guard = gradebook_guard.Guard(db)
    assert guard.intact()
    with sqlite3.connect(db) as con:                        # someone else zeroes bob's score
        con.execute("UPDATE grade SET manual_score = 0")
    assert not guard.intact()
    guard.restore()
    assert guard.intact()
    db.unlink()                                             # or deletes the file
    assert not guard.intact()
    guard.restore()
    assert guard.intact()
    before = gradebook_guard.manual_scores(db, "ann")
    with sqlite3.connect(db) as con:                        # recording ann must touch only ann's rows
        con.execute("UPDATE grade SET auto_score = 2 WHERE notebook_id IN (SELECT n.id FROM submitted_notebook n "
                    "JOIN submitted_assignment a ON n.assignment_id = a.id WHERE a.student_id = 'ann')")
    assert guard.check_record("ann", before) == []
    with sqlite3.connect(db) as con:
        con.execute("UPDATE grade SET manual_score = 2")
    problems = guard.check_record("ann", before)
    assert any("other students" in p for p in problems) and any("manual score" in p for p in problems)
    assert gradebook_guard.backup(db, tmp_path / "copy.db").exists()
    guard.close()


def test_the_releases_own_tags_are_not_reported_as_dropped():
    """A learner's notebook carries the release's `raises-exception` tags: dropping them is no news (issue 40:
    "cell tags dropped from 24 cell(s)" on every learner's own grading); a tag of their own still is."""
    released = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("1 / 0")
    cell.metadata["tags"] = ["raises-exception"]
    released.cells = [cell]
    notes: list[str] = []
    intake.neutralise_notebook(nbformat.writes(released), released, notes)
    assert not any("tags" in n for n in notes), notes
    mine = nbformat.v4.new_notebook()
    mine.cells = [nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception", "skip-execution"]})]
    intake.neutralise_notebook(nbformat.writes(mine), released, notes)
    assert any("cell tags dropped from 1 cell(s)" in n for n in notes), notes


WITNESS_LEFTOVERS = r"""
import ctypes, json, os, resource, signal, sys, time
from autograder.judging import sandbox_reset, witness

libc = ctypes.CDLL(None, use_errno=True)
resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))      # as the witness process sets it before any child
home, work = os.environ["HOME"], os.getcwd()
witness._set_dumpable(False)
baseline = sandbox_reset.snapshot()
tmp_start = sorted(os.listdir("/tmp"))
child = os.fork()
if child == 0:              # a witness child leaving what it can for the next one
    witness._set_dumpable(True)
    try:
        open(f"/proc/{os.getppid()}/mem", "rb").close()
        open("/tmp/mem", "w").write("read")
    except OSError as exc:
        open("/tmp/mem", "w").write(type(exc).__name__)
    open("/tmp/stash.py", "w").write("reference = 1")
    open(os.path.join(work, "answer.py"), "w").write("reference = 1")
    os.makedirs("/tmp/locked/inner"); open("/tmp/locked/inner/stash.py", "w").write("x")
    os.chmod("/tmp/locked/inner", 0); os.chmod("/tmp/locked", 0)
    os.symlink("/usr", "/tmp/link")
    open("/dev/shm/stash", "w").write("reference = 1")
    open(os.path.join(home, "stash.py"), "w").write("reference = 1")
    os.chmod(home, 0)
    for folder in sys.argv[1:]:                               # where bubblewrap bound the judge's socket
        try:
            open(os.path.join(folder, "stash.py"), "w").write("reference = 1")
        except OSError:
            pass
    libc.shmget(0x5EED, 4096, 0o1600)                        # IPC_CREAT | 0600
    libc.semget(0x5EED, 1, 0o1600)
    libc.msgget(0x5EED, 0o1600)
    queue = libc.mq_open(b"/stash", os.O_CREAT | os.O_RDWR, 0o600, None)
    open("/tmp/mq", "w").write(str(queue))
    if os.fork() == 0:                                       # a process that outlives it, in a session of its own
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        os._exit(0)
    time.sleep(0.2)
    os._exit(0)
os.waitpid(child, 0)
queue, mem = open("/tmp/mq").read(), open("/tmp/mem").read()
before = sorted(p for p in os.listdir("/proc") if p.isdigit())
sysv_before = {k: len(open(f"/proc/sysvipc/{k}").read().splitlines()[1:]) for k in ("shm", "sem", "msg")}
tmp_before, shm_before = sorted(os.listdir("/tmp")), os.listdir("/dev/shm")
witness._clear(child, True, baseline, work)
print(json.dumps({
    "queue": queue, "mem": mem,
    "processes_before": len(before), "sysv_before": sysv_before, "tmp_before": tmp_before, "shm_before": shm_before,
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "me": os.getpid(),
    "tmp": sorted(os.listdir("/tmp")), "work": sorted(os.listdir(work)), "shm": os.listdir("/dev/shm"),
    "home": os.listdir(home), "tmp_start": tmp_start, "socket_folder": sorted(os.listdir(sys.argv[1])),
    "sysv": {k: open(f"/proc/sysvipc/{k}").read().splitlines()[1:] for k in ("shm", "sem", "msg")},
    "cwd": os.getcwd(),
}))
"""


@needs_sandbox
def test_what_a_witness_child_leaves_is_gone_before_the_next(tmp_path):
    """The witness process forks one child per test cell (autograder/judging/witness.py); between two, it clears
    every channel one child could leave the next a reference it lacks: processes (one that ignores SIGTERM in a
    session of its own), files in /tmp (in folders made unreadable, in the home folder, beside the judge's socket,
    which stays bound in the folder bubblewrap made for it), the submission's copy in /tmp/work, /dev/shm,
    System V shared memory, semaphores and message queues; a POSIX message queue cannot be made at all, nor
    the witness process's memory opened."""
    (tmp_path / "notebook.ipynb").write_text("{}")
    tmp_path.chmod(0o755)
    with tempfile.TemporaryDirectory(prefix="sock-", dir="/tmp") as folder:     # inside the sandbox's /tmp too
        path = os.path.join(folder, "judge.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            cmd = sandbox.bwrap_argv(sandbox.SandboxPolicy(), [sys.executable, "-c", WITNESS_LEFTOVERS, folder],
                                     submission_dir=str(tmp_path), socket_dir=None, socket_file=path)
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["queue"] == "-1", "a POSIX message queue was created"
    assert out["mem"] == "PermissionError", "a child could open its parent's memory"
    assert out["sysv_before"] == {"shm": 1, "sem": 1, "msg": 1}, "the child's System V objects were not made"
    assert {"stash.py", "locked", "link"} <= set(out["tmp_before"]) and out["shm_before"] == ["stash"]
    assert out["processes_before"] >= 3 and out["processes"] == sorted([1, out["me"]])
    assert {"home", "work", Path(folder).name} <= set(out["tmp_start"])     # and bubblewrap's folders for mounts
    assert out["tmp"] == out["tmp_start"] and out["work"] == ["notebook.ipynb"]
    assert out["shm"] == [] and out["home"] == [] and out["socket_folder"] == ["judge.sock"]
    assert out["sysv"] == {"shm": [], "sem": [], "msg": []}
    assert out["cwd"] == "/tmp/work"
