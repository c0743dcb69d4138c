"""Start N ranks, run a function on each, return the results; a failing or hung rank is an error, not a hang.

    results = run_ranks(worker, 2)                  # worker(comm, *args) on 2 gloo ranks (forked processes)
    results = run_ranks(worker, 2, backend="threads")   # the same on threads of this process (no ports)
    out = torchrun("minigpt.parallel.generate_tp", 2, ["--max-new-tokens", "8"])   # real torchrun, rank 0's JSON

`run_ranks` forks (so functions defined in a notebook work), binds the rendezvous to 127.0.0.1 on a free
port, gives torch.distributed a timeout for initialisation and for every collective, and waits at most
`timeout_s` for all ranks. A rank that raises, exits or does not finish is named in a `RankError`; the
other ranks are then stopped, so no process outlives the call.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from datetime import timedelta
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from minigpt.parallel.comm import CountingComm, ThreadGroup, TorchDistributed
from minigpt.paths import library_dirs

__all__ = ["RankError", "free_port", "run_ranks", "torchrun", "init_from_env"]

Worker = Callable[..., Any]


class RankError(RuntimeError):
    """One or more ranks failed; the message names each of them and what happened."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn: Worker, world_size: int, *args: Any, backend: str = "gloo", timeout_s: float = 60.0,
              collective_timeout_s: float = 20.0) -> list[Any]:
    """Run fn(comm, *args) on `world_size` ranks; return every rank's result, in rank order.

    backend: "gloo" (a forked process per rank, torch.distributed on CPU) or "threads".
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend == "threads":
        return _run_threads(fn, world_size, args, timeout_s, collective_timeout_s)
    if backend != "gloo":
        raise ValueError(f"unknown backend {backend!r}; use 'gloo' or 'threads' (NCCL ranks: start them with torchrun)")
    return _run_processes(fn, world_size, args, timeout_s, collective_timeout_s)


# ------------------------------------------------------------------------------------------- threads

def _run_threads(fn: Worker, n: int, args: tuple, timeout_s: float, collective_timeout_s: float) -> list[Any]:
    group = ThreadGroup(n, timeout=collective_timeout_s)
    results: list[Any] = [None] * n
    errors: dict[int, str] = {}

    def target(rank: int) -> None:
        try:
            results[rank] = fn(CountingComm(group.member(rank)), *args)
        except BaseException as err:                         # noqa: BLE001 - reported below, naming the rank
            errors[rank] = f"{type(err).__name__}: {err}"
            group.abort()

    threads = [threading.Thread(target=target, args=(r,), daemon=True, name=f"rank{r}") for r in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        group.abort()
    _raise_if_failed(errors, {r: f"did not finish within {timeout_s:g} s" for r in hung})
    return results


# ------------------------------------------------------------------------------------------- processes

def _callers_frames(err: BaseException, limit: int = 4) -> str:
    """The last `limit` frames of err's traceback that are the caller's code: not this package's, not a library's
    or the standard library's (a learner's worker shows their own lines, not launch.py once per rank)."""
    inside = [Path(__file__).resolve().parents[1], *library_dirs()]
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")
              and not any(Path(f.filename).resolve().is_relative_to(d) for d in inside)]
    return "".join(traceback.format_list(frames[-limit:]))


def _child(fn: Worker, rank: int, n: int, port: int, args: tuple, conn: Connection, collective_timeout_s: float) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                                timeout=timedelta(seconds=collective_timeout_s))
        try:
            result = fn(CountingComm(TorchDistributed()), *args)
        finally:
            dist.destroy_process_group()
        payload = pickle.dumps(("ok", result))
    except BaseException as err:                             # noqa: BLE001 - sent to the parent
        payload = pickle.dumps(("error", f"{type(err).__name__}: {err}\n{_callers_frames(err)}"))
    conn.send_bytes(payload)
    conn.close()


def _run_processes(fn: Worker, n: int, args: tuple, timeout_s: float, collective_timeout_s: float) -> list[Any]:
    ctx = get_context("fork")
    port = free_port()
    pipes, procs = [], []
    for rank in range(n):
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, n, port, args, child_end, collective_timeout_s),
                        name=f"rank{rank}", daemon=True)
        with warnings.catch_warnings():       # Python >= 3.12 warns about fork in a threaded process (a Jupyter kernel)
            warnings.simplefilter("ignore", DeprecationWarning)
            p.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(p)
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    waiting = {pipes[r]: r for r in range(n)}
    deadline = time.monotonic() + timeout_s
    try:
        while waiting and not errors and time.monotonic() < deadline:
            for conn in wait(list(waiting), timeout=max(0.0, min(0.5, deadline - time.monotonic()))):
                rank = waiting.pop(conn)
                try:
                    status, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    procs[rank].join(1.0)
                    status, value = "error", f"exited with code {procs[rank].exitcode} without a result"
                (results if status == "ok" else errors)[rank] = value
        if errors:                          # give the others a moment to report their side (e.g. a timeout)
            grace = time.monotonic() + 2.0
            while waiting and time.monotonic() < grace:
                for conn in wait(list(waiting), timeout=0.2):
                    rank = waiting.pop(conn)
                    try:
                        status, value = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        status, value = "error", "exited without a result"
                    if status != "ok":
                        errors[rank] = value
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5.0)
        for c in pipes:
            c.close()
    hung = {r: f"did not finish within {timeout_s:g} s (killed)" for r in waiting.values()} if not errors else \
        {r: "stopped after another rank failed" for r in waiting.values()}
    _raise_if_failed(errors, hung)
    return [results[r] for r in range(n)]


def _raise_if_failed(errors: dict[int, str], others: dict[int, str]) -> None:
    if not errors and not others:
        return
    # In the order the reports arrived: the first is usually the cause, later ones its consequences
    # (a peer's connection reset or collective timeout).
    by_message: dict[str, list[int]] = {}                   # every rank failing alike: said once
    for r, msg in errors.items():
        by_message.setdefault(msg.strip(), []).append(r)
    lines = [f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, sorted(rs)))} failed: {msg}" for msg, rs in by_message.items()]
    lines += [f"rank {r} {msg}" for r, msg in sorted(others.items())]
    raise RankError("\n".join(lines))


# ------------------------------------------------------------------------------------------- torchrun

def init_from_env(backend: str | None = None, timeout_s: float = 60.0) -> CountingComm:
    """Inside a torchrun worker: init the default process group from RANK/WORLD_SIZE/MASTER_* with a timeout."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return CountingComm(TorchDistributed())


