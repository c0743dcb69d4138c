"""The hub's spawner for the course: JupyterHub's own LocalProcessSpawner, with the course's environment by role
and limits per person set in the child process before it runs anything.

    c.JupyterHub.spawner_class = "autograder.hub.spawner.CourseSpawner"

Role: the hub's admins are instructors (formgrader, course list, the course clone as their folder); everyone else
is a student (Assignments tab only, their home as their folder). JUPYTER_CONFIG_PATH is config/hub/<role>/
(JupyterLab plugins, server extensions) then config/hub/common/ (nbgrader's exchange and course id).

Limits (resource.setrlimit in the child, inherited by the server, its kernels and terminals):
    address space   mem_limit per process (RLIMIT_AS): a runaway allocation fails with MemoryError
    processes       processes_limit for the whole user (RLIMIT_NPROC counts every process of the uid)
    file size       file_size_limit per file (RLIMIT_FSIZE)
An instructor's server gets its own two (instructor_mem_limit, instructor_processes_limit; none by default): grading
runs there, and the sandbox gives each submission its own limits, which must fit under the server's (an
unprivileged process cannot raise a hard limit; autograder/judging/sandbox.py's limits_shortfall says so).
What one machine cannot enforce this way: memory summed over a user's processes (each gets mem_limit), CPU share
(a busy student slows the others; cgroups or Kubernetes limits do that), disk space in total (needs quotas).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer, Unicode, default

from autograder.hub.classroom import role_env
from autograder.paths import REPO_ROOT


def limits_preexec(mem_bytes: int, processes: int, file_bytes: int,
                   then: Callable[[], None] = lambda: None) -> Callable[[], None]:
    """A Popen preexec_fn: set the three limits (0 = leave that one unset), then run `then` (JupyterHub's setuid)."""

    def preexec() -> None:
        for limit, value in ((resource.RLIMIT_AS, mem_bytes), (resource.RLIMIT_NPROC, processes),
                             (resource.RLIMIT_FSIZE, file_bytes)):
            if value:
                resource.setrlimit(limit, (value, value))
        then()
    return preexec


class CourseSpawner(LocalProcessSpawner):
    """LocalProcessSpawner + the course's environment by role + per-user limits (module docstring)."""

    processes_limit = Integer(256, config=True, help="RLIMIT_NPROC of the user's processes (0: unlimited)")
    file_size_limit = Integer(512 * 2**20, config=True, help="RLIMIT_FSIZE in bytes (0: unlimited)")
    instructor_processes_limit = Integer(0, config=True, help="RLIMIT_NPROC of an instructor's server (0: none): "
                                         "autograding there runs a sandbox per submission, each asking for its own")
    instructor_mem_limit = Integer(0, config=True, help="RLIMIT_AS of an instructor's server, bytes (0: none): the "
                                   "sandbox sets each submission's own")
    exchange = Unicode("", config=True, help="nbgrader's exchange folder (Exchange.root)")
    course_id = Unicode("", config=True, help="nbgrader's course id")
    venv = Unicode(str(REPO_ROOT / ".venv"), config=True, help="the Python environment users run (the class's)")

    @property
    def role(self) -> str:
        return "instructor" if self.user.admin else "student"

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        """Limits, JupyterHub's setuid (which moves to the home folder), then the folder the server serves: nbgrader's
        formgrader reads nbgrader_config.py from the server's working folder, so the instructor's is the course."""
        setuid, folder = super().make_preexec_fn(name), self.notebook_dir

        def then() -> None:
            setuid()
            os.chdir(folder)
        if self.role == "instructor":
            return limits_preexec(self.instructor_mem_limit, self.instructor_processes_limit, self.file_size_limit,
                                  then=then)
        return limits_preexec(int(self.mem_limit or 0), self.processes_limit, self.file_size_limit, then=then)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(role_env(self.venv, self.role, self.exchange, self.course_id),
                   MPLBACKEND="module://matplotlib_inline.backend_inline")
        return env

    @default("notebook_dir")
    def _notebook_dir_by_role(self) -> str:
        """The instructor works in the course clone (the formgrader reads its nbgrader_config.py), a student at home."""
        home = Path(os.path.expanduser(f"~{self.user.name}"))
        return str(home / "course") if self.role == "instructor" else str(home)
