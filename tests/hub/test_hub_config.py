"""The class hub's configuration, without a hub: the course id agrees with nbgrader_config.py, each role sees its own
nbgrader screens, and the spawner's limits reach the child process (no root needed)."""

from __future__ import annotations

import json
import subprocess
import sys

from traitlets.config.loader import PyFileConfigLoader

from autograder.hub.classroom import CONFIG_DIR, COURSE_ID
from autograder.hub.spawner import limits_preexec
from autograder.paths import REPO_ROOT


def test_the_hub_uses_the_course_id_of_nbgrader_config() -> None:
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO_ROOT)).load_config()
    assert config.CourseDirectory.course_id == COURSE_ID


def test_students_get_the_assignments_tab_and_not_the_formgrader() -> None:
    def disabled(role: str) -> dict[str, bool]:
        return json.loads((CONFIG_DIR / role / "labconfig" / "page_config.json").read_text())["disabledExtensions"]

    def served(role: str) -> dict[str, bool]:
        return json.loads((CONFIG_DIR / role / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]

    assert not disabled("student")["@jupyter/nbgrader:assignment-list"]
    assert disabled("student")["@jupyter/nbgrader:formgrader"] and disabled("student")["@jupyter/nbgrader:create-assignment"]
    assert served("student")["nbgrader.server_extensions.assignment_list"]
    assert not served("student")["nbgrader.server_extensions.formgrader"]
    assert not any(disabled("instructor").values()) and all(served("instructor").values())


def test_the_limits_reach_the_child() -> None:
    code = ("import resource as r; print(r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_NPROC)[0], "
            "r.getrlimit(r.RLIMIT_FSIZE)[0])")
    out = subprocess.run([sys.executable, "-c", code], preexec_fn=limits_preexec(3 * 2**30, 4000, 2**20),
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(3 * 2**30), "4000", str(2**20)]


def test_terminals_keep_the_class_environment() -> None:
    """JupyterLab's terminal is a login shell by default, whose /etc/profile resets PATH: `nbgrader` and the class's
    python were "command not found" in the instructor's terminal. A plain interactive bash keeps the server's PATH."""
    for role in ("instructor", "student"):
        config = json.loads((CONFIG_DIR / role / "jupyter_server_config.json").read_text())
        assert config["ServerApp"]["terminado_settings"]["shell_command"] == ["/bin/bash"], role


def test_a_sandbox_under_a_too_low_hard_limit_is_refused_naming_the_limit(monkeypatch) -> None:
    import resource

    from autograder.judging import sandbox

    real = resource.getrlimit
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox.resource, "getrlimit",
                        lambda which: (256, 256) if which == resource.RLIMIT_NPROC else real(which))
    why = sandbox.limits_shortfall(sandbox.SandboxPolicy())
    assert why and "processes: hard limit 256" in why and "instructor_processes_limit" in why
    monkeypatch.setattr(sandbox.resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert sandbox.limits_shortfall(sandbox.SandboxPolicy()) is None


def test_make_uses_an_environment_it_cannot_change_as_it_is() -> None:
    """The instructor's course clone on the hub links .venv to the class's environment, owned by root: make's setup
    says so and goes on, where it used to run pip into it (and fail with Permission denied)."""
    import os
    import pwd
    import shutil
    import tempfile
    from pathlib import Path

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root: the environment must belong to another user than the one running make")
    tmp_path = Path(tempfile.mkdtemp(prefix="shared-venv-", dir="/tmp"))     # pytest's tmp_path is root's alone
    try:
        _make_in_a_clone_of_a_shared_environment(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _make_in_a_clone_of_a_shared_environment(tmp_path) -> None:
    import pwd
    import shutil

    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(REPO_ROOT / "Makefile", course)
    (course / "config").mkdir()
    for name in ("requirements.txt", "pyproject.toml", "config/jupyterlab_overrides.json",
                 "config/ipython_kernel_config.py"):
        (course / name).touch()                       # all newer than the environment's install stamp (none)
    env = tmp_path / "class-venv"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to("/bin/true")
    (course / ".venv").symlink_to(env)
    for p in (tmp_path, course, course / "config"):
        p.chmod(0o755)
    nobody = pwd.getpwnam("nobody")
    done = subprocess.run(["make", "-C", str(course), "setup"], capture_output=True, text=True,
                          user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "an environment you cannot change" in done.stdout, done.stdout + done.stderr
    assert "pip" not in done.stdout + done.stderr
