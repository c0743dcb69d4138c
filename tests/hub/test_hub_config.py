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
