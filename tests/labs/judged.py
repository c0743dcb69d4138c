"""A check run as the judge runs it, without nbgrader: the learner's objects live in a second Python process (the
"kernel") and reach the check as `autograder.checking.wire.Remote` handles, with the kernel tracing / watching the learner's
calls when the check asks (autograder/judging/observe.py), exactly as in a judged test cell.

    with learner_process("tests.labs.test_lab04_checks", ["softmax_torch"]) as names:
        lab04.check_online_softmax(names["softmax_torch"])        # a Remote: every call crosses the socket

The kernel side imports the named objects from `module` (a test module holding the wrong implementations), so a
test can show that a method check still refuses them when their code runs in another process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

from autograder.judging.judge import judge_endpoint

REPO_ROOT = Path(__file__).resolve().parents[2]

_KERNEL = """
import importlib, socket, sys
import minigpt.kernels
from autograder.judging.observe import kernel_endpoint
module = importlib.import_module(sys.argv[2])
names = {name: getattr(module, name) for name in sys.argv[3:]}
sock = socket.socket(fileno=int(sys.argv[1]))
kernel_endpoint(sock, names).serve()
"""


@contextlib.contextmanager
def learner_process(module: str, names: list[str]) -> Iterator[dict[str, Any]]:
    """{name: Remote} for `names` of `module`, served by a fresh process until the block ends."""
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "shared"), str(REPO_ROOT)]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _KERNEL, str(theirs.fileno()), module, *names],
                            pass_fds=[theirs.fileno()], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)
    theirs.close()
    endpoint = judge_endpoint(ours)
    try:
        yield {name: endpoint.request("getname", name=name) for name in names}
    finally:
        with contextlib.suppress(OSError):
            endpoint.finish()
        ours.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
