"""The sandbox a learner's kernel runs in while it is graded (Debian's bubblewrap, no daemon).

nbgrader stays in a trusted process; only the kernel is launched inside `bwrap`. The kernel manager below
(`SandboxedKernelManager`, set as nbgrader's `Execute.kernel_manager_class`) ignores the kernelspec a
notebook names and always starts this interpreter's ipykernel, wrapped like this:

* namespaces: own mount, PID, network (loopback only), IPC, UTS (and user, when not root) namespaces;
  `--die-with-parent` and the PID namespace mean every process the notebook started dies with its kernel;
* file system: a tmpfs root holding read-only binds of /usr (and the /bin, /lib links), a few files of /etc,
  the Python installation, the virtual environment and the course package (`shared/`, `autograder/`, `data/`),
  nothing else: no course root, gradebook.db, solutions/, other submissions, instructor's home;
  the submission is read-only at /submission and copied into a size-capped writable tmpfs at /tmp
  (/dev/shm is a second, 64 MiB one);
* the kernel talks to nbgrader over jupyter_client's `ipc` transport: Unix sockets in one fresh folder
  bind-mounted into the sandbox (the sandbox's loopback is not the host's, so TCP would not reach it);
* limits (set by `sandbox_boot.py`): RLIMIT_AS memory, RLIMIT_NPROC processes, RLIMIT_FSIZE file size,
  RLIMIT_CPU seconds; as root the kernel runs under an unprivileged uid of its own;
* environment: built from nothing (`--clearenv`): PATH, HOME=/tmp/home, PYTHONPATH to the package, one
  thread for torch/OpenMP, NBGRADER_EXECUTION; none of the instructor's variables.

The policy travels from the grading process to nbgrader's process in the COURSE_SANDBOX variable (JSON).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from autograder.paths import REPO_ROOT, SANDBOX_BOOT
from autograder.judging.socket_folder import socket_folder
from autograder.processes import descendants

PACKAGE_ROOT = REPO_ROOT                                 # holds shared/ and autograder/
BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
ENV_VAR = "COURSE_SANDBOX"
LEFTOVER_MARK = "processes still running in the sandbox when the kernel stopped (killed with it):"
GiB = 1 << 30
SHM_BYTES = 64 << 20          # /dev/shm (POSIX semaphores of multiprocessing), a tmpfs of its own
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "hosts", "mime.types", "fonts",
             "alternatives", "ssl/openssl.cnf")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this machine."""


@dataclass
class SandboxPolicy:
    """What a sandboxed kernel may use. enabled=False is `--unsafe`: the kernel runs with the grader's rights."""

    enabled: bool = True
    memory_bytes: int = 3 * GiB        # RLIMIT_AS (virtual memory; torch + ipykernel alone take ~0.8 GiB)
    tmp_bytes: int = 512 << 20         # size of the writable tmpfs (/tmp: home, work folder); RLIMIT_FSIZE too
    nproc: int = 256                   # RLIMIT_NPROC: processes and threads of the sandbox's uid
    cpu_seconds: int = 1800            # RLIMIT_CPU of each process
    threads: int = 1                   # OMP/MKL/torch threads
    package_dirs: list[str] = field(default_factory=list)   # read-only binds besides the interpreter

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> "SandboxPolicy":
        raw = os.environ.get(ENV_VAR)
        return cls(**json.loads(raw)) if raw else cls()


def default_package_dirs(root: Path = PACKAGE_ROOT) -> list[str]:
    """The course package a notebook imports: shared/ (minigpt), autograder/ (the checks), data/."""
    return [str(root / d) for d in ("shared", "autograder", "data") if (root / d).is_dir()]


def _python_dirs() -> list[str]:
    """The interpreter's installation, the virtual environment, and any site-packages on sys.path outside them (a
    class's venv on a hub loads the installation's through a .pth file): all read-only in the sandbox."""
    dirs = {str(Path(sys.base_prefix)), str(Path(sys.prefix))}
    dirs |= {p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()
             and not any(Path(p).is_relative_to(d) for d in (sys.base_prefix, sys.prefix))}
    return sorted(dirs)


def _parent_dirs(paths: list[str]) -> list[str]:
    """`--perms 0755 --dir` for every folder above the bind targets (bwrap would make them 0700)."""
    seen: list[str] = []
    for p in paths:
        for parent in reversed(Path(p).parents):
            if str(parent) != "/" and str(parent) not in seen:
                seen.append(str(parent))
    return [a for d in seen for a in ("--perms", "0755", "--dir", d)]


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr", "--perms", "0755", "--dir", "/etc"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for dev in sorted(Path("/dev").glob("nvidia*")):      # the GPU tier, where there is a GPU
        args += ["--dev-bind-try", str(dev), str(dev)]
    return args


