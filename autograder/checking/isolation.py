"""The judge's side of holding the submission while it measures: timings no neighbour can bend, memory bounds no
process can lift.

The judge runs in a sandbox of its own and cannot touch the submission's processes; the grading process can
(autograder/judging/submission_processes.py). A check asks it through the judge's control channel:

    with submission_stopped():            # every process of the submission stopped: the judge times its baseline
        t = time_call(baseline)
    seconds = time_alone(learner_call)    # all but the serving process stopped; the call's time is the larger of
                                          # its wall time and the CPU time the submission's processes used meanwhile
    if bound_witness_memory(512 << 20):   # True in the witness, started with its address space bounded to what
        learner_call()                    # torch maps plus 512 MiB: an N x N matrix cannot be held there

Outside grading (a check run in one process, a learner's JupyterLab) no grading process answers: nothing is held,
`time_alone` is the wall time, and the checks fall back on what they did before. A memory bound needs no grading
process: the witness sets it on itself at its start, before it replays any learner cell.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

__all__ = ["connect", "set_phase", "available", "submission_stopped", "time_alone", "bound_witness_memory",
           "requested_allowance", "set_witness_allowance", "CPU_SLACK_S"]

CPU_SLACK_S = 0.02          # /proc counts CPU time in clock ticks (10 ms): two ticks of rounding are not the learner's

_ask: Callable[[dict], dict] | None = None
_phase = "kernel"


def connect(ask: Callable[[dict], dict] | None) -> None:
    """Set by the judge process: `ask(request) -> reply` goes to the grading process (None: nobody answers)."""
    global _ask
    _ask = ask


def set_phase(phase: str) -> None:
    """"kernel" or "witness": which process serves the judge now."""
    global _phase
    _phase = phase


def available() -> bool:
    return _ask is not None


def _request(**request: Any) -> dict:
    if _ask is None:
        return {}
    reply = _ask({**request, "phase": _phase})
    if reply.get("error"):
        raise RuntimeError(f"the grading process could not hold the submission: {reply['error']}")
    return reply


@contextlib.contextmanager
def submission_stopped() -> Iterator[None]:
    """Every process of the submission stopped for the block (nothing of it can run beside the judge's own work)."""
    _request(do="stop_all")
    try:
        yield
    finally:
        _request(do="resume")


def time_alone(call: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of call(), a call into the learner's code, with every other process of the submission
    stopped; seconds is the larger of the wall time and the CPU time the submission used meanwhile (less
    CPU_SLACK_S of rounding), so threads or processes started to work beside it gain nothing."""
    _request(do="stop_others")
    try:
        start = time.perf_counter()
        result = call()
        wall = time.perf_counter() - start
    finally:
        reply = _request(do="resume")
    return max(wall, reply.get("cpu_seconds", 0.0) - CPU_SLACK_S), result


def bound_witness_memory(allowance_bytes: int) -> bool:
    """Ask that the witness grading this cell again start with its address space bounded (RLIMIT_AS, soft and hard,
    set by the witness's own trusted start before any learner code runs there, so no learner code can lift it or
    reserve room ahead) to what torch and IPython map plus `allowance_bytes`. True only in that witness, where the
    bound holds; elsewhere (the kernel, a run without a witness) False."""
    _REQUESTED.append(int(allowance_bytes))
    return _phase == "witness" and _witness_allowance is not None and _witness_allowance >= allowance_bytes


def requested_allowance() -> int | None:
    """The largest witness memory allowance the checks asked for since the last call (and forget them)."""
    out = max(_REQUESTED) if _REQUESTED else None
    _REQUESTED.clear()
    return out


def set_witness_allowance(allowance: int | None) -> None:
    """Set by the judge: the allowance the witness now serving was started with (None: no bound)."""
    global _witness_allowance
    _witness_allowance = allowance


_REQUESTED: list[int] = []
_witness_allowance: int | None = None
