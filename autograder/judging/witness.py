"""The witness: the learner's cells again, in a process of their own whose course package lacks the exercise's
reference (a fork, for each test cell, of one process per notebook that imported torch and nothing else).

What the learner's kernel reports about its own code (that it did not call the reference, its trace) is the
kernel's to forge: a notebook can rewrite the course's serving loop or guards there. So a test cell whose checks
refuse the reference, once it has passed against the kernel, is graded again against a witness (or, when the cell's
witness plan is known, autograder/judging/witness_plans.py, graded in the witness alone, the kernel waiting):

    grading process (trusted)            judge (trusted)                    witness (learner's code, sandboxed)
    StoppingExecute <--- "witness": the references the cell's checks refused, the names it reads
      copy of minigpt without them (autograder/judging/reference_removal.py), bound over the package's folder
      start (fork) ----------------------------------------------------> replay the cells that define those names
                                         exec(test cell) again <-------> serve, as the kernel does
    <------------------------------------ the second verdict is the cell's

Guaranteed: the verdict is the second run's, and in that process the reference's code exists nowhere (not in
memory, not on disk where it is sandboxed): a subclass that calls `super()`, a wrapper, a replaced serving loop
or guard, or the package's source read from disk and run, all find a function that raises. Not guaranteed:
code pasted from the reference into a cell (`make similarity` reports it), and evidence other than the
reference's absence that the witness reports about itself (a tensor trace, a count, a timing), which learner
code replayed there could still forge (README, "Who decides a test cell's grade").

Which cells are replayed: those that define the names the test cell reads, and, going back, the names those cells
read (a slice at cell granularity: a cell that only prints, plots or measures is not run again). Test cells are
never replayed (they are the judge's).

`python -m autograder.judging.witness JUDGE_SOCKET` reads {"cells": [...], "names": [...], "token": ...} on stdin.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

__all__ = ["cells_needed", "cells_to_run", "WitnessProcess", "Witness"]

ANY_NAME = "*"      # `from m import *` defines names no parser can list


def _defined_and_read(source: str) -> tuple[set[str], set[str]]:
    """(names a cell binds at its top level, names it reads anywhere); a cell that does not parse: neither."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(), set()
    defined: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(statement.name)
            continue
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            defined |= {ANY_NAME if a.name == "*" else (a.asname or a.name).split(".")[0] for a in statement.names}
            continue
        defined |= {n.id for n in _walk_scope(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return defined, _notebook_reads(source, tree) - set(dir(builtins))


def _notebook_reads(source: str, tree: ast.AST) -> set[str]:
    """The names a cell reads from the notebook's namespace: those its top level reads, and those its functions,
    classes, lambdas and comprehensions read as globals (a function's parameters and locals are its own). A cell
    Python's symbol table refuses (`return` at the top level): every name it loads anywhere."""
    import symtable

    try:
        todo = [symtable.symtable(source, "<cell>", "exec")]
    except SyntaxError:
        return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    reads: set[str] = set()
    while todo:
        table = todo.pop()
        top = table.get_type() == "module"
        reads |= {sym.get_name() for sym in table.get_symbols()
                  if sym.is_referenced() and (top or sym.is_global())}
        todo.extend(table.get_children())
    return reads


def _walk_scope(node: ast.AST) -> Iterable[ast.AST]:
    """ast.walk, not entering the bodies of functions, lambdas and classes defined inside."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                todo.append(child)


def cells_needed(sources: list[str], names: Iterable[str]) -> list[int]:
    """Indices of the cells to replay so that `names` are defined as the notebook defined them: going back from
    the last cell, each cell that binds a needed name, and then the names that cell reads."""
    needed, chosen = set(names), []
    for index in range(len(sources) - 1, -1, -1):
        defined, read = _defined_and_read(sources[index])
        if defined & needed or (ANY_NAME in defined and needed):
            chosen.append(index)
            needed |= read
    return sorted(chosen)


def _read_before_bound(source: str) -> set[str]:
    """The names a cell reads from what cells before it bound: those a statement reads that no statement before it
    bound, looking into the blocks of `for`, `while`, `if`, `with` and `try` statement by statement (a name a
    loop's body binds before reading it is the loop's; a `for` or `with` target counts as bound in its body).
    Builtins included (cells_to_run drops those no cell rebinds). A cell that does not parse: none (it fails
    whatever runs before it)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return _live_in(tree.body, set())


def _live_in(block: list[ast.stmt], bound: set[str]) -> set[str]:
    """Names `block` reads before binding them, given the names `bound` before it. A statement's bindings count for
    the statements after it in its block; what a compound statement's inner blocks bind counts after the whole
    statement (as in `_defined_and_read`), never for a sibling block (an `else`, a handler)."""
    bound, live = set(bound), set()
    for statement in block:
        alone = ast.Module(body=[statement], type_ignores=[])
        text = ast.unparse(alone)
        if isinstance(statement, (ast.For, ast.AsyncFor)):
            live |= _reads(statement.iter) - bound
            target = {n.id for n in ast.walk(statement.target) if isinstance(n, ast.Name)}
            live |= _live_in(statement.body, bound | target) | _live_in(statement.orelse, bound)
        elif isinstance(statement, ast.While):
            live |= _reads(statement.test) - bound
            live |= _live_in(statement.body, bound) | _live_in(statement.orelse, bound)
        elif isinstance(statement, ast.If):
            live |= _reads(statement.test) - bound
            live |= _live_in(statement.body, bound) | _live_in(statement.orelse, bound)
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            live |= set().union(*(_reads(i.context_expr) for i in statement.items)) - bound
            targets = {n.id for i in statement.items if i.optional_vars is not None
                       for n in ast.walk(i.optional_vars) if isinstance(n, ast.Name)}
            live |= _live_in(statement.body, bound | targets)
        elif isinstance(statement, ast.Try):
            live |= _live_in(statement.body, bound) | _live_in(statement.orelse, bound) | \
                _live_in(statement.finalbody, bound)
            for handler in statement.handlers:
                live |= (_reads(handler.type) if handler.type else set()) - bound
                live |= _live_in(handler.body, bound | ({handler.name} if handler.name else set()))
        else:
            augmented = {statement.target.id} if isinstance(statement, ast.AugAssign) and \
                isinstance(statement.target, ast.Name) else set()          # `x += 1` reads x (symtable: only binds)
            live |= (_notebook_reads(text, alone) | augmented) - bound
        bound |= _defined_and_read(text)[0]
    return live


def _reads(expression: ast.expr) -> set[str]:
    """The notebook's names an expression reads (its lambdas and comprehensions included)."""
    module = ast.Module(body=[ast.Expr(expression)], type_ignores=[])
    return _notebook_reads(ast.unparse(module), module)


# Builtins that call a lambda, or consume a generator, handed to them before they return, and keep neither
# (`max(rows, key=lambda r: r[col])`, `sum(x * w for x in xs)`); cells_to_run drops any a notebook binds itself.
CONSUMED_BY = frozenset({"all", "any", "dict", "frozenset", "list", "max", "min", "next", "set", "sorted", "sum",
                         "tuple"})
_RUN_AT_ONCE = ("listcomp", "setcomp", "dictcomp")     # comprehensions Python 3.11 gives a scope of their own


class _RunAtOnce(ast.NodeTransformer):
    """A cell's top-level code with each lambda or generator expression handed straight to a consumer replaced by
    what it evaluates, run there: a lambda by its body, a generator expression by a list comprehension. Function
    and class bodies are left as they are (what runs in them runs when they are called)."""

    def __init__(self, consumers: frozenset[str]) -> None:
        self.consumers = consumers

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in self.consumers:
            node.args = [self._run(a) for a in node.args]
            node.keywords = [ast.keyword(k.arg, self._run(k.value)) for k in node.keywords]
        return node

    def _run(self, value: ast.expr) -> ast.expr:
        if isinstance(value, ast.Lambda):          # its parameters now read as the cell's: only more is kept
            return self.visit(value.body)
        if isinstance(value, ast.GeneratorExp):
            return self.visit(ast.ListComp(value.elt, value.generators))
        return value


def _read_when_called(source: str, consumers: frozenset[str] = CONSUMED_BY) -> set[str]:
    """The globals a cell's functions, classes, lambdas and generator expressions read: read whenever they are
    called, so a cell anywhere in the notebook may be the one that bound them. What runs where it stands reads
    only what the cell's own code reads (`_read_before_bound`): a list, set or dict comprehension at the cell's
    top level, and a lambda or generator expression handed straight to one of `consumers` there (what either
    holds, a lambda inside, is still read when called). Builtins included, as in `_read_before_bound`."""
    import symtable

    try:
        tree = _RunAtOnce(consumers).visit(ast.parse(source))
        module = symtable.symtable(ast.unparse(ast.fix_missing_locations(tree)), "<cell>", "exec")
    except SyntaxError:
        return set()
    reads: set[str] = set()
    todo = [(child, True) for child in module.get_children()]
    while todo:
        table, top = todo.pop()
        if top and table.get_type() == "function" and table.get_name() in _RUN_AT_ONCE:
            todo.extend((child, True) for child in table.get_children())
            continue
        reads |= {sym.get_name() for sym in table.get_symbols() if sym.is_referenced() and sym.is_global()}
        todo.extend((child, False) for child in table.get_children())
    return reads


def cells_to_run(sources: list[str], kept: Iterable[int]) -> list[int]:
    """Indices of the cells a grade depends on: the `kept` cells (the learner's, the test cells) and, going back
    from the last cell, each cell that binds a name that a cell after it which runs reads before binding it
    (`_read_before_bound`), or that a function of a cell which runs reads as a global (`_read_when_called`: a
    cell anywhere may bind it; found again until nothing new is needed). A cell that binds `*` runs whenever a
    name is needed."""
    kept, anywhere = set(kept), set()
    defined = [_defined_and_read(s)[0] for s in sources]
    bound = set().union(*defined)
    builtin = set(dir(builtins)) - bound                 # a builtin the notebook rebinds is read from the notebook
    consumers = CONSUMED_BY - bound if ANY_NAME not in bound else frozenset()
    cells = [(d, _read_before_bound(s) - builtin, _read_when_called(s, consumers) - builtin)
             for d, s in zip(defined, sources)]
    while True:
        needed, chosen, called = set(anywhere), [], set()
        for index in range(len(sources) - 1, -1, -1):
            defined, before_bound, when_called = cells[index]
            if index in kept or defined & needed or (ANY_NAME in defined and needed):
                chosen.append(index)
                needed |= before_bound
                called |= when_called
        if called <= anywhere:
            return sorted(chosen)
        anywhere |= called


# ----------------------------------------------------------------------------- the witness process

# One process per graded notebook imports torch and IPython, and nothing of the course or the learner's, then forks
# one child per witnessed test cell: a child replays the learner's cells and serves the judge; the next starts only
# once the last one and everything it started are gone and what it could leave has been wiped. That import cost
# about 2 s of a core in every witness (1.6 s torch, by -X importtime), paid once per notebook now.
#
# What one child could hand the next (the reference a later cell's witness lacks, when its own copy still had it),
# and what ends each channel, in the sandbox (`--contained`: its own pid, IPC and network namespaces):
#   processes left running          kill(-1) until /proc holds nobody but the bubblewrap init and this process
#   files (/tmp, /dev/shm, any       put back as they were before the first child (sandbox_reset.py); the
#   read-write mount)               submission copied into /tmp/work again, as the sandbox's boot did
#   System V shared memory,         removed by id (/proc/sysvipc); POSIX message queues cannot be created
#   semaphores, message queues      (RLIMIT_MSGQUEUE 0)
#   this process's memory           not dumpable: a child can neither ptrace it nor read /proc/PID/mem;
#                                   its pipes to the grading process are closed in the child
#   the package's copy              read-only there; the grading process rewrites it between children
# Unsandboxed (a local `make grade`, where nothing is claimed against the learner), a child is a session of its
# own and is killed with its process group.

ENDED = b"end"          # grading process -> this process: the test cell's verdict is in
EXITED = b"exited"      # this process -> grading process: the child stopped by itself
READY = b"ready"        # this process -> grading process: the child and all it left are gone
PR_SET_DUMPABLE = 4


def main(argv: list[str]) -> int:
    """`python -P -m autograder.judging.witness JUDGE_SOCKET [--contained]`: import torch and IPython, then
    fork a witness for each request line on stdin (JSON), ending it on a line `end`."""
    path, *flags = argv
    contained = "--contained" in flags
    import resource

    import torch
    from IPython.core.interactiveshell import InteractiveShell  # noqa: F401  (imported once, for every child)

    torch.set_num_threads(1)
    _set_dumpable(False)
    work, baseline = os.getcwd(), None
    if contained:
        from autograder.judging import sandbox_reset

        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
        with contextlib.suppress(sandbox_reset.Unrestorable):        # then: one child, and this process stops
            baseline = sandbox_reset.snapshot()
    lines = _Lines(0)
    while (line := lines.next(None)) is not None:
        request = json.loads(line)
        child = os.fork()
        if child == 0:
            code = 1
            try:
                code = _witness(path, request, contained)
            finally:
                os._exit(code)
        ended = _watch(child, lines)
        baseline = _clear(child, contained, baseline, work)
        if not ended:
            return 0
        os.write(1, READY + b"\n")
    return 0


def _witness(path: str, request: dict, contained: bool) -> int:
    """A forked child: replay the cells that define what the test cell reads, then serve the judge."""
    import importlib

    if not contained:
        os.setsid()
    _set_dumpable(True)                 # an ordinary process for learner code; its parent stays undumpable
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):                # the parent's pipes to the grading process go
        os.dup2(devnull, fd)
    importlib.invalidate_caches()       # the package's copy was written after the parent started
    token = request["token"]
    bound_memory(request.get("memory_allowance"))
    from autograder.judging.op_refusal import refuse_ops

    for refusal in request.get("refused", []):       # before any learner code exists here
        refuse_ops(refusal["ops"], refusal["what"])
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    sources = request["cells"]
    python = [shell.transform_cell(source) for source in sources]
    for index in cells_needed(python, request["names"]):
        shell.run_cell(sources[index], store_history=False)      # an error here: the check will say what failed

    from autograder.judging import observe

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    with sock:
        endpoint = observe.kernel_endpoint(sock, shell.user_ns)
        endpoint.hello(token)
        endpoint.serve()
    return 0


def _watch(child: int, lines: "_Lines") -> bool:
    """Until the grading process says `end` (True) or closes the pipe (False); says `exited` if the child stops."""
    exited = False
    while True:
        if not exited and os.waitpid(child, os.WNOHANG)[0] == child:
            exited = True
            os.write(1, EXITED + b"\n")
        line = lines.next(0.1)
        if line is None and lines.closed:
            return False
        if line == ENDED:
            return True


def _clear(child: int, contained: bool, baseline: dict | None, work: str) -> dict | None:
    """End the child and whatever it started, and (contained) undo what it could leave for the next one; the next
    baseline of the sandbox's writable file systems (autograder/judging/sandbox_reset.py)."""
    import signal
    import time

    if not contained:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)
        return None
    from autograder.judging import sandbox_reset

    me = os.getpid()
    for _ in range(500):
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)          # in this pid namespace: all but init and this process
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]:
            break
        time.sleep(0.01)
    else:
        raise RuntimeError("processes a witness started outlived it")
    if baseline is None:
        raise sandbox_reset.Unrestorable("no baseline of the sandbox's writable file systems")
    baseline = sandbox_reset.restore(baseline, work)
    _remove_ipc()
    os.chdir(work)
    return baseline


