"""The package's reference is not an answer: a check refuses it, however it is handed in.

The package keeps the reference of every exercise (later labs build on it), so a learner could pass a check by
handing it in. Three ways are refused here, each with a message that says so:

    own_work(answer, reference, what="Exercise 3 (kv_cache_bytes)")
        # the reference object itself (or a functools.partial / bound method / staticmethod of it), a function or
        # class whose code lives in the course's package or an installed library rather than in the notebook
    own_work(MyScheduler, Scheduler, what="Exercise 2 (the scheduler)", methods=("schedule",))
        # a subclass of the reference that does not define each method the exercise asks for (it inherits them)
    with no_calls_into(Scheduler, what="Exercise 2 (the scheduler)"):
        run_the_scenario(MyScheduler(...))
        # a thin wrapper: the reference's own code is entered while the learner's code runs (super().schedule(),
        # minigpt.cache.BlockPool.allocate(self, n), ...)

Copying the reference's source into a cell stays possible (the package is open); `python -m autograder
similarity` reports that to the instructor.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from pathlib import Path
from types import CodeType, FunctionType
from typing import Any, Callable, Iterable, Iterator

from autograder.paths import AUTOGRADER_DIR, SHARED_DIR

__all__ = ["own_work", "no_calls_into", "watched", "ReferenceHandedIn", "code_objects", "guarded"]

_PACKAGE_ROOTS = (SHARED_DIR, AUTOGRADER_DIR)


class ReferenceHandedIn(AssertionError):
    """The answer is (or only calls) the package's reference."""


def _unwrap(obj: Any) -> Any:
    """The function behind a partial, a bound method, a staticmethod/classmethod or a functools.wraps wrapper."""
    for _ in range(10):
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif inspect.ismethod(obj):
            obj = obj.__func__
        elif getattr(obj, "__wrapped__", None) is not None:
            obj = obj.__wrapped__
        else:
            return obj
    return obj


def _code_file(obj: Any) -> str | None:
    code = getattr(_unwrap(obj), "__code__", None)
    return code.co_filename if isinstance(code, CodeType) else None


@functools.lru_cache(maxsize=4096)
def _resolved(filename: str) -> Path | None:
    """A code file's resolved path (None when it cannot be resolved), once per file name: a watched call asks for
    the files of every frame and class it looks at, and resolving walks the file system each time."""
    try:
        return Path(filename).resolve()
    except (OSError, ValueError):
        return None


def _outside_notebook(filename: str) -> bool:
    """True for code in the course's package or an installed library (not a notebook cell)."""
    resolved = _resolved(filename)
    if resolved is None:
        return False
    if any(resolved.is_relative_to(root) for root in _PACKAGE_ROOTS):
        return True
    return any(part in ("site-packages", "dist-packages") for part in resolved.parts)


def _in_course_package(filename: str) -> bool:
    """True for code in the course's package (not an installed library such as torch)."""
    resolved = _resolved(filename)
    return resolved is not None and any(resolved.is_relative_to(root) for root in _PACKAGE_ROOTS)


def _own_functions(cls: type) -> dict[str, Any]:
    """Functions a class defines itself (not inherited)."""
    return {name: value for name, value in vars(cls).items()
            if isinstance(value, (FunctionType, staticmethod, classmethod, property))}


def own_work(answer: Any, reference: Any | Iterable[Any], *, what: str, methods: Iterable[str] = (),
             given: Iterable[str] = ()) -> None:
    """Raise ReferenceHandedIn when `answer` is the reference, comes from the package, or (a class) inherits the
    methods the exercise asks for from the reference instead of defining them. `given`: attributes of the class that
    may hold the package's code (an earlier exercise's piece, which the learner may replace by the reference)."""
    refs = list(reference) if isinstance(reference, (list, tuple, set)) else [reference]
    from autograder.checking.wire import Remote

    _record(refs, what, methods)

    if isinstance(answer, Remote):       # the learner's object lives in the kernel: look at it there
        answer._endpoint.request("package", path="autograder.checking.reference_guard:own_work", args=[answer, refs],
                                 kwargs={"what": what, "methods": list(methods), "given": list(given)})
        return
    target = _unwrap(answer)
    for ref in refs:
        if target is _unwrap(ref):
            raise ReferenceHandedIn(f"{what}: this is the course's reference ({_name(ref)}), not your own "
                                    "implementation. Write it in the exercise's cell.")
    if inspect.isclass(answer):
        for ref in refs:
            if inspect.isclass(ref) and issubclass(answer, ref):
                missing = [m for m in methods if m not in _own_functions(answer)]
                if missing:
                    raise ReferenceHandedIn(
                        f"{what}: {answer.__name__} inherits {', '.join(missing)} from the course's reference "
                        f"{_name(ref)} instead of implementing {'it' if len(missing) == 1 else 'them'}.")
        for name, value in _own_functions(answer).items():
            if name in given:
                continue
            filename = _code_file(value.fget if isinstance(value, property) else value)
            if filename and _outside_notebook(filename):
                raise ReferenceHandedIn(f"{what}: {answer.__name__}.{name} comes from {Path(filename).name}, not "
                                        "from your notebook.")
        return
    filename = _code_file(answer)
    if filename and _outside_notebook(filename):
        raise ReferenceHandedIn(f"{what}: {getattr(target, '__qualname__', answer)!s} is defined in "
                                f"{Path(filename).name}, not in your notebook. Write your own in the exercise's cell.")


