"""The judge: runs a notebook's test cells in a process where no learner code ever runs.

nbgrader scores a test cell by whether it raised, so whoever runs the cell decides the grade. Under
autograde the cell runs here instead of in the learner's kernel:

    nbgrader (trusted)          judge process (trusted)             kernel (learner's code, sandboxed)
    StoppingExecute ----cell--> exec(test cell)
                                  needs `kv_cache_bytes` ---------> observe.serve(): a handle to the function
                                  check_kv_cache_bytes(Remote)
                                    picks inputs from its seed ---> runs the learner's function on them
                                    compares with the reference <-- the outputs, as data
    <--outputs, error or none--

The checks are the lab's own `check_*` functions, imported here; the learner's functions, classes and
answers arrive as data or as `autograder.checking.wire.Remote` handles whose every use is a request to the kernel.
So nothing the notebook does to its own copy of the check modules, to `autograder.harness`, to IPython's input
transformers or to `sys.modules` reaches the verdict: the kernel only ever sees requests to run its own code.
A test cell whose kernel never answers (its serving cell rewritten away) fails.

Seeds: the checks draw their inputs from their own seeded generators, here; the kernel sees an input only when
it is asked to run the learner's code on it.

`python -m autograder.judging.judge SOCKET CONTROL_FD` is the process; `JudgeProcess` starts and drives it.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import linecache
import os
import queue
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from autograder.checking import framing

if TYPE_CHECKING:
    from autograder.checking import wire

ACCEPT_POLL_S = 0.2
WITNESS_POLL_S = 0.5        # how often the grading process looks whether a witness stopped early
START_TIMEOUT_S = 120       # importing torch in a fresh sandbox, on a loaded machine


# ----------------------------------------------------------------------------- the judge process

def cell_names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell reads from the notebook, names it assigns) from its source; names it imports are its own."""
    tree = ast.parse(source)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    return loaded - set(dir(builtins)) - imported, assigned


def grader_names(source: str, names: set[str]) -> dict[str, Any]:
    """The names a test cell reads that belong to the grader, bound to the judge's own objects instead of whatever
    the notebook holds under them: a module the judge has loaded (`torch`, `time`), a function of
    `autograder.harness` (`require_gpu`), and a constant of the check modules the cell imports from (a calibration
    name such as `FLASH_SPEED_CHECK`). A notebook that rebinds
    `require_gpu` to a function returning False would otherwise skip a GPU check and keep its points."""
    import importlib

    harness = importlib.import_module("autograder.harness")
    own: dict[str, Any] = {name: sys.modules[name] for name in names if name in sys.modules}
    own.update({name: getattr(harness, name) for name in names
                if getattr(getattr(harness, name, None), "__module__", None) == harness.__name__})
    for node in ast.walk(ast.parse(source)):          # a check module's constants (calibration names)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograder"):
            module = importlib.import_module(node.module)
            own.update({name: getattr(module, name) for name in names if name.isupper() and hasattr(module, name)})
    return own


def _plain(value: Any, endpoint: wire.Endpoint) -> bool:
    """True when value travels to the kernel as data (or is one of the kernel's own objects)."""
    import torch

    from autograder.checking import wire

    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return True
    if isinstance(value, wire.Remote):
        return value._endpoint is endpoint
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v, endpoint) for v in value)
    if isinstance(value, dict):
        return all(_plain(k, endpoint) and _plain(v, endpoint) for k, v in value.items())
    return False


def judge_endpoint(sock: socket.socket) -> wire.Endpoint:
    """The judge's end of a conversation: it serves the kernel only `wire.judge_services()`; each call asks the
    kernel for the traces, watches and call conditions open here, and what the kernel traced comes back into them."""
    from autograder.checking import call_conditions, reference_guard, tensor_trace, wire

    endpoint = wire.Endpoint(sock, services=wire.judge_services())
    endpoint.call_options = lambda: {**tensor_trace.remote_options(), **reference_guard.remote_options(),
                                     **call_conditions.remote_options()}
    endpoint.on_reply = tensor_trace.merge_remote
    return endpoint


def asked_names(source: str) -> list[str]:
    """The notebook's names a test cell reads from the other side (what `run_cell` asks for)."""
    loaded, _ = cell_names(source)
    return sorted(loaded - set(grader_names(source, loaded)))


