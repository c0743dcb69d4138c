"""The learner's check cells take the grader's path: judged in a separate process, not in the kernel.

Loaded into every course kernel (config/ipython_kernel_config.py names it as an IPython extension). A cell
that calls a `check_*` function is not run as written: the kernel starts a judge process once
(autograder/judging/judge.py), sends it the cell, and serves it (autograder/judging/observe.py) until it has a verdict, which
is printed here, or raised as `CheckFailed` with the check's own message. That is what `nbgrader autograde`
does with the same cell, so the learner sees the verdict the grader will give.

Off under nbgrader (the grader drives the judge itself) and with COURSE_JUDGE=0 (checks run in the kernel).
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import sys
from typing import Any

CHECK_CALL = re.compile(r"(?<![\w.])check_\w+\s*\(|\blab\d\d\.check_\w+\s*\(")   # check_x(...) or lab08.check_x(...)
_judge: Any = None


class CheckFailed(AssertionError):
    """A check cell's verdict: the check's message, shown without a traceback into the grader (raised as a subclass
    named after the check's own error, so the cell's error reads `AssertionError`, `NotImplementedError`, ...)."""

    def __init__(self, ename: str, evalue: str, lines: list[str] | None = None) -> None:
        super().__init__(evalue)              # shown as "AssertionError: <evalue>": the class carries the name
        self.ename, self.evalue, self.lines = ename, evalue, lines or [f"{ename}: {evalue}"]

    def _render_traceback_(self) -> list[str]:       # IPython shows this instead of a traceback
        return self.lines


def is_check_cell(source: str) -> bool:
    return bool(CHECK_CALL.search(source)) and not source.lstrip().startswith("%")


def _route(lines: list[str]) -> list[str]:
    source = "".join(lines)
    if not is_check_cell(source):
        return lines
    return [f"__import__('autograder.judging.interactive').judging.interactive.judge_cell({source!r})\n"]


def judge_cell(source: str) -> None:
    """Have the judge run `source` against this kernel; print its output, raise its error."""
    from IPython import get_ipython

    from autograder.judging import observe
    from autograder.judging.judge import JudgeProcess
    from autograder.judging.socket_folder import socket_folder

    global _judge
    if _judge is None or _judge.proc.poll() is not None:
        folder = socket_folder("judge-")
        _judge = JudgeProcess(folder, cwd=os.getcwd(), grading=False)
        atexit.register(_stop, _judge, folder)
    token = secrets.token_hex(8)
    _judge.run(source, token, timeout=3600)
    try:
        observe.serve(_judge.path, token)
    finally:
        result = _judge.result(wait=60)
    sys.stdout.write(result["stdout"])
    sys.stderr.write(result["stderr"])
    if not result["error"] and "SKIPPED" not in result["stdout"]:
        from autograder.checking.learner_errors import passed_line

        line = passed_line(source)            # the same words in every lab (a skipped GPU cell did not pass)
        if line:
            print(line)
    if result["error"]:
        error = result["error"]
        cell_file = sys._getframe(1).f_code.co_filename       # the check cell judge_cell was called from
        here = f"Cell In[{getattr(get_ipython().compile, '_filename_map', {}).get(cell_file, '?')}]"
        lines = [line.replace("this check cell", here) for line in error.get("lines") or []]
        named = type(error["ename"], (CheckFailed,), {"__module__": "builtins"})   # shown with the check's error name
        raise named(error["ename"], error["evalue"], lines)


def _stop(judge: Any, folder: str) -> None:
    judge.close()
    shutil.rmtree(folder, ignore_errors=True)


def load_ipython_extension(ip: Any) -> None:
    if os.environ.get("NBGRADER_EXECUTION") or os.environ.get("COURSE_JUDGE", "1") == "0":
        return
    if _route not in ip.input_transformers_post:
        ip.input_transformers_post.append(_route)


def unload_ipython_extension(ip: Any) -> None:
    if _route in ip.input_transformers_post:
        ip.input_transformers_post.remove(_route)
