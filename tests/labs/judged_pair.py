"""A judge and a learner's kernel in one process, for tests of checks that receive Remotes.

    with judged(fn=my_fn) as learner:
        lab08.check_lora_delta(learner.fn)      # learner.fn is a wire.Remote; my_fn runs in the serving thread

The kernel's side is a thread serving one end of a socket pair exactly as autograder/judging/observe.py serves the
judge (names, the same observed calls); the check runs here with the learner's objects as Remotes, as it does
in autograder/judging/judge.py. Torch function modes are per thread, so what a check counts or traces here does not
see the learner's calls, as in two processes; a patched builtin (hash) is seen by both sides, unlike in two.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import SimpleNamespace
from typing import Any, Iterator

from autograder.judging import observe
from autograder.judging.judge import judge_endpoint


@contextlib.contextmanager
def judged(**names: Any) -> Iterator[SimpleNamespace]:
    """The given objects as Remotes served by a 'kernel' thread; the thread is joined on exit."""
    judge_end, kernel_end = socket.socketpair()
    kernel = observe.kernel_endpoint(kernel_end, dict(names))
    thread = threading.Thread(target=kernel.serve, name="test-kernel", daemon=True)
    thread.start()
    judge = judge_endpoint(judge_end)
    try:
        yield SimpleNamespace(**{name: judge.request("getname", name=name) for name in names})
    finally:
        with contextlib.suppress(OSError):
            judge.finish()
        thread.join(10)
        judge_end.close()
        kernel_end.close()
