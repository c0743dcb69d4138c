"""The kernel's side of a judged check: answer the judge's requests about the learner's objects, then return.

The grader never runs a test cell in the learner's kernel. Where the cell was, the kernel runs

    import autograder.judging.observe; autograder.judging.observe.serve("/path/judge.sock", "token")

which connects to the judge (autograder/judging/judge.py), hands it the notebook's names it asks for (values as data,
functions and objects as handles: autograder/checking/wire.py), runs the learner's code on the inputs the judge sends,
and returns when the judge has its verdict. Names the test cell assigns (plain data only) are set here too, so
later cells see them. What the kernel prints while serving is not part of the grade.

A judged call can ask for two observations of the learner's code, made here because that code runs here:
a tensor trace (`autograder.checking.tensor_trace`) and a watch for calls into the reference (`no_calls_into`);
and for conditions to run it under (`autograder.checking.call_conditions`: torch's default device moved off the
CPU, a deadline).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Callable

from autograder.checking import wire


def serve(path: str, token: str) -> None:
    """Serve the judge waiting at the Unix socket `path` until it sends its verdict."""
    from IPython import get_ipython

    names = get_ipython().user_ns
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    try:
        endpoint = kernel_endpoint(sock, names)
        endpoint.hello(token)
        done = endpoint.serve()
        names.update(done.get("pushes") or {})
    finally:
        sock.close()


def kernel_endpoint(sock: socket.socket, names: dict[str, Any]) -> wire.Endpoint:
    """The kernel's end of a conversation: `names` answers the judge's lookups, calls run under `observed_call`."""
    endpoint = wire.Endpoint(sock, names=names, on_call=observed_call)
    endpoint.describe_error = learner_frames
    return endpoint


def learner_frames(err: BaseException) -> list[str]:
    """Where in the learner's cells an error passed ("Cell In[9], line 2, in count_parameters" and the line), so
    the judge's message can point at the learner's own code."""
    import traceback

    from IPython import get_ipython

    shell = get_ipython()
    cells = (getattr(shell.compile, "_filename_map", {}) or {}) if shell is not None else {}
    out = []
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename in cells:
            fn = "" if frame.name == "<module>" else f", in {frame.name}"
            out.append(f"  Cell In[{cells[frame.filename]}], line {frame.lineno}{fn}" +
                       (f"\n    {frame.line}" if frame.line else ""))
    return out


def observed_call(call: Callable[[], Any], options: dict) -> tuple[Any, dict]:
    """Run `call` (the learner's code) under the observations the judge asked for; returns (value, findings)."""
    from autograder.checking import call_conditions
    from autograder.checking.reference_guard import no_calls_into
    from autograder.checking.tensor_trace import TensorTrace

    findings: dict = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(call_conditions.applied(options))
        trace = stack.enter_context(TensorTrace()) if options.get("trace") else None
        for watch in options.get("watch", []):
            refs = [wire.trusted_object(p) for p in watch["refs"]]
            stack.enter_context(no_calls_into(*refs, what=watch["what"], allow=watch["allow"]))
        value = call()
    if trace is not None:
        findings["trace"] = {"calls": [[c.name, [list(s) for s in c.inputs], [list(s) for s in c.outputs]]
                                       for c in trace.calls], "grad_used": trace.grad_used}
    return value, findings