def torchrun(module: str, nproc: int, args: Sequence[str] = (), *, timeout_s: float = 120.0) -> dict[str, Any]:
    """`torchrun --nproc-per-node nproc -m module args --out FILE` on 127.0.0.1; returns rank 0's JSON.

    The whole process group is killed at the timeout; a failure raises RankError with torchrun's report
    (which names the failed rank and its exit code).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", module, *args, "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": tmp}   # its logs too
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            raise RankError(f"torchrun {module} did not finish within {timeout_s:g} s (all ranks killed); "
                            f"last output:\n{log[-1500:]}") from None
        if proc.returncode != 0:
            raise RankError(f"torchrun {module} failed with exit code {proc.returncode}:\n{_failure_summary(log)}")
        if not out.exists():
            raise RankError(f"torchrun {module} exited cleanly but rank 0 wrote no result to {out}")
        return json.loads(out.read_text())


def _failure_summary(log: str) -> str:
    """The workers' exception lines, then torchrun's 'Root Cause' block (names the rank and exit code)."""
    errors = [line.strip() for line in log.splitlines() if re.match(r"^(\[rank\d+\]:)?\s*\w+(Error|Exception|Timeout)\b.*:", line)]
    i = log.find("Root Cause")
    cause = log[i:][:1500] if i >= 0 else log[-1500:]
    return "\n".join(list(dict.fromkeys(errors))[-3:] + [cause])