def _remove_ipc() -> None:
    """Remove the System V shared memory segments, semaphore sets and message queues of this IPC namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    remove = {"shm": lambda i: libc.shmctl(i, ipc_rmid, None), "sem": lambda i: libc.semctl(i, 0, ipc_rmid),
              "msg": lambda i: libc.msgctl(i, ipc_rmid, None)}
    for kind, rm in remove.items():
        for row in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            if rm(int(row.split()[1])) != 0:
                raise OSError(ctypes.get_errno(), f"cannot remove System V {kind} {row.split()[1]}")


def _set_dumpable(dumpable: bool) -> None:
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)


class _Lines:
    """Lines read from a file descriptor, with a timeout (`next(None)` waits as long as it takes)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.closed = fd, b"", False

    def next(self, timeout: float | None) -> bytes | None:
        """The next line without its newline, or None: the timeout passed, or the pipe closed (`closed`)."""
        import select

        while b"\n" not in self.buffer:
            if self.closed or not select.select([self.fd], [], [], timeout)[0]:
                return None
            data = os.read(self.fd, 1 << 16)
            if not data:
                self.closed = True
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def bound_memory(allowance: int | None) -> None:
    """RLIMIT_AS, soft and hard, set to what this process maps now (torch and IPython imported, no learner cell
    run yet) plus `allowance` bytes, when a check asked for it (autograder/checking/isolation.py): learner code
    replayed here can neither lift a hard limit nor reserve room before it, so a call that needs more fails."""
    import resource

    if not allowance:
        return
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + int(allowance)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


