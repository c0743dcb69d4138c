"""Errors a learner understands: in a lab's kernel, a failure names the exercise, not the course's internals.

Importing `autograder` inside a Jupyter kernel installs `explain` as IPython's handler for exceptions
(`InteractiveShell.set_custom_exc`). What a learner then sees instead of a long traceback:

* a check that fails:        the check line of their cell, their own frames, and
                             "AssertionError: Exercise 3 (check_kv_cache_bytes): <what is wrong>", or the check's
                             message as it is when it names its exercise already ("Exercise 1 (mask_by_scan), ...")
* a stub not written yet:    "Exercise 3 is not implemented yet: ..." (in a check cell) or, in a demo cell,
                             "This cell needs exercise 3 (kv_cache_bytes) ... continue with the reference: ..."
* an answer not given yet:   "Question 1 is not answered yet: ..." (a NameError on q1_... in a check cell,
                             or `raise NotImplementedError()` left in an answer cell)
* any other error raised inside the course, torch or triton: only the learner's frames and the last line.

Errors that never touch the course's code keep IPython's usual traceback. The exception itself is unchanged
(type and message), so nbgrader scores and reports exactly as before. Which check belongs to which exercise,
and where the reference of each learner function lives, comes from `exercise_map.json`, made from solutions/
by `python -m autograder exercise-map` (a test keeps it current).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import traceback
from functools import lru_cache
from pathlib import Path
from types import TracebackType

from autograder.paths import AUTOGRADER_DIR, EXERCISE_MAP, REPO_ROOT, SHARED_DIR

_QUESTION_NAME = re.compile(r"q(\d+)_\w+|answer_q(\d+)\w*")      # lab 00's q1_kv_gib, the other labs' answer_q1
# a message that opens with an exercise's label, as many checks' messages do: "Exercise 1 (mask_by_scan): ...",
# "Exercise 2 (the scheduler), three requests ...", "Q1 (KV bytes per token) [answer in bytes]: ..."
_OPENING_LABEL = re.compile(r"(?:(?P<label>(?:Exercise|Question|Warm-up) \d+)|Q(?P<q>\d+)(?=\s*[(:]))(?![\w-])"
                            r"(?:\s*\((?P<name>[^()]*)\))?[\s,:]*")
_OWN_OPENING = r"(?P<label>)(?P<q>){}(?:\s*\((?P<name>[^()]*)\))?[\s,:]*"    # a message opening with its check's label


# ------------------------------------------------------------------------------------- the map from solutions/

def _label(grade_id: str) -> str:
    warmup = re.match(r"warmup(\d+)_", grade_id)
    if warmup:
        return f"Warm-up {int(warmup[1])}"
    m = re.match(r"(ex|q)(\d+)_", grade_id)
    if not m:
        return f"the {grade_id.replace('_', ' ')}"
    return f"{'Exercise' if m[1] == 'ex' else 'Question'} {int(m[2])}"


def _reference_of(name: str) -> str | None:
    """`module.name` of the package's own object called `name` (its defining module), or None."""
    import importlib
    import pkgutil

    import minigpt

    found = set()
    for info in pkgutil.walk_packages(minigpt.__path__, "minigpt."):
        try:
            module = importlib.import_module(info.name)
        except Exception:
            continue
        obj = getattr(module, name, None)
        if obj is not None and callable(obj) and getattr(obj, "__module__", "").startswith("minigpt"):
            found.add(obj.__module__)
    return f"{min(found, key=len)}.{name}" if found else None


def build_map(solutions: Path = REPO_ROOT / "solutions") -> dict:
    """{"checks": {check function: label}, "learner": {learner name: {"label", "reference"}}} from the
    graded cells (exN_check / qN_check) and solution cells (exN_code) of every lab's source notebook."""
    import nbformat

    checks: dict[str, str] = {}
    learner: dict[str, dict] = {}
    for path in sorted(Path(solutions).glob("*/*.ipynb")):
        lab = path.parent.name[:2]
        for cell in nbformat.read(str(path), as_version=4).cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            gid = meta.get("grade_id", "")
            if meta.get("grade"):
                for name in re.findall(r"\b(check_\w+)\s*\(", cell.source):
                    checks.setdefault(f"{lab}:{name}", _label(gid))
            elif meta.get("solution") and gid.startswith(("ex", "warmup")):
                try:
                    tree = ast.parse(cell.source)
                except SyntaxError:
                    continue
                for node in tree.body:
                    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                        learner.setdefault(f"{lab}:{node.name}", {"label": _label(gid),
                                                                  "reference": _reference_of(node.name)})
    return {"checks": dict(sorted(checks.items())), "learner": dict(sorted(learner.items()))}


@lru_cache(maxsize=1)
def exercise_map() -> dict:
    try:
        return json.loads(EXERCISE_MAP.read_text())
    except (OSError, json.JSONDecodeError):
        return {"checks": {}, "learner": {}}