def _processes_of(uid: int) -> int:
    n = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    n += int(line.split()[1]) == uid
                    break
        except (OSError, ValueError):
            continue
    return n


def bwrap_argv(policy: SandboxPolicy, kernel_cmd: list[str], *, submission_dir: str | None,
               socket_dir: str | None, extra_env: dict[str, str] | None = None, uid: int | None = None,
               replace: dict[str, str] | None = None, socket_file: str | None = None) -> list[str]:
    """The full command line: bwrap ... -- python -I sandbox_boot.py LIMITS -- KERNEL_CMD. `replace`: read-only
    folders bound from elsewhere ({folder seen in the sandbox: folder bound there}, e.g. the witness's copy of
    the course package without the reference, autograder/judging/reference_removal.py). `socket_dir` is bound
    writable (the process makes its sockets there); `socket_file`, instead, is one socket bound read-only, which
    the process can connect to (a socket on a read-only mount still accepts connections) and write nothing beside."""
    as_root = os.geteuid() == 0
    args = [BWRAP, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not as_root:
        args.append("--unshare-user")
    args += _system_binds()
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(policy.tmp_bytes), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(min(SHM_BYTES, policy.tmp_bytes)), "--tmpfs", "/dev/shm"]
    ro_dirs = _python_dirs() + (policy.package_dirs or default_package_dirs())
    args += _parent_dirs(ro_dirs + [p for p in (socket_dir, socket_file) if p])
    for d in ro_dirs:
        args += ["--ro-bind", (replace or {}).get(d, d), d]
    if socket_dir:
        args += ["--bind", socket_dir, socket_dir]
    if socket_file:
        args += ["--ro-bind", socket_file, socket_file]
    if submission_dir:
        args += ["--ro-bind", submission_dir, "/submission"]
    pkg_paths = [d for d in (policy.package_dirs or default_package_dirs()) if not d.endswith("/data")]
    pythonpath = [d for d in pkg_paths if d.endswith("/shared")] + \
                 [str(Path(d).parent) for d in pkg_paths if d.endswith("/autograder")]
    threads = str(policy.threads)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
           "USER": "learner", "LOGNAME": "learner", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
           "PYTHONPATH": os.pathsep.join(pythonpath), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
           "OMP_WAIT_POLICY": "PASSIVE", "JUPYTER_PLATFORM_DIRS": "1",
           "TRITON_INTERPRET": "1",        # no GPU device is bound into the sandbox: Triton kernels run interpreted
           # RLIMIT_AS counts address space, and glibc reserves 64 MiB of it for every malloc arena, up to 8 per
           # core, one per thread that allocates (the kernel's zmq and IOPub threads among them): a kernel using
           # 0.4 GiB was killed under 3 GiB while it displayed 100 MB. Two arenas keep the limit about memory used.
           "MALLOC_ARENA_MAX": "2",
           **(extra_env or {})}
    args.append("--clearenv")
    for k, v in env.items():
        args += ["--setenv", k, v]
    args += ["--chdir", "/tmp"]
    boot = [sys.executable, "-I", str(SANDBOX_BOOT),
            "--memory", str(policy.memory_bytes), "--fsize", str(policy.tmp_bytes),
            "--cpu", str(policy.cpu_seconds)]
    if as_root:
        uid = uid if uid is not None else sandbox_uid()
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]   # only for the boot script's setuid
        boot += ["--uid", str(uid), "--gid", str(uid), "--nproc", str(policy.nproc)]
    else:   # RLIMIT_NPROC counts every process of this uid: leave room for the instructor's own
        boot += ["--nproc", str(policy.nproc + _processes_of(os.getuid()))]
    return args + ["--", *boot, "--", *kernel_cmd]


def sandbox_uid() -> int:
    """A uid used by nothing else, one per sandbox, so each has its own RLIMIT_NPROC count."""
    return 200_000 + secrets.randbelow(800_000)


_probed: dict[str, str | None] = {}


def probe(policy: SandboxPolicy | None = None, timeout: float = 60) -> str | None:
    """None if a sandbox starts here (and the course package imports inside it), else why not."""
    policy = policy or SandboxPolicy()
    key = policy.to_env()
    if key not in _probed:
        _probed[key] = _probe(policy, timeout)
    return _probed[key]