# ----------------------------------------------------------------------------- starting it, from the grading process

READY_S = 30.0       # how long the grading process waits for the witness process to clear up after a child


class WitnessProcess:
    """The witness process of one graded notebook: it imports torch and IPython, then forks one `Witness` per
    test cell that asks (`start`), each seeing the notebook's learner cells before that cell and a copy of the
    package without the references in its request, connecting to the judge's socket with the request's token.

    Sandboxed like the kernel wherever the kernel is (COURSE_SANDBOX): its own uid, the same limits, the
    submission's folder read-only, the package copy bound over the course package's folder, and of the kernel's
    socket folder only the judge's socket, read-only: nothing the kernel wrote there (the reference's source, when
    grading runs as one user and the kernel may write the judge's folder) reaches a witness. Unsandboxed (a local
    `make grade`), the copy comes first on PYTHONPATH; the package's files stay readable there.

    Started when a notebook first asks for a witness, killed when its grading ends (`kill`). The copy is written
    only while no child runs: a witness never sees another test cell's copy."""

    def __init__(self, judge_socket: str, submission_dir: str | None) -> None:
        from autograder.judging import sandbox
        from autograder.paths import REPO_ROOT, SHARED_DIR

        self.judge_socket = judge_socket
        self.folder = Path(tempfile.mkdtemp(prefix="witness-"))
        self.shadow = self.folder / "shared"
        self.shadow.mkdir()
        self.child: Witness | None = None
        cmd = [sys.executable, "-P", "-m", "autograder.judging.witness", judge_socket]
        policy = sandbox.SandboxPolicy.from_env() if os.environ.get(sandbox.ENV_VAR) else None
        self.sandboxed = policy is not None and policy.enabled
        if self.sandboxed:
            sandbox._make_readable(self.folder)
            packages = policy.package_dirs or sandbox.default_package_dirs()
            replace = {d: str(self.shadow) for d in packages if Path(d).resolve() == SHARED_DIR.resolve()}
            argv = sandbox.bwrap_argv(policy, cmd + ["--contained"], submission_dir=submission_dir, socket_dir=None,
                                      socket_file=judge_socket, replace=replace,
                                      extra_env={"NBGRADER_EXECUTION": "autograde"})
            env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}, None
        else:
            argv, cwd = cmd, submission_dir
            env = {"MINIGPT_DATA_DIR": str(REPO_ROOT / "data"),      # the copy's own folder has no data/ beside it
                   **os.environ, "PYTHONPATH": os.pathsep.join([str(self.shadow), str(REPO_ROOT)]), "MPLBACKEND": "Agg",
                   "IPYTHONDIR": str(self.folder / "ipython"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "PYTHONDONTWRITEBYTECODE": "1"}       # the copy is rewritten between children: no stale bytecode
            env.pop(sandbox.ENV_VAR, None)
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self._said = _Lines(self.proc.stdout.fileno())      # what the process says: exited, ready

    def start(self, request: dict, cells: list[str]) -> "Witness":
        """Write the package's copy without the request's references, then fork a witness for the request."""
        from autograder.judging import sandbox
        from autograder.judging.reference_removal import package_without

        if self.child is not None:
            raise RuntimeError("a witness is still running")
        if not self.running():
            raise RuntimeError("the witness process stopped")
        _clear_folder(self.shadow)
        package_without(request["removals"], self.folder)
        if self.sandboxed:
            sandbox._make_readable(self.folder)
        line = json.dumps({"cells": cells, "names": request["names"], "token": request["token"],
                           "refused": request.get("refused", []),
                           "memory_allowance": request.get("memory_allowance")}).encode()
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()
        self.child = Witness(self)
        return self.child

    def running(self) -> bool:
        return self.proc.poll() is None

    def end_child(self) -> None:
        """End the running witness and wait until all it left is gone; a process that does not say so is killed
        (the next `start` fails and the grading process starts another)."""
        child, self.child = self.child, None
        if child is None or not self.running():
            return
        try:
            self.proc.stdin.write(ENDED + b"\n")
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            return
        import time

        deadline = time.monotonic() + READY_S
        while (line := self._said.next(max(0.0, deadline - time.monotonic()))) != READY:
            if line is None:
                self.kill()
                return

    def child_stopped(self) -> bool:
        """Whether the running child said it stopped (or the whole process did)."""
        if not self.running():
            return True
        while (line := self._said.next(0)) is not None:
            if line == EXITED:
                return True
        return False

    def kill(self) -> None:
        import shutil

        from autograder.processes import kill_group

        self.child = None
        kill_group(self.proc)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Witness:
    """One test cell's witness: a child of the notebook's `WitnessProcess`."""

    def __init__(self, process: WitnessProcess) -> None:
        self.process = process
        self.proc = process.proc          # the sandbox's root: the submission's processes descend from it
        self._stopped = False

    def running(self) -> bool:
        self._stopped = self._stopped or self.process.child is not self or self.process.child_stopped()
        return not self._stopped

    def serving_pid(self) -> int | None:
        """This witness's process id, as the grading process sees it: the child of the witness process (under
        bubblewrap, the root's oldest process that is not bubblewrap)."""
        from autograder.judging.submission_processes import SubmissionProcesses
        from autograder.processes import children

        parent = SubmissionProcesses.serving(self.proc.pid)
        forked = children(parent) if parent else []
        return forked[0] if len(forked) == 1 else None

    def kill(self) -> None:
        """End this witness (the process goes on for the next test cell)."""
        if self.process.child is self:
            self.process.end_child()
        self._stopped = True


def _clear_folder(folder: Path) -> None:
    import shutil

    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