def passed_line(source: str) -> str | None:
    """What a check cell that passed says, the same in every lab: "Exercise 3 passed." (the labels of the checks it
    calls, from the exercise map; None when it calls none the map knows, or catches exceptions itself: then a
    check may have failed without failing the cell)."""
    if re.search(r"\bexcept\b", source):
        return None
    lab = re.search(r"autograder\.lab(\d\d)", source)
    checks = exercise_map()["checks"]
    labels = dict.fromkeys(checks[f"{lab[1]}:{name}"] for name in re.findall(r"\b(check_\w+)\s*\(", source)
                           if lab and f"{lab[1]}:{name}" in checks)
    return f"{' and '.join(labels)} passed." if labels else None


# ------------------------------------------------------------------------------------- explaining an error

def _is_course(filename: str) -> bool:
    """Code of the course (autograder/, shared/minigpt/) or of an installed library, as opposed to a cell."""
    from minigpt.paths import library_dirs      # here: importing the minigpt package imports torch

    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return (resolved.startswith((str(AUTOGRADER_DIR), str(SHARED_DIR))) or
            resolved.startswith(tuple(str(d) for d in library_dirs())))


def _is_cell(filename: str) -> bool:
    return not filename.startswith("<frozen") and not _is_course(filename)


def _lab_of(filename: str) -> str | None:
    """The lab of a check module: autograder/lab00.py, or any file of a package autograder/lab03/ (metrics.py)."""
    path = Path(filename)
    for part in (path.stem, *reversed(path.parent.parts)):
        m = re.fullmatch(r"lab(\d\d)", part)
        if m:
            return m[1]
    return None


def _check_label(frames: list[traceback.FrameSummary]) -> tuple[str, str] | None:
    """(label, check name) of the first course check function in the traceback."""
    checks = exercise_map()["checks"]
    for f in frames:
        lab = _lab_of(f.filename) if str(Path(f.filename).resolve()).startswith(str(AUTOGRADER_DIR)) else None
        if lab and f"{lab}:{f.name}" in checks:
            return checks[f"{lab}:{f.name}"], f.name
    return None


def _learner_function(frames: list[traceback.FrameSummary]) -> tuple[str, dict] | None:
    """(name, {"label", "reference"}) of the innermost cell function the map knows."""
    learner = exercise_map()["learner"]
    for f in reversed(frames):
        if _is_cell(f.filename):
            for key, info in learner.items():
                if key.split(":", 1)[1] == f.name:
                    return f.name, info
    return None


def _stub_inside(value: BaseException) -> BaseException | None:
    """A NotImplementedError that `value` wraps (Triton's interpreter raises InterpreterError from the error inside
    a kernel), or None."""
    seen, cause = 0, value.__cause__ or value.__context__
    while cause is not None and seen < 5:
        if isinstance(cause, NotImplementedError):
            return cause
        seen, cause = seen + 1, cause.__cause__ or cause.__context__
    return None


def explain(etype: type[BaseException], value: BaseException, tb: TracebackType | None,
            cell_names: dict[str, int] | None = None) -> list[str] | None:
    """Lines to show instead of the traceback, or None to keep IPython's own traceback.

    cell_names: {cell file name: execution count} (IPython's), to name a frame "Cell In[7]" as IPython does."""
    frames = traceback.extract_tb(tb)
    first_cell = next((i for i, f in enumerate(frames) if _is_cell(f.filename)), 0)
    frames = frames[first_cell:]                   # from the cell on (IPython's own exec frame comes first)
    if isinstance(value, NameError) and (m := _QUESTION_NAME.fullmatch(getattr(value, "name", "") or "")):
        return [f"Question {int(m[1] or m[2])} is not answered yet: give `{value.name}` a value in the answer cell "
                "above and run that cell, then this one."]
    if isinstance(value, NameError) and len(frames) == 1 and getattr(value, "name", None):
        return [f"NameError: `{value.name}` is not defined yet: a cell above defines it and has not run or failed. "
                "Run the cells above in order; a cell that needs an exercise you have not done says which."]
    cell_frames = [f for f in frames if _is_cell(f.filename)]
    check = _check_label(frames)
    message = _said_once(etype.__name__, str(value))
    if check is not None:
        label, name = check
        if isinstance(value, NotImplementedError) or "is not implemented yet" in message:
            learner = _learner_function(frames)
            core = re.sub(r"\s*(is not implemented yet|\(NotImplementedError\))", "", message).strip(" .:")
            opening = _OPENING_LABEL.match(core) or re.match(_OWN_OPENING.format(_own_label(label)), core)
            if opening:                # the check's message names the exercise the stub belongs to: say it once
                if opening["label"] or opening["q"]:
                    label = opening["label"] or f"Question {int(opening['q'])}"
                core = ", ".join(dict.fromkeys(part for part in (opening["name"], core[opening.end():].strip(" .:"))
                                               if part))
            what = (f"`{learner[0]}` still raises NotImplementedError" if learner else
                    core or "it still raises NotImplementedError")
            return [f"{label} is not implemented yet: {what}. Write it in its cell above, run that cell, then "
                    "this check."]
        return _short(cell_frames, f"{etype.__name__}: {_labelled(message, label, name)}", cell_names)
    wrapped = None if isinstance(value, NotImplementedError) else _stub_inside(value)
    if wrapped is not None:                        # the stub ran inside a kernel: its own frames say which one
        frames = frames + [f for f in traceback.extract_tb(wrapped.__traceback__) if _is_cell(f.filename)]
    if isinstance(value, NotImplementedError) or wrapped is not None:
        learner = _learner_function(frames)
        if learner is not None:
            name, info = learner
            hint = (f" To go on meanwhile with the course's reference, run `from {info['reference'].rsplit('.', 1)[0]} "
                    f"import {name}` (its check still needs your own version)." if info.get("reference") else "")
            return [f"This cell needs {info['label'].lower()}: `{name}` is not implemented yet.{hint}"]
        if len(frames) <= 1:
            return ["This answer is not given yet: replace `raise NotImplementedError()` in this cell with your "
                    "answer, then run it."]
    if any(_is_course(f.filename) for f in frames[1:]):
        return _short(cell_frames, f"{etype.__name__}: {message}", cell_names)
    return None