def _name(obj: Any) -> str:
    obj = _unwrap(obj)
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"


def code_objects(references: Iterable[Any]) -> dict[CodeType, str]:
    """The code objects of reference functions, and of every function a reference class defines."""
    out: dict[CodeType, str] = {}
    for ref in references:
        if inspect.isclass(ref):
            for klass in ref.__mro__:
                module_file = getattr(sys.modules.get(klass.__module__), "__file__", None)
                if klass is object or not module_file or not _in_course_package(module_file):
                    continue        # a library base class (torch.nn.Module...): calling it is not delegation
                for name, value in vars(klass).items():
                    fn = _unwrap(value.fget if isinstance(value, property) else value)
                    if isinstance(getattr(fn, "__code__", None), CodeType):
                        out[fn.__code__] = f"{klass.__qualname__}.{name}"
        else:
            fn = _unwrap(ref)
            if isinstance(getattr(fn, "__code__", None), CodeType):
                out[fn.__code__] = getattr(fn, "__qualname__", repr(fn))
    return out


@contextlib.contextmanager
def no_calls_into(*references: Any, what: str, allow: Iterable[str] = ()) -> Iterator[None]:
    """Inside the block, entering the code of a reference function (or of a method a reference class defines)
    raises ReferenceHandedIn at the end of the block. `allow`: qualified names that may be called (e.g. a
    constructor the exercise's API requires: "BlockPool.__init__")."""
    entered: list[str] = []
    spec = {"refs": [_path(r) for r in references], "what": what, "allow": list(allow), "lab": _lab()}
    _WATCHES.append(spec)
    _GUARDED.append(spec)
    hooked = _LEARNER_CODE_RUNS_HERE         # in the judge only the kernel's watch (remote_options) sees the learner
    if hooked:
        watched = {code: name for code, name in code_objects(references).items() if name not in set(allow)}

        def profile(frame, event, arg):
            if event == "call" and frame.f_code in watched and not entered:
                entered.append(watched[frame.f_code])

        previous, previous_threading = sys.getprofile(), threading.getprofile()
        sys.setprofile(profile)
        threading.setprofile(profile)
    try:
        yield
    finally:
        if hooked:
            sys.setprofile(previous)
            threading.setprofile(previous_threading)
        _WATCHES.remove(spec)
    if entered:
        raise ReferenceHandedIn(f"{what}: your code calls the course's reference ({entered[0]}) instead of doing "
                                "the work itself.")


_WATCHES: list[dict] = []     # open no_calls_into blocks (a judged call asks the kernel to watch as well)
_GUARDED: list[dict] = []     # every reference refused since the last `guarded()` (the judge grades those cells again)
_LEARNER_CODE_RUNS_HERE = True   # False in the judge's process (learner_code_runs_elsewhere)


def learner_code_runs_elsewhere() -> None:
    """Called once by the judge's process, where no learner code ever runs: the learner's objects are Remotes whose
    calls run in the kernel, and decoding a value never runs the sender's code (autograder/checking/wire.py). There a
    profile hook could see only the check's own calls, and it slowed every call of a check that makes thousands of
    judged calls; `no_calls_into` then only asks the kernel to watch each judged call (`remote_options`)."""
    global _LEARNER_CODE_RUNS_HERE
    _LEARNER_CODE_RUNS_HERE = False


def _record(refs: list[Any], what: str, methods: Iterable[str]) -> None:
    """Remember the references own_work refused: of a class, only the methods the exercise asks for (the learner's
    class may use the rest, a constructor or a helper, as the exercise allows)."""
    methods, lab = set(methods), _lab()
    for ref in refs:
        try:
            path = _path(ref)
        except AttributeError:      # not a function or class (a constant): nothing to take out
            continue
        allow = [name for name in code_objects([ref]).values()
                 if name.rsplit(".", 1)[-1] not in methods] if inspect.isclass(ref) else []
        _GUARDED.append({"refs": [path], "what": what, "allow": allow, "lab": lab})


def guarded() -> list[dict]:
    """The references the checks refused since the last call ({"refs": ["module:qualname"...], "what", "allow", "lab"}
    each), and forget them: what the judge takes out of the package when it grades the cell again in a witness
    (autograder/judging/reference_removal.py; "lab": the lab of the refusing check, whose released notebook says
    which of the reference's helpers the learner may use)."""
    seen = [dict(g) for g in _GUARDED]
    _GUARDED.clear()
    return seen


def _lab() -> str | None:
    """The lab ("07") of the check module (autograder/labNN...) nearest up the stack, or None."""
    from autograder.checking.learner_errors import _lab_of

    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        resolved = _resolved(filename)
        if resolved is not None and resolved.is_relative_to(AUTOGRADER_DIR):
            lab = _lab_of(filename)
            if lab:
                return lab
        frame = frame.f_back
    return None


def _path(ref: Any) -> str:
    obj = _unwrap(ref)
    return f"{obj.__module__}:{obj.__qualname__}"


def remote_options() -> dict:
    """What a judged call asks the kernel for: the same watches as the blocks open here."""
    return {"watch": [dict(w) for w in _WATCHES]} if _WATCHES else {}


def watched(fn: Callable, references: tuple, what: str) -> Callable:
    """fn, refusing (ReferenceHandedIn) a call that enters the reference's code while fn runs (the check's own calls
    of the reference, between the learner's calls, are not watched)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        with no_calls_into(*references, what=what):
            return fn(*args, **kwargs)
    return call