def run_cell(endpoint: wire.Endpoint, source: str, push: bool = True, pushes_for: wire.Endpoint | None = None) -> dict:
    """Execute one test cell against the kernel behind `endpoint` (a `judge_endpoint`); {"stdout", "stderr", "error",
    "guarded", "asked"}: "guarded" lists the references its checks refused (autograder/checking/reference_guard.py),
    "asked" the notebook's names it read from the other side. `push`: set the
    names the cell assigns on the other side afterwards. `pushes_for` (with push=False): "pushes" holds the assigned
    values that can travel to that other endpoint as data (a witness's verdict, pushed to the kernel after it)."""
    from autograder.checking import isolation, library_refusal, reference_guard, wire

    wire.forget_origins()
    reference_guard.guarded()
    library_refusal.refused()
    isolation.requested_allowance()
    out, err = io.StringIO(), io.StringIO()
    error = None
    asked: list[str] = []
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        loaded, assigned = cell_names(source)
        namespace.update(grader_names(source, loaded))
        asked = sorted(loaded - set(namespace))     # = asked_names(source)
        for name in asked:
            with contextlib.suppress(NameError):
                namespace[name] = endpoint.request("getname", name=name)
        linecache.cache["<test cell>"] = (len(source), None, source.splitlines(True), "<test cell>")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(source, "<test cell>", "exec"), namespace)     # noqa: S102 (the course's own test cell)
    except framing.ChannelClosed:
        error = {"ename": "KernelStopped", "evalue": "the notebook's kernel stopped answering the grader in this cell"}
        assigned = set()
    except BaseException as exc:       # noqa: BLE001  (a failed check is the normal case)
        error = {"ename": type(exc).__name__, "evalue": str(exc), "lines": _explained(exc)}
        assigned = set() if isinstance(exc, SyntaxError) else assigned
    pushes = {k: namespace[k] for k in assigned if k in namespace and _plain(namespace[k], endpoint)} if push else {}
    with contextlib.suppress(OSError, ValueError, TypeError):
        endpoint.finish(pushes=pushes)
    kept = ({k: namespace[k] for k in assigned if k in namespace and _plain(namespace[k], pushes_for)}
            if pushes_for is not None and not error else {})
    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "error": error, "pushes": kept,
            "guarded": reference_guard.guarded(), "refused": library_refusal.refused(), "asked": asked,
            "memory_allowance": isolation.requested_allowance()}


def _explained(exc: BaseException) -> list[str]:
    """What the learner is shown for a failed check: the exercise it belongs to and the check's message, not the
    judge's traceback (autograder/checking/learner_errors.py)."""
    from autograder.checking.learner_errors import explain

    try:
        lines = explain(type(exc), exc, exc.__traceback__)
    except Exception:
        lines = None
    lines = lines or [f"{type(exc).__name__}: {exc}"]
    cause: BaseException | None = exc
    while cause is not None and not getattr(cause, "learner_frames", None):
        cause = cause.__context__
    if cause is not None and len(lines) > 1:      # the check's line, then the learner's own frames, then the message
        lines = lines[:-1] + cause.learner_frames + lines[-1:]
    return [line.replace("<test cell>", "this check cell") for line in lines]


def _accept(server: socket.socket, control: socket.socket, token: str, timeout: float) -> socket.socket | None:
    """The kernel's connection for this cell, or None when the grader says "abort" or time runs out."""
    from autograder.checking import wire

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([server, control], [], [], ACCEPT_POLL_S)
        if control in ready:
            header, _ = framing.recv_frame(control)
            if header.get("op") == "abort":
                return None
        if server in ready:
            conn, _ = server.accept()
            conn.settimeout(max(0.1, deadline - time.monotonic()))     # a silent connection cannot hold the judge
            try:
                hello = wire.Endpoint(conn).expect_hello()
            except (framing.ChannelClosed, OSError, ValueError):   # a stale kernel connection, closed before its hello
                hello = None
            if hello == token:
                conn.settimeout(None)
                return conn
            conn.close()
    return None


def prepare() -> None:
    """What every judge does before it serves a notebook: torch imported on one thread, and the checks told that
    no learner code runs in this process. A fresh judge does it at start; the zygote once, before any submission
    exists, for every judge it forks (autograder/judging/judge_zygote.py)."""
    import torch

    torch.set_num_threads(1)
    import autograder.harness  # noqa: F401  (what every test cell's checks import, once: before a fork)
    from autograder.checking import call_conditions, isolation, library_refusal, tensor_trace, wire  # noqa: F401
    from autograder.checking import reference_guard

    reference_guard.learner_code_runs_elsewhere()