def _said_once(ename: str, message: str) -> str:
    """The message without a leading copy of its own error's name ("AssertionError: AssertionError: x" is shown
    "AssertionError: x"), and with an error name said twice in a row inside it ("raised ValueError: ValueError:")
    said once."""
    message = re.sub(rf"^(?:{re.escape(ename)}:\s*)+", "", message)
    return re.sub(r"\b(\w+(?:Error|Exception|Exit)):(?:\s+\1:)+", r"\1:", message)


def _own_label(label: str) -> str:
    """A pattern for the check's label as a message may say it: "Question 2" or "Q2"; "the target calls check" or
    "the target-calls check" (a label made from a grade id has spaces where the id has underscores)."""
    own = [re.escape(label).replace(r"\ ", "[ _-]")]
    if m := re.fullmatch(r"Question (\d+)", label):
        own.append(f"Q{m[1]}")
    return rf"(?<![\w-])(?:{'|'.join(own)})(?![\w-])"


def _labelled(message: str, label: str, name: str) -> str:
    """A failed check's message with its exercise named once: "Exercise 2 (check_count_parameters): <message>", or
    the message as it is when it names its exercise already (opens with an exercise's label, as "Exercise 1
    (mask_by_scan): ..." or "Q1 (...): ...", or says the check's own label somewhere); a message that opens with
    the check's name gets the label alone ("Exercise 6: check_graphed_decode needs a CUDA GPU")."""
    if _OPENING_LABEL.match(message) or re.search(_own_label(label), message):
        return message
    if re.match(rf"{re.escape(name)}\b", message):
        return f"{label}: {message}"
    return f"{label} ({name}): {message}"


def _short(cell_frames: list[traceback.FrameSummary], last: str, cell_names: dict[str, int] | None) -> list[str]:
    """The learner's own frames (cell, line, code) and the last line."""
    lines = []
    for f in cell_frames:
        count = (cell_names or {}).get(f.filename)
        where = f"Cell In[{count}]" if count is not None else Path(f.filename).name
        code = f"\n    {f.line}" if f.line else ""
        fn = "" if f.name == "<module>" else f", in {f.name}"
        lines.append(f"  {where}, line {f.lineno}{fn}{code}")
    return lines + [last]


# ------------------------------------------------------------------------------------- installing it

def _handler(shell, etype, value, tb, tb_offset=None) -> None:
    """IPython's custom exception handler: show our lines (or IPython's own traceback) as the cell's error."""
    try:
        if hasattr(value, "_render_traceback_"):      # a judged check's verdict (autograder/judging/interactive.py)
            lines = value._render_traceback_()
        else:
            lines = explain(etype, value, tb, getattr(shell.compile, "_filename_map", None))
    except Exception:
        lines = None
    if lines is None:
        lines = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    else:
        _drop_half_drawn_figures()
    shell._showtraceback(etype, value, lines)   # ipykernel sends it as the cell's error output


def _drop_half_drawn_figures() -> None:
    """A demo cell that stops at a missing exercise leaves its figure half drawn (the inline backend would still
    show it under the message, axes empty): close the figures the failed cell opened."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


def install_in_kernel() -> bool:
    """Install the handler when running inside IPython (a notebook's kernel); True when installed."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    shell.set_custom_exc((Exception,), _handler)
    return True


def write_map(path: Path = EXERCISE_MAP) -> bool:
    """Write the map made from solutions/; True when it changed."""
    text = json.dumps(build_map(), indent=1) + "\n"
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
