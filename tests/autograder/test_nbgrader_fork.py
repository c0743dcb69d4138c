"""nbgrader commands forked from a process that imported nbgrader (autograder/grading/nbgrader_fork.py): each one is
what `python -m nbgrader` would be (its folder, environment, PYTHONPATH, output, exit code), a command past its time
is killed with what it started, one command leaves nothing to the next, and without a fork server the command runs
as a subprocess with the same result.

The course folder's nbgrader_config.py (which nbgrader executes at start) reports what the command sees."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from autograder.grading import nbgrader_fork
from autograder.grading.nbgrader_runs import nbgrader_env, run_nbgrader

REPORT = '''\
import os, sys, time
print("SEEN", os.getcwd(), os.environ.get("COURSE_PROBE"), os.environ.get("LEFT_BY_EARLIER"), "{extra}" in sys.path,
      os.getsid(0) == os.getpid(), flush=True)
os.environ["LEFT_BY_EARLIER"] = "yes"
sys.modules["left_by_earlier"] = sys
if os.environ.get("COURSE_PROBE") == "sleep":
    open("started", "w").close()
    time.sleep(120)
'''


@pytest.fixture
def course(tmp_path) -> Path:
    extra = tmp_path / "on-pythonpath"
    extra.mkdir()
    folder = tmp_path / "course"
    folder.mkdir()
    (folder / "nbgrader_config.py").write_text(REPORT.format(extra=extra))
    return folder


def _seen(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("SEEN "))
    return line.split()[1:]


def _env(course: Path, probe: str) -> dict[str, str]:
    env = nbgrader_env({"COURSE_PROBE": probe, "PYTHONPATH": str(course.parent / "on-pythonpath")})
    env.pop("LEFT_BY_EARLIER", None)
    return env


def _db(course: Path) -> str:
    return f"--db=sqlite:///{course / 'gradebook.db'}"


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "subprocess"])
def test_a_command_sees_its_folder_environment_and_pythonpath(course, forked, monkeypatch):
    monkeypatch.setenv("COURSE_NBGRADER_FORK", "1" if forked else "0")
    rc, out = run_nbgrader(["db", "student", "list", _db(course)], course, env=_env(course, "here"), timeout=120)
    assert rc == 0, out
    assert _seen(out) == [str(course.resolve()), "here", "None", "True", "True"], out
    rc, out = run_nbgrader(["db", "student", "remove", "nobody", _db(course)], course, env=_env(course, "here"),
                           timeout=120)
    assert rc == 1 and "nobody" in out, out        # nbgrader's own exit code and message


def test_one_command_leaves_nothing_to_the_next_and_the_server_is_reused(course, monkeypatch):
    monkeypatch.setenv("COURSE_NBGRADER_FORK", "1")
    nbgrader_fork._close_all()
    for _ in range(2):          # the first command set LEFT_BY_EARLIER in its process; the second does not see it
        rc, out = run_nbgrader(["db", "student", "list", _db(course)], course, env=_env(course, "again"), timeout=120)
        assert rc == 0 and _seen(out)[2] == "None", out
    assert len(nbgrader_fork._idle) == 1, "the second command was not a fork of the first command's server"


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "subprocess"])
def test_a_command_past_its_time_is_killed_with_its_session(course, forked, monkeypatch):
    monkeypatch.setenv("COURSE_NBGRADER_FORK", "1" if forked else "0")
    nbgrader_fork._close_all()
    started = time.monotonic()
    rc, out = run_nbgrader(["db", "student", "list", _db(course)], course, env=_env(course, "sleep"), timeout=8)
    assert rc is None and time.monotonic() - started < 60, out
    assert (course / "started").exists()
    assert not [p for p in Path("/proc").glob("[0-9]*") if _cwd(p) == course.resolve()], "the command still runs"
    rc, out = run_nbgrader(["db", "student", "list", _db(course)], course, env=_env(course, "after"), timeout=120)
    assert rc == 0 and _seen(out)[1] == "after", "the server did not take a command after one it killed"


def test_two_commands_at_once_run_in_two_servers(course, monkeypatch):
    monkeypatch.setenv("COURSE_NBGRADER_FORK", "1")
    nbgrader_fork._close_all()
    results = []

    def one(probe: str) -> None:         # a gradebook each: two nbgrader runs creating one database's tables race
        results.append(run_nbgrader(["db", "student", "list", f"--db=sqlite:///{course / probe}.db"], course,
                                    env=_env(course, probe), timeout=120))

    threads = [threading.Thread(target=one, args=(p,)) for p in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(_seen(out)[1] for rc, out in results if rc == 0) == ["first", "second"], results
    assert len(nbgrader_fork._idle) == 2
    nbgrader_fork._close_all()


def _cwd(proc: Path) -> Path | None:
    try:
        return Path(os.readlink(proc / "cwd"))
    except OSError:
        return None