def main(argv: list[str]) -> int:
    path, control_fd = argv[0], int(argv[1])
    prepare()
    control = socket.socket(fileno=control_fd)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)        # the sandboxed kernel runs under a uid of its own
    server.listen(4)
    return serve(server, control, path)


def serve(server: socket.socket, control: socket.socket, path: str | None = None) -> int:
    """Judge one notebook: `server` listens for the kernel's connections, `control` is the line to the grading
    process. `path`, the socket's, is removed when the grading process goes without a word (None: it removes it)."""
    from autograder.checking import isolation

    isolation.connect(lambda request: _ask_grader(control, request))
    framing.send_frame(control, {"ready": True}, {})
    while True:
        try:
            header, _ = framing.recv_frame(control)
        except framing.ChannelClosed:             # the process that started it died without a word (a killed kernel)
            if path is not None:
                _leave_nothing(path)
            return 0
        if header.get("op") == "quit":
            return 0
        if header.get("op") != "cell":
            continue
        conn = _accept(server, control, header["token"], header["timeout"])
        if conn is None:
            result = _failed("KernelSilent", "the notebook's kernel never answered the grader for this cell (was "
                             "the cell's code replaced before it ran?), so it earns no points")
        else:
            isolation.set_phase("kernel")
            with conn:
                kernel = judge_endpoint(conn)
                plan = header.get("plan") if header.get("witness") else None
                result = witness_first(server, control, header, plan, kernel) if plan else None
                if result is None:           # no plan, or the witness's checks guarded what the plan did not remove
                    result = run_cell(kernel, header["source"])
                    if header.get("witness") and (result["guarded"] or result["refused"]) and not result["error"]:
                        lists = plan_of(result)
                        result = graded_again(server, control, header, result["guarded"], result["asked"],
                                              result["refused"], result["memory_allowance"])
                        result["witness_plan"] = {"used": False, "lists": lists, "stale": plan is not None}
        for key in ("guarded", "refused", "asked", "memory_allowance", "pushes"):
            result.pop(key, None)
        framing.send_frame(control, {"result": result}, {})


def _leave_nothing(path: str) -> None:
    """Remove the socket, its folder and, when it is a judge-* folder left empty, the one above it: what a kernel
    killed outright (its atexit never ran) would leave in /tmp. rmdir removes only empty folders; where the judge
    may not (sandboxed, another owner), the grader that made them removes them."""
    folder = os.path.dirname(path)
    for remove, target in ((os.unlink, path), (os.rmdir, folder)):
        try:
            remove(target)
        except OSError:
            return
    outer = os.path.dirname(folder)
    if os.path.basename(outer).startswith("judge-"):
        with contextlib.suppress(OSError):
            os.rmdir(outer)


def _ask_grader(control: socket.socket, request: dict) -> dict:
    """A check's request to the grading process to hold or measure the submission's processes
    (autograder/checking/isolation.py), and its reply. A stale "abort" meant for an earlier wait is skipped."""
    framing.send_frame(control, {"isolation": request}, {})
    while True:
        reply, _ = framing.recv_frame(control)
        if "isolation_reply" in reply:
            return reply["isolation_reply"]


def graded_again(server: socket.socket, control: socket.socket, header: dict, guarded: list[dict],
                 names: list[str], refused: list[dict] = (), memory_allowance: int | None = None,
                 pushes_for: wire.Endpoint | None = None) -> dict:
    """The test cell's verdict from a witness (autograder/judging/witness.py): the grading process starts one whose course
    package lacks the references the cell's checks refused, the cell runs again against it, and that run's
    verdict is the cell's."""
    import secrets

    from autograder.judging.reference_removal import removals

    token = secrets.token_hex(8)
    request = {"removals": removals(guarded), "names": names, "token": token, "refused": list(refused),
               "memory_allowance": memory_allowance}
    framing.send_frame(control, {"witness": request}, {})
    while True:
        reply, _ = framing.recv_frame(control)
        if reply.get("op") == "witness-failed":
            return _failed("WitnessFailed", f"the grader could not start the process that checks this cell again "
                           f"without the course's reference ({reply.get('why', '?')}): it earns no points")
        if reply.get("op") == "witness-started":
            break                           # (an "abort" meant for the kernel's part is stale: skipped)
    conn = _accept(server, control, token, header["timeout"])
    if conn is None:
        return _failed("WitnessSilent", "graded again in a process without the course's reference, your notebook's "
                       "code never answered (it stopped, or ran past the time limit): this check earns no points")
    from autograder.checking import isolation

    isolation.set_phase("witness")
    isolation.set_witness_allowance(memory_allowance)
    try:
        with conn:
            result = run_cell(judge_endpoint(conn), header["source"], push=False, pushes_for=pushes_for)
    finally:
        isolation.set_phase("kernel")
        isolation.set_witness_allowance(None)
    return _reference_explained(result, guarded, refused)