def limits_shortfall(policy: SandboxPolicy) -> str | None:
    """Why this process cannot give a sandbox the limits `policy` sets, or None: a hard limit below them, which
    only root may raise (the boot script sets them inside the sandbox, where they would fail)."""
    if os.geteuid() == 0:
        return None
    wants = {resource.RLIMIT_AS: ("address space", policy.memory_bytes),
             resource.RLIMIT_NPROC: ("processes", policy.nproc + _processes_of(os.getuid())),
             resource.RLIMIT_FSIZE: ("file size", policy.tmp_bytes),
             resource.RLIMIT_CPU: ("CPU seconds", policy.cpu_seconds + 5)}
    short = [f"{what}: hard limit {hard}, a sandbox sets {want}" for which, (what, want) in wants.items()
             if (hard := resource.getrlimit(which)[1]) != resource.RLIM_INFINITY and hard < want]
    if not short:
        return None
    return ("this process's hard limits are below those of a sandbox (" + "; ".join(short) + "), and a process "
            "that is not root cannot raise them: whatever started it set them (on the course's hub, the spawner: "
            "CourseSpawner.instructor_processes_limit and instructor_mem_limit). Grade from a shell without them")


def _probe(policy: SandboxPolicy, timeout: float) -> str | None:
    if not Path(BWRAP).exists():
        return f"bubblewrap is not installed ({BWRAP} missing; `make sandbox-deps` installs Debian's)"
    if why := limits_shortfall(policy):
        return why
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as sock:
        uid = sandbox_uid()
        if os.geteuid() == 0:
            os.chown(sock, uid, uid)
        cmd = bwrap_argv(policy, [sys.executable, "-c", "import autograder, minigpt; print('sandbox-ok')"],
                         submission_dir=None, socket_dir=sock, uid=uid)
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap could not start: {exc}"
    if out.returncode != 0 or "sandbox-ok" not in out.stdout:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return f"bubblewrap could not start a sandbox here (user namespaces disabled?): {why}"
    return None


def _make_readable(folder: Path) -> None:
    """o+r files, o+rx folders under folder (nbgrader's working copy of one submission), links untouched."""
    folder.chmod(folder.stat().st_mode | 0o005)
    for p in folder.rglob("*"):
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | (0o005 if p.is_dir() else 0o004))


class SandboxedKernelManager(AsyncKernelManager):
    """The one kernel grading may start: this interpreter's ipykernel, in the sandbox of COURSE_SANDBOX.

    The kernel name a notebook asks for is ignored (a submission's metadata cannot pick another kernel).
    """

    def __init__(self, **kwargs):
        kwargs.pop("kernel_name", None)
        super().__init__(kernel_name="python3", **kwargs)
        self.policy = SandboxPolicy.from_env()
        self._socket_dir = socket_folder("kernel-")
        self._uid = sandbox_uid()
        self.transport = "ipc"
        self.ip = os.path.join(self._socket_dir, "k")
        self.connection_file = os.path.join(self._socket_dir, "connection.json")

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                          display_name="Python 3 (grading sandbox)", language="python",
                          interrupt_mode="message", env={})

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if not self.policy.enabled:
            return cmd
        if os.geteuid() == 0:        # the kernel's uid must reach its sockets and read the connection file
            os.chown(self._socket_dir, self._uid, self._uid)
            os.chown(self.connection_file, self._uid, self._uid)
        cwd = (self._launch_args or {}).get("cwd")
        if cwd and os.geteuid() == 0:   # the kernel's own uid copies the submission: let it read the copy
            _make_readable(Path(cwd))
        extra = {"NBGRADER_EXECUTION": os.environ.get("NBGRADER_EXECUTION", "autograde")}
        return bwrap_argv(self.policy, cmd, submission_dir=str(cwd) if cwd else None,
                          socket_dir=self._socket_dir, extra_env=extra, uid=self._uid)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        if self.policy.enabled:       # bubblewrap gets a clean environment too (it clears the kernel's anyway)
            kw["env"] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        else:
            kw["env"] = {k: v for k, v in (kw.get("env") or os.environ).items()
                         if k in ("PATH", "LANG", "PYTHONPATH", "OMP_NUM_THREADS", "NBGRADER_EXECUTION", "TRITON_INTERPRET",
                                  "OMP_WAIT_POLICY", "MINIGPT_DATA_DIR")}
        await super()._async_launch_kernel(kernel_cmd, **kw)

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        self._report_leftovers()
        await super().shutdown_kernel(now=now, restart=restart)

    def _report_leftovers(self) -> None:
        """Log how many processes besides the kernel are still in the sandbox (they die with it)."""
        process = getattr(self.provisioner, "process", None)
        if not self.policy.enabled or process is None or process.poll() is not None:
            return
        extra = len(descendants(process.pid)) - 2          # bwrap's init (PID 1 inside) and the kernel
        if extra > 0:
            self.log.warning("%s %d", LEFTOVER_MARK, extra)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
