"""A demonstration class as system users on this machine, made and removed in one step each (root only).

    roster = create_class(Path("/srv/llm-course-hub"), students=3)
    roster.instructor, roster.students, roster.passwords[name]
    remove_class(Path("/srv/llm-course-hub"))

What `create_class` makes, all recorded in `<root>/class.json` (mode 600) so that `remove_class` undoes exactly that:
* users `<prefix>-instructor` and `<prefix>-student-1..N` with homes of mode 700 and random passwords (the hub's
  PAM authenticator checks them like any login);
* a Python environment every user may run, `<root>/venv`: a venv of the installation's own interpreter (reached
  through hard links in `<root>/python` where it lives behind a folder others cannot enter, such as root's pyenv;
  the system's Python is not a substitute: Debian 12's 3.11.2 mis-parses the possessive patterns nbconvert's HTML
  sanitizer uses) that loads the installation's site-packages, with a copy of each of its commands (`nbgrader`,
  `jupyterhub-singleuser`, `alembic`...) pointed at it;
* the instructor's course: a clone of this repository in `~/course` (theirs; the gradebook, submissions and
  feedback live there), whose `.venv` is that environment;
* nbgrader's exchange, `<root>/exchange`, writable by everyone as nbgrader's docs ask: nbgrader gives each course
  folder its own modes (inbound: write, no list; outbound: read);
* what in this installation holds or rebuilds a model answer (PRIVATE: `solutions/`, git's history, gradebooks and
  their backups, nbgrader's folders, the installer's workspace, caches), closed to other users for the class's life
  (their modes are restored on removal).
Every method raises with a clear message when it cannot do its part (not root, a user that already exists).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autograder.paths import REPO_ROOT

DEFAULT_ROOT = Path(os.environ.get("LLM_COURSE_HUB_ROOT", "/srv/llm-course-hub"))
COURSE_ID = "llm-inference-course"        # nbgrader_config.py's CourseDirectory.course_id (a test keeps them equal)
STATE = "class.json"
CONFIG_DIR = REPO_ROOT / "config" / "hub"                 # the hub's config, and each role's Jupyter config
# What students of the class must not read in this installation (names or glob patterns at its top): the solutions
# and hidden tests, and everything that holds or rebuilds them (git's history, a gradebook and its backups, nbgrader's
# working and output folders, the installer's own workspace, build and test caches).
PRIVATE = (".git", "solutions", "gradebook.db*", "submitted", "autograded", "feedback", "nbgrader_work", "release",
           "workspace", ".cache", "build", "grades.csv", "similarity-*", ".interview_history.jsonl", ".pytest_cache",
           ".hypothesis")
HUB_PID = "jupyterhub.pid"                 # in <root>/hub/: the running hub, stopped by remove_class
TEMPORARY = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))   # where a class member's processes leave folders

__all__ = ["Roster", "create_class", "remove_class", "load_roster", "role_env", "run_as", "DEFAULT_ROOT", "COURSE_ID"]


@dataclass
class Roster:
    """Who is in the class, and what was made for it."""

    prefix: str
    instructor: str
    students: list[str]
    passwords: dict[str, str]
    exchange: str
    course_dir: str                       # the instructor's clone
    repo: str                             # the installation the class runs on
    venv: str = ""                        # the class's Python environment
    locked: dict[str, int] = field(default_factory=dict)     # installation path -> its mode before the class

    @property
    def users(self) -> list[str]:
        return [self.instructor, *self.students]


def _run(*cmd: str, stdin: str | None = None) -> None:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed: {(done.stderr or done.stdout).strip()}")


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PermissionError(f"{what} creates and removes system users: run it as root (sudo)")


def _wait_gone(name: str, seconds: float = 30) -> None:
    """Until no process of `name` is left: SIGKILL is delivered, but a process is gone only once it has exited."""
    deadline = time.monotonic() + seconds
    while subprocess.run(["pgrep", "-u", name], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of {name} still run {seconds:g} s after SIGKILL")
        time.sleep(0.1)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def load_roster(root: Path = DEFAULT_ROOT) -> Roster:
    path = Path(root) / STATE
    if not path.exists():
        raise FileNotFoundError(f"no class at {root}: run `python -m autograder hub setup` first")
    return Roster(**json.loads(path.read_text()))


def _save(root: Path, roster: Roster) -> None:
    path = root / STATE
    path.write_text(json.dumps(asdict(roster), indent=1))
    path.chmod(0o600)


def _add_user(name: str, password: str) -> None:
    _run("useradd", "--create-home", "--shell", "/bin/bash", "--key", "UMASK=077", "--comment", "LLM course class",
         name)
    _run("chpasswd", stdin=f"{name}:{password}\n")
    Path(pwd.getpwnam(name).pw_dir).chmod(0o700)


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for p in [path, *path.rglob("*")]:
        os.lchown(p, entry.pw_uid, entry.pw_gid)


def _reachable_by_others(path: Path) -> bool:
    """Whether a user other than the owner can reach `path` (every folder above it lets others in)."""
    return all(stat.S_IMODE(p.stat().st_mode) & 0o001 for p in [path, *path.parents] if p.is_dir())


def _shared_python(installed: Path, root: Path) -> Path:
    """The installation's base interpreter, or hard links to it (its stdlib, not its site-packages) under
    `<root>/python` when others cannot reach it; copies where the two are on different filesystems. The interpreter
    itself is copied and its RUNPATH (where it finds libpython, an absolute path into the original folder) set to
    $ORIGIN/../lib with patchelf, so that it loads the libpython beside it."""
    cfg = dict(line.split(" = ", 1) for line in (installed / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    executable = Path(cfg.get("executable") or Path(cfg["home"]) / "python3").resolve()
    base = executable.parent.parent
    if _reachable_by_others(base):
        return executable
    shared = root / "python"

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(base, shared, symlinks=True, copy_function=link, ignore=shutil.ignore_patterns("site-packages"))
    interpreter = shared / executable.relative_to(base)
    interpreter.unlink()                                          # a copy, not a link: patchelf edits it in place
    shutil.copy2(executable, interpreter)
    _run(str(installed / "bin" / "patchelf"), "--set-rpath", "$ORIGIN/../lib", str(interpreter))
    return interpreter


def _class_venv(root: Path, repo: Path) -> Path:
    """A venv of the installation's interpreter that adds the installation's site-packages (a .pth line runs
    site.addsitedir, so the editable installs' own .pth files apply too), with the installation's commands
    re-pointed at it."""
    installed = repo / ".venv"
    site_dirs = sorted((installed / "lib").glob("python3*/site-packages"))
    if not site_dirs:
        raise FileNotFoundError(f"no site-packages under {installed}: run `make setup` first")
    venv = root / "venv"
    _run(str(_shared_python(installed, root)), "-m", "venv", "--without-pip", str(venv))
    own = venv / "lib" / site_dirs[0].parent.name / "site-packages"          # python3.11
    (own / "llm_course_installation.pth").write_text(f"import site; site.addsitedir({str(site_dirs[0])!r})\n")
    for script in (installed / "bin").iterdir():
        if script.is_file() and not script.is_symlink() and not (venv / "bin" / script.name).exists():
            head, _, rest = script.read_bytes().partition(b"\n")
            if head.startswith(b"#!") and head.rstrip().endswith((b"/python", b"/python3")):
                target = venv / "bin" / script.name
                target.write_bytes(b"#!" + str(venv / "bin" / "python").encode() + b"\n" + rest)
                target.chmod(0o755)
    _share_jupyter(installed, venv)
    (venv / ".installed").touch()                          # the Makefile's "set up" stamp: nothing to install
    for p in [venv, *venv.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o005 if p.is_dir() or os.access(p, os.X_OK) else p.stat().st_mode | 0o004)
    return venv


def _share_jupyter(installed: Path, venv: Path) -> None:
    """The installation's Jupyter data and settings, seen from the class's venv: etc/ (server extensions, the course
    kernel's IPython settings) and share/jupyter/ (JupyterLab, nbconvert's templates) linked; the kernelspecs
    copied with their Python replaced by the venv's."""
    if (installed / "etc").is_dir():
        (venv / "etc").symlink_to(installed / "etc")
    share = venv / "share" / "jupyter"
    share.mkdir(parents=True, exist_ok=True)
    for entry in (installed / "share" / "jupyter").iterdir():
        if entry.name != "kernels":
            (share / entry.name).symlink_to(entry)
    for spec in (installed / "share" / "jupyter" / "kernels").glob("*/kernel.json"):
        kernel = json.loads(spec.read_text())
        if Path(kernel["argv"][0]).parent == installed / "bin":
            kernel["argv"][0] = str(venv / "bin" / "python")
        (share / "kernels" / spec.parent.name).mkdir(parents=True)
        (share / "kernels" / spec.parent.name / "kernel.json").write_text(json.dumps(kernel, indent=1))


def _clone_course(repo: Path, venv: Path, home: Path, user: str) -> Path:
    course = home / "course"
    _run("git", "clone", "--quiet", "--no-hardlinks", str(repo), str(course))
    (course / ".venv").symlink_to(venv)                      # the class's environment, read-only to them
    _chown_tree(course, user)
    return course


def _lock_installation(repo: Path) -> dict[str, int]:
    """Close PRIVATE paths of the installation to other users; return their modes before."""
    locked = {}
    for pattern in PRIVATE:
        for path in sorted(repo.glob(pattern)):
            if not path.is_symlink():
                mode = stat.S_IMODE(path.stat().st_mode)
                locked[str(path)] = mode
                path.chmod(mode & ~0o007)
    return locked


def _stop_hub(root: Path, seconds: float = 30) -> None:
    """SIGTERM the class's running hub (its pid file, config/hub/jupyterhub_config.py), which stops its proxy; wait."""
    pid_file = root / "hub" / HUB_PID
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"jupyterhub" not in cmdline:
        return                                                    # a stale pid, reused by another program
    os.kill(pid, 15)
    deadline = time.monotonic() + seconds
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            break
        time.sleep(0.1)


def _remove_temporary_files(uids: set[int]) -> None:
    """Folders and files the class's people left at the top of the temporary folders (a killed kernel's judge
    socket folder, a notebook's scratch files)."""
    for folder in TEMPORARY:
        for entry in folder.iterdir() if folder.is_dir() else ():
            try:
                if entry.lstat().st_uid not in uids:
                    continue
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            except OSError:
                pass


def create_class(root: Path = DEFAULT_ROOT, students: int = 3, *, prefix: str = "llmc",
                 repo: Path = REPO_ROOT) -> Roster:
    """Make the class (see the module docstring); nothing is made if a user of that name already exists."""
    _require_root("hub setup")
    if students < 1:
        raise ValueError(f"a class needs at least one student, got {students}")
    root, repo = Path(root), Path(repo).resolve()
    if (root / STATE).exists():
        raise FileExistsError(f"a class already exists at {root}: `python -m autograder hub teardown` removes it")
    names = [f"{prefix}-instructor"] + [f"{prefix}-student-{i}" for i in range(1, students + 1)]
    taken = [n for n in names if _user_exists(n)]
    if taken:
        raise FileExistsError(f"users already exist: {', '.join(taken)}; pick another --prefix or remove them")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    exchange = root / "exchange"
    exchange.mkdir(exist_ok=True)
    exchange.chmod(0o777)
    roster = Roster(prefix, names[0], names[1:], {n: secrets.token_urlsafe(12) for n in names}, str(exchange),
                    course_dir="", repo=str(repo))
    _save(root, roster)                                       # saved first: a failure below is undone by remove_class
    for name in names:
        _add_user(name, roster.passwords[name])
    venv = _class_venv(root, repo)
    roster.venv = str(venv)
    roster.course_dir = str(_clone_course(repo, venv, Path(pwd.getpwnam(roster.instructor).pw_dir), roster.instructor))
    (venv / ".installed").touch()         # newer than the clone's requirements.txt: make sees nothing to install
    roster.locked = _lock_installation(repo)
    _save(root, roster)
    return roster


def remove_class(root: Path = DEFAULT_ROOT) -> list[str]:
    """Stop the class's hub and processes, remove its users, their homes and temporary files and the exchange,
    restore the installation's modes; return the users removed."""
    _require_root("hub teardown")
    root = Path(root)
    roster = load_roster(root)
    _stop_hub(root)
    removed = []
    uids = {pwd.getpwnam(name).pw_uid for name in roster.users if _user_exists(name)}
    for name in roster.users:
        if _user_exists(name):
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
            _wait_gone(name)
            done = subprocess.run(["userdel", "--remove", name], capture_output=True, text=True)
            if done.returncode not in (0, 12):                  # 12: the mail spool was missing, the home is gone
                raise RuntimeError(f"userdel {name} failed: {done.stderr.strip()}")
            removed.append(name)
    _remove_temporary_files(uids)
    for path, mode in roster.locked.items():
        if Path(path).exists():
            Path(path).chmod(mode)
    shutil.rmtree(roster.exchange, ignore_errors=True)
    if roster.venv:
        shutil.rmtree(roster.venv, ignore_errors=True)
        shutil.rmtree(Path(roster.venv).parent / "python", ignore_errors=True)     # hard links: the originals stay
    shutil.rmtree(root / "hub", ignore_errors=True)             # the hub's database, cookie secret, proxy pid
    (root / STATE).unlink()
    if root.exists() and not any(root.iterdir()):
        root.rmdir()
    return removed


def role_env(venv: str, role: str, exchange: str, course_id: str = COURSE_ID) -> dict[str, str]:
    """The environment a class member works in, the hub's servers and `run_as` alike: the class's Python first on
    PATH, the role's Jupyter config then the common one (config/hub/), nbgrader's exchange and course id, one thread."""
    return {"PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
            "JUPYTER_CONFIG_PATH": f"{CONFIG_DIR / role}:{CONFIG_DIR / 'common'}",
            "LLM_COURSE_EXCHANGE": exchange, "LLM_COURSE_ID": course_id, "OMP_NUM_THREADS": "1"}


def run_as(roster: Roster, user: str, command: str, *, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a shell command as `user` (root only) in their role's `role_env`. Never raises for the command's exit
    status: the caller reads returncode, stdout and stderr."""
    import shlex

    role = "instructor" if user == roster.instructor else "student"
    env = role_env(roster.venv, role, roster.exchange)
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return subprocess.run(["su", "-", user, "-c", f"env {assignments} bash -c {shlex.quote(command)}"],
                          capture_output=True, text=True, timeout=timeout)