def plan_of(result: dict) -> dict:
    """A run's witness plan: what its checks guarded and refused and the memory they asked for, each guard and refusal
    once, in a canonical order (autograder/witness_plans.json holds the solution's, per test cell)."""
    def once(items: list[dict]) -> list[dict]:
        return [json.loads(key) for key in sorted({json.dumps(item, sort_keys=True) for item in items})]
    return {"guarded": once(result.get("guarded") or []), "refused": once(result.get("refused") or []),
            "memory_allowance": result.get("memory_allowance")}


def covered(run: dict, plan: dict) -> bool:
    """Whether a witness started from `plan` lacked everything its run's checks guarded and refused, and was bounded
    to no less memory than they asked for: then its verdict is the one the kernel's run would have led to."""
    def keys(items: list[dict]) -> set[str]:
        return {json.dumps(item, sort_keys=True) for item in items}
    asked, allowed = run.get("memory_allowance"), plan.get("memory_allowance")
    return (keys(run["guarded"]) <= keys(plan["guarded"]) and keys(run["refused"]) <= keys(plan["refused"])
            and (asked is None or (allowed is not None and allowed >= asked)))


def witness_first(server: socket.socket, control: socket.socket, header: dict, plan: dict,
                  kernel: wire.Endpoint) -> dict | None:
    """The test cell graded in a witness started from the solution's plan (what the cell's checks guard, refuse and
    ask for: autograder/witness_plans.json), without running it against the kernel first; the kernel waits, and gets
    the values the cell assigned afterwards. Its verdict stands when the witness lacked every reference its own
    checks guarded (`covered`) or when it failed; None otherwise (a stale plan): the caller grades the cell as
    without a plan, kernel first."""
    result = graded_again(server, control, header, plan["guarded"], asked_names(header["source"]), plan["refused"],
                          plan.get("memory_allowance"), pushes_for=kernel)
    ran = "guarded" in result               # the witness started and the cell ran there
    if ran and not result["error"] and not covered(plan_of(result), plan):
        return None
    with contextlib.suppress(OSError, ValueError, TypeError):
        kernel.finish(pushes=result.get("pushes", {}))
    result["witness_plan"] = {"used": True, "lists": plan_of(result) if ran else None, "stale": False}
    return result


def _reference_explained(result: dict, guarded: list[dict], refused: list[dict] = ()) -> dict:
    """A failure that reached a removed reference function says so: the learner's code called the reference; one
    that reached a refused library operator (autograder/judging/op_refusal.py) says that."""
    from autograder.judging.op_refusal import REFUSED_MARK
    from autograder.judging.reference_removal import removed_name

    error = result.get("error")
    if not error:
        return result
    text = " ".join([error.get("evalue", "")] + list(error.get("lines") or []))
    if REFUSED_MARK in text and refused:
        message = (f"{refused[0]['what']}: your code calls a library kernel that does the exercise (torch's fused "
                   "attention): graded again in a process where it is refused, it stopped working there")
        return {**result, "error": {"ename": "LibraryRefused", "evalue": message,
                                    "lines": [f"LibraryRefused: {message}"]}}
    if not guarded:
        return result
    name = removed_name(text)
    if name is None:
        return result
    what = guarded[0].get("what", "this exercise")
    message = (f"{what}: your code calls the course's reference ({name}) instead of doing the work itself (graded "
               "again in a process where the reference's code was removed, it stopped working there)")
    return {**result, "error": {"ename": "ReferenceHandedIn", "evalue": message, "lines": [f"ReferenceHandedIn: {message}"]}}


# ----------------------------------------------------------------------------- driving it from nbgrader

def _failed(ename: str, evalue: str) -> dict:
    return {"stdout": "", "stderr": "", "error": {"ename": ename, "evalue": evalue}}


def _folder_of_its_own(socket_dir: str, uid: int | None) -> Path:
    """A fresh folder for one judge's socket inside the kernel's socket folder (bound into both sandboxes), owned by
    the sandboxed judge's uid when grading runs as root: the kernel's uid can connect, not write there."""
    folder = Path(tempfile.mkdtemp(prefix="judge-", dir=socket_dir))
    if uid is not None and os.geteuid() == 0:
        os.chown(folder, uid, uid)
    folder.chmod(0o755)
    return folder


