"""Equivalence shown, not asserted: a differential test of a mutant against the solution on drawn valid inputs.

A `Contract` says how one exercise may be used: what object of the cell to compare (`subject`), a hypothesis strategy
of valid inputs (every shape, dtype, size and device the exercise's contract allows; the meta device stands for "not
the CPU"), how to use the object on one input (`run`, by default a call) and when two results are the same
(`same`, by default: equal values, dtypes, shapes and devices; the same exception type when both raise).

    differential(contract, namespace, solution_source, mutant_source, seed=0) -> None | "the first input that differs"

`namespace` is the notebook's, as it is before the exercise cell runs (models and helpers of earlier cells). The
solution and the mutant are each run in a copy of it; the drawn inputs are copied for each, so neither sees what the
other wrote. A mutant listed as equivalent in autograder/mutation/known/ counts as equivalent only when its
exercise has a contract and this finds no difference (run.py); otherwise it is graded like any other mutant.

Interview answer cells (q*_code) need no contract: `answers` compares every value the cell defines.
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import math
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator

__all__ = ["Contract", "Raised", "call_with", "same_result", "differential", "answers"]


@dataclass(frozen=True)
class Raised:
    """What a call that raised returns in a contract's results: the exception's type name."""
    kind: str


def call_with(subject: Any, value: Any) -> Any:
    """The default `run`: value is (args, kwargs) or a tuple of args; (the call's result, or Raised(type); the
    tensors among the arguments as the call left them, strides included: an in-place op on an input is a
    difference the caller sees)."""
    args, kwargs = value if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict)) else (value, {})
    try:
        result = subject(*args, **kwargs)
    except Exception as err:                        # noqa: BLE001  (both versions raising the same kind is the same)
        result = Raised(type(err).__name__)
    return result, _tensor_inputs((args, kwargs))


def _tensor_inputs(value: Any) -> list:
    """Every tensor inside value (lists, tuples, dicts), with its strides, in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [(value, value.stride())]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensor_inputs(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensor_inputs(item)]
    return []


def same_result(a: Any, b: Any, *, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Equal all the way down: tensors by dtype, shape, device and values (NaN equal to NaN; meta tensors by the
    first three), floats within rtol/atol (exact by default), containers item by item, objects by their attributes."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if (a.dtype, a.shape, a.device) != (b.dtype, b.shape, b.device):
            return False
        if a.device.type == "meta":
            return True
        if rtol or atol:
            return bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True))
        if not a.is_floating_point():
            return bool(torch.equal(a, b))
        nan_a, nan_b = a.isnan(), b.isnan()
        return bool(torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b]))
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol) or a == b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_result(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_result(a[k], b[k], rtol=rtol, atol=atol) for k in a)
    if hasattr(a, "__dict__") and not callable(a):
        return same_result(vars(a), vars(b), rtol=rtol, atol=atol)
    return bool(a == b)


@dataclass(frozen=True)
class Contract:
    """How to use one exercise's object and tell two versions apart (see the module docstring).

    inputs(namespace) -> a hypothesis strategy of one valid input; corners(namespace) -> inputs always tried first
    (the contract's smallest and largest sizes, its boundaries: hypothesis's draws may miss a single value);
    run(subject, input) -> what is compared."""
    subject: str
    inputs: Callable[[dict], Any]
    run: Callable[[Any, Any], Any] = call_with
    same: Callable[[Any, Any], bool] = same_result
    corners: Callable[[dict], list] = lambda namespace: []
    examples: int = 100


def _run_cell(source: str, namespace: dict, filename: str) -> dict:
    """A copy of `namespace` after running `source` in it, compiled under `filename` (registered in linecache, as
    IPython does: Triton's interpreter reads a kernel's source)."""
    ns = dict(namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)
    return ns


class _Differs(Exception):
    pass


def differential(contract: Contract, namespace: dict, solution: str, mutant: str, *, seed: int = 0) -> str | None:
    """None when no drawn input tells `mutant` from `solution` (cell sources); else what differed, on which input."""
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import seed as hypothesis_seed

    ours = _run_cell(solution, namespace, "<solution cell>")[contract.subject]
    theirs = _run_cell(mutant, namespace, "<mutant cell>")[contract.subject]

    @hypothesis_seed(seed)
    @settings(max_examples=contract.examples, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(contract.inputs(namespace))
    def same_everywhere(value: Any) -> None:
        want = _used(contract, ours, value)
        got = _used(contract, theirs, value)
        if not contract.same(got, want):
            raise _Differs(f"on {_short(value)}: the solution gives {_short(want)}, the mutant {_short(got)}")

    for corner in contract.corners(namespace):
        same_everywhere = example(corner)(same_everywhere)
    try:
        with _hypothesis_home_elsewhere():
            same_everywhere()
    except _Differs as differs:
        return str(differs)
    return None


@contextlib.contextmanager
def _hypothesis_home_elsewhere() -> Iterator[None]:
    """Hypothesis keeps caches (the constants it finds in local modules) in .hypothesis/ under the working folder,
    which a mutation run has in labs/NN_topic/: send them to a temporary folder, removed afterwards."""
    from hypothesis.configuration import set_hypothesis_home_dir

    with tempfile.TemporaryDirectory(prefix="mutation-hypothesis-") as home:
        set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            set_hypothesis_home_dir(None)


def _used(contract: Contract, subject: Any, value: Any) -> Any:
    """contract.run on a copy of the input; an exception that escapes it (the result broke the contract's own
    driving) is a result too."""
    try:
        return contract.run(subject, copy.deepcopy(value))
    except Exception as err:                        # noqa: BLE001
        return Raised(type(err).__name__)


ANSWER = re.compile(r"q\d+_\w+|answer_q\d+\w*")      # lab 00's q1_kv_gib, the other labs' answer_q1


def answers(namespace: dict, solution: str, mutant: str, *, rel_tol: float = 1e-12) -> str | None:
    """An interview answer cell: None when the mutant gives every answer the solution's cell gives (its q1_... or
    answer_q1... names; every value it defines when it names none), equal (floats within rel_tol); else the first
    that differs. Helper variables the cell computes on the way are not answers."""
    ours = _run_cell(solution, namespace, "<solution cell>")
    theirs = _run_cell(mutant, namespace, "<mutant cell>")
    named = {name for name in ours if ANSWER.fullmatch(name) and not (name in namespace and namespace[name] is ours[name])}
    for name, want in ours.items():
        if name.startswith("_") or (name in namespace and namespace[name] is want) or callable(want):
            continue
        if named and name not in named:
            continue
        got = theirs.get(name, Raised("missing"))
        if not same_result(got, want, rtol=rel_tol):
            return f"{name}: the solution gives {_short(want)}, the mutant {_short(got)}"
    return None


def _short(value: Any, limit: int = 600) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