class JudgeProcess:
    """A judge for one notebook run: `run(source)` starts a cell, `result()` collects its verdict.

    Where the kernel is sandboxed (COURSE_SANDBOX set, as under autograde), the judge is too, in a sandbox of its
    own (autograder/judging/sandbox.py's bubblewrap, with the same policy): the course package and the interpreter
    read-only, no course root, gradebook, solutions/, home or instructor's environment; its own unprivileged uid,
    memory, CPU, process and file-size limits; no network; every process it starts dies with it. It shares with
    the kernel only a folder holding its socket."""

    def __init__(self, socket_dir: str, cwd: str | None = None, *, grading: bool = True, wait: bool = True) -> None:
        """grading=False: the check cells a learner runs in JupyterLab (judging/interactive.py), where a GPU-tier check
        on a machine without a GPU prints SKIPPED instead of failing (harness.require_gpu); grading gives no points
        there either way. Under nbgrader (grading=True) the judge runs as autograde unless told otherwise.
        wait=False: return once the process is started; it gets ready (imports torch, a few seconds) while the
        learner's first cells run, and `ready()` (which `run` calls) waits for it."""
        from autograder.judging import forked_judges, sandbox, socket_folder

        policy = sandbox.SandboxPolicy.from_env() if os.environ.get(sandbox.ENV_VAR) else None
        self.sandboxed = policy is not None and policy.enabled
        zygote = os.environ.get(forked_judges.ENV_VAR) if grading else None
        uid = sandbox.sandbox_uid() if self.sandboxed and not zygote else None
        folder = _folder_of_its_own(socket_dir, uid)
        self.path = str(folder / "judge.sock")
        if not socket_folder.fits(self.path):
            raise RuntimeError(f"its socket's path is longer than a Unix socket allows ({self.path}): give the "
                               "grader a shorter TMPDIR")
        ours, theirs = socket.socketpair()
        execution = {"NBGRADER_EXECUTION": os.environ.get("NBGRADER_EXECUTION", "autograde")} if grading else {}
        self.proc: Any = self._forked(zygote, theirs, execution, cwd) if zygote and zygote != "0" else None
        self.forked = self.proc is not None
        if self.proc is None:
            if zygote and self.sandboxed:     # the folder was made for the zygote's judge: a fresh one's uid
                uid = sandbox.sandbox_uid()
                if os.geteuid() == 0:
                    os.chown(folder, uid, uid)
            cmd = [sys.executable, "-P", "-m", "autograder.judging.judge", self.path, str(theirs.fileno())]
            if self.sandboxed:
                argv = sandbox.bwrap_argv(policy, cmd, submission_dir=None, socket_dir=str(folder), uid=uid,
                                          extra_env=execution)
                env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}, None
            else:
                argv, env = cmd, {**forked_judges.unsandboxed_env(), **execution}
            self.proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], cwd=cwd, env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.control = ours
        self.on_isolation: Callable[[dict], dict] | None = None
        self.witness: Any = None           # the witness of the cell being judged, while there is one
        # set while a cell with a witness plan runs: the judge asks for its witness while the kernel still serves
        # the cell (judge.witness_first), so the thread that answers isolation requests starts it
        self.start_witness_early: Callable[[dict], Any] | None = None
        self._said: queue.Queue = queue.Queue()
        self._send_lock = threading.Lock()
        self._ready = False
        if wait:
            self.ready()

    def _forked(self, zygote: str, theirs: socket.socket, execution: dict, cwd: str | None) -> Any:
        """A judge forked by the zygote (autograder/judging/judge_zygote.py), handed its control line and the kernel's
        listening socket, bound here; None when the zygote cannot give one (a fresh judge is started instead)."""
        from autograder.judging import forked_judges, sandbox

        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.path)
            os.chmod(self.path, 0o777)            # the sandboxed kernel runs under a uid of its own
            server.listen(4)
            fds = [theirs.fileno(), server.fileno()]
            if self.sandboxed:
                return forked_judges.ForkedJudge.fork(zygote, os.environ[sandbox.ENV_VAR],
                                                     execution.get("NBGRADER_EXECUTION"), fds, START_TIMEOUT_S)
            return forked_judges.ForkedJudge.fork(zygote, "", execution.get("NBGRADER_EXECUTION"), fds,
                                                 START_TIMEOUT_S, env=forked_judges.unsandboxed_env(), cwd=cwd)
        except (OSError, RuntimeError):
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            return None
        finally:
            server.close()

    def ready(self) -> None:
        """Wait until the judge says it is ready (once; RuntimeError if it never does)."""
        if self._ready:
            return
        self.control.settimeout(START_TIMEOUT_S)
        try:
            header, _ = framing.recv_frame(self.control)
        except (OSError, framing.ChannelClosed) as exc:
            self.kill()
            raise RuntimeError(f"the judge did not start: {exc}") from None
        self.control.settimeout(None)
        if not header.get("ready"):
            self.kill()
            raise RuntimeError("the judge did not start")
        self._ready = True
        # Requests to hold or measure the submission (autograder/checking/isolation.py) come at any moment of a cell,
        # while nbgrader waits on the kernel: a thread answers them; everything else the judge says is queued.
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                header, _ = framing.recv_frame(self.control)
            except (framing.ChannelClosed, OSError, ValueError):
                self._said.put(None)
                return
            if "witness" in header and self.start_witness_early is not None:
                self.witness = self._witness_for(header["witness"], self.start_witness_early)
                continue
            if "isolation" not in header:
                self._said.put(header)
                continue
            try:
                reply = self.on_isolation(header["isolation"]) if self.on_isolation else {}
            except Exception as exc:       # noqa: BLE001  (the check fails and says why)
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            self._send({"isolation_reply": reply})

    def _send(self, header: dict) -> None:
        with self._send_lock:
            framing.send_frame(self.control, header, {})

    def run(self, source: str, token: str, timeout: float, witness: bool = False, plan: dict | None = None) -> None:
        """Start a test cell. `witness`: the judge may ask for a witness (see `result`); `plan`: its witness plan
        (autograder/judging/witness_plans.py): then set `start_witness_early` before the kernel serves the cell."""
        self.ready()
        self._send({"op": "cell", "source": source, "token": token, "timeout": timeout, "witness": witness,
                    **({"plan": plan} if plan is not None else {})})

    def result(self, wait: float, start_witness: Callable[[dict], Any] | None = None) -> dict:
        """The verdict of the cell started last, once the kernel has stopped serving it: the judge is finishing,
        or still waiting for a connection that will not come (it is told to give up). A judge that says nothing
        within `wait` seconds (a kernel that holds the connection open and went on) is a failed cell.

        A judge that asks for a witness gets one: `start_witness(request)` (a `witness.Witness`), killed
        once the verdict is in; the wait starts again, and a witness that stops early ends it."""
        with contextlib.suppress(OSError):
            self._send({"op": "abort"})
        witness = None
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    header = self._said.get(timeout=max(0.01, min(WITNESS_POLL_S, deadline - time.monotonic())))
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        return _failed("JudgeTimeout", "the kernel stopped serving the grader but held on to its "
                                       "connection")
                    if witness is not None and not witness.running():
                        self._send({"op": "abort"})      # the judge stops waiting for it
                        witness.kill()
                        witness = None
                    continue
                if header is None:
                    raise framing.ChannelClosed()
                if "witness" not in header:
                    return header["result"]
                witness = self._witness_for(header["witness"], start_witness)
                self.witness = witness
                deadline = time.monotonic() + wait
        except (framing.ChannelClosed, OSError):
            return _failed("JudgeFailed", "the grader's judge process stopped")
        finally:
            early, self.witness, self.start_witness_early = self.witness, None, None
            for started in {id(w): w for w in (witness, early) if w is not None}.values():
                started.kill()

    def _witness_for(self, request: dict, start_witness: Callable[[dict], Any] | None) -> Any:
        if self.witness is not None:      # one witness at a time: a stale plan's, before the cell's second
            self.witness.kill()
            self.witness = None
        try:
            if start_witness is None:
                raise RuntimeError("this grader starts no witness")
            witness = start_witness(request)
        except Exception as exc:       # noqa: BLE001  (the judge fails the cell and says why)
            self._send({"op": "witness-failed", "why": f"{type(exc).__name__}: {exc}"})
            return None
        self._send({"op": "witness-started"})
        return witness

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.control.close()
        self._remove_socket()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send({"op": "quit"})
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.control.close()
        self._remove_socket()

    def _remove_socket(self) -> None:
        """A forked judge cannot see its socket's folder (the grading process bound it): removed here, as a fresh
        judge removes its own when it ends without a word (`_leave_nothing`)."""
        if self.forked:
            _leave_nothing(self.path)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
