"""Shared helpers for the lab check functions: GPU tier gating, speed checks, silencing.

Two tiers of checks:

* CPU tier: correctness. Runs everywhere.
* GPU tier: speed and memory. A GPU check cell starts with
  ``if require_gpu("CUDA-graph decode speed", calibrated=[CHECK]): check_...(...)``. Without a GPU, or on a
  GPU class with no calibrated threshold for CHECK, the learner sees a plain "SKIPPED" line; under
  ``nbgrader autograde`` the cell fails instead, because skipped is not passed and must not earn points.

Speed is always graded as a ratio measured in one process (``minigpt.timing.compare``):

    learner_speedup   = t(baseline) / t(candidate)
    reference_speedup = t(baseline) / t(reference)
    pass  <=>  learner_speedup >= fraction * reference_speedup

with `fraction` the threshold `make calibrate` measured for the check on this device class
(autograder.checking.thresholds; autograder/calibration/<check>.<device class>.json).

Numbers against a tolerance go through `within` or `at_least` (`assert_finite` says where NaN/inf are), never a bare
`err > tol`: every comparison with NaN is False, so an output of NaN would pass that test
(tests/autograder/test_nan_safe_comparisons.py finds such comparisons in the check modules).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import numbers
import os
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence, Tuple, Union

from autograder.checking import thresholds

__all__ = ["gpu_available", "under_autograde", "require_gpu", "check_speedup", "EachCallItsOwnInput", "expect_value_error", "token_list_checked", "threshold_for", "quiet", "check_answer",
           "call_learner", "within", "at_least", "assert_finite"]

Mistakes = Union[Mapping[float, str], Sequence[Tuple[float, str]]]
Numbers = Any       # a number, a sequence of numbers or a torch.Tensor (torch is imported only when a check runs)


def gpu_available() -> bool:
    """True when torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def under_autograde() -> bool:
    """True inside ``nbgrader autograde`` (it sets NBGRADER_EXECUTION=autograde)."""
    return os.environ.get("NBGRADER_EXECUTION") == "autograde"


def require_gpu(what: str, calibrated: Sequence[str] = ()) -> bool:
    """Gate a GPU-tier check: True when a GPU is present and every check named in `calibrated` has a threshold
    for this GPU's device class (autograder.checking.thresholds).

    Otherwise: under autograde raise AssertionError (no points for a skipped check); outside it print a
    SKIPPED line on stdout (no GPU, or "uncalibrated on <device>; run `make calibrate`") and return False.
    """
    if not gpu_available():
        if under_autograde():
            raise AssertionError(f"needs a GPU: {what}; this machine has none, so no points are awarded")
        print(f"SKIPPED (needs a GPU): {what}. Run this cell on a machine with a CUDA GPU.")
        return False
    from minigpt.timing import device_class

    reasons = [why for check in calibrated for fraction, why in [thresholds.status(check, device_class("cuda"))]
               if fraction is None]
    if not reasons:
        return True
    if under_autograde():
        raise AssertionError(f"{what}: {'; '.join(reasons)}; so no points are awarded")
    print(f"SKIPPED ({'; '.join(reasons)}): {what}.")
    return False


def check_answer(answer: Any, expected: float, what: str, mistakes: Mistakes = (), *, unit: str, rel: float = 1e-3,
                 hint: str = "", reveal: bool = False) -> None:
    """Grade one numeric answer; raise AssertionError with a diagnosis when it is wrong.

    * An int `expected` asks for an exact int (a float that happens to be equal is refused with a
      note saying so: counts of bytes, requests or blocks are integers).
    * A float `expected` accepts any finite real within relative tolerance `rel`.
    * `mistakes`: (wrong value, diagnosis) pairs, or a {wrong value: diagnosis} dict, for the wrong
      answers a learner is likely to give (GB for GiB, K without V, ...); a match prints its diagnosis.
    * The message names the unit the answer must be in. `reveal` adds the expected value: right for
      checks of functions on random inputs, wrong for interview questions (it would give them away).
    """
    label = f"{what} [answer in {unit}]"
    shown = f"; expected {_fmt(expected)} {unit}" if reveal else ""
    exact = isinstance(expected, numbers.Integral) and not isinstance(expected, bool)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real) or not math.isfinite(answer):
        raise AssertionError(f"{label}: answer with a finite {'int' if exact else 'number'}, got {answer!r} "
                             f"({type(answer).__name__}){shown}")
    pairs = list(mistakes.items()) if isinstance(mistakes, Mapping) else list(mistakes)
    if exact:
        if not isinstance(answer, numbers.Integral):
            if answer == expected:
                raise AssertionError(f"{label}: the value {answer!r} is right but is a {type(answer).__name__}; give an "
                                     "exact int (use // rather than /, and int(...) around a float factor)")
            matched = [msg for wrong, msg in pairs if answer == wrong]
        else:
            answer = int(answer)
            if answer == expected:
                return
            matched = [msg for wrong, msg in pairs if answer == wrong]
        tolerance = "exact"
    else:
        if math.isclose(answer, expected, rel_tol=rel, abs_tol=0.0 if expected else 1e-12):
            return
        matched = [msg for wrong, msg in pairs if math.isclose(answer, wrong, rel_tol=max(rel, 1e-3))]
        tolerance = f"relative tolerance {rel:g}"
    diagnosis = f" Likely mistake: {' Or: '.join(dict.fromkeys(matched))}" if matched else ""
    extra = f" {hint}" if hint and not matched else ""
    raise AssertionError(f"{label}: {_fmt(answer)} is not right ({tolerance}){shown}.{diagnosis}{extra}")


def _fmt(x: float) -> str:
    return f"{x:,}" if isinstance(x, numbers.Integral) else f"{float(x):.6g}"


def call_learner(what: str, fn: Callable[..., Any], *args: Any, context: str = "",
                 passthrough: tuple[type[BaseException], ...] = (), **kwargs: Any) -> Any:
    """Run the learner's `fn(*args, **kwargs)` silently (`quiet()`), turning its failures into graded messages.

    NotImplementedError (also when a Triton interpreter wraps it) becomes "`what` is not implemented
    yet"; any other exception becomes an AssertionError naming `what`, the error and `context`.
    AssertionError and the `passthrough` exceptions (e.g. an out-of-blocks error a check expects)
    propagate unchanged.
    """
    if fn is None or not callable(fn):
        raise AssertionError(f"{what}: expected your function, got {fn!r}")
    try:
        with quiet():
            return fn(*args, **kwargs)
    except NotImplementedError:
        raise AssertionError(f"{what} is not implemented yet (NotImplementedError)") from None
    except (AssertionError, *passthrough):
        raise
    except Exception as err:
        if "NotImplementedError" in f"{type(err).__name__} {err}":
            raise AssertionError(f"{what} is not implemented yet (NotImplementedError inside it)") from None
        where = f" ({context})" if context else ""
        raise AssertionError(f"{what} raised {type(err).__name__}: {str(err)[:300]}{where}") from None


# ---------------------------------------------------------------------------------------------------
# Numbers against a tolerance: NaN and inf never pass
# ---------------------------------------------------------------------------------------------------

def within(err: Numbers, tol: Numbers) -> bool:
    """True when every value of `err` (a number, a sequence of numbers or a tensor) is finite and at most `tol` (a
    number, or a tensor that broadcasts against err). NaN and inf are never within a tolerance."""
    if isinstance(err, numbers.Real) and isinstance(tol, numbers.Real):
        return math.isfinite(err) and err <= tol
    import torch

    e = err.detach().double() if isinstance(err, torch.Tensor) else torch.as_tensor(err, dtype=torch.float64)
    t = torch.as_tensor(tol, dtype=torch.float64, device=e.device)
    return bool(torch.isfinite(e).all()) and bool((e <= t).all())


def at_least(value: float, floor: float) -> bool:
    """True when `value` (a speedup, a p-value...) is finite and at least `floor`: NaN and inf never pass."""
    return math.isfinite(value) and value >= floor


def _non_finite(got: Any, want: Any = None) -> str | None:
    """Where `got` holds NaN/inf that `want` does not (a masked -inf in want may be the same -inf in got), as
    "3 of 96 values, the first at index (0, 1, 2)"; None when there is none."""
    import torch

    g = got.detach().cpu() if isinstance(got, torch.Tensor) else torch.as_tensor(got, dtype=torch.float64)
    if not g.is_floating_point():
        return None
    bad = ~torch.isfinite(g)
    if want is not None:
        w = want.detach().cpu() if isinstance(want, torch.Tensor) else torch.as_tensor(want, dtype=torch.float64)
        if w.shape == g.shape:
            bad &= ~(torch.isinf(w) & (g.to(w.dtype) == w))
    if not bool(bad.any()):
        return None
    if g.dim() == 0:
        return f"got {g.item()}"
    return f"{int(bad.sum())} of {bad.numel()} values, the first at index {tuple(int(i) for i in bad.nonzero()[0])}"


def assert_finite(got: Numbers, what: str, want: Numbers = None, hint: str = "") -> None:
    """Raise AssertionError "`what` produced NaN/inf ..." when `got` holds NaN or inf (where `want`, if given, holds
    a finite value: the same infinity where want has one, a masked -inf, is right)."""
    bad = _non_finite(got, want)
    if bad is not None:
        raise AssertionError(f"{what} produced NaN/inf ({bad}).{' ' + hint if hint else ''}")


def threshold_for(min_fraction: dict[str, float], device_class: str) -> float:
    """The min_fraction entry for this device class ("cuda" is the fallback for any cuda-smXX)."""
    if device_class in min_fraction:
        return float(min_fraction[device_class])
    if device_class.startswith("cuda") and "cuda" in min_fraction:
        return float(min_fraction["cuda"])
    raise AssertionError(
        f"no speed threshold for device class {device_class!r} (known: {sorted(min_fraction)}); "
        "this check has not been calibrated for this kind of machine")


# How many times a speed check measures before it fails (check_speedup): a busy machine gets more tries.
SPEED_ROUNDS = 3


def _held_timers(device: str) -> dict[str, Callable[[Callable[[], Any]], float]] | None:
    """How check_speedup times each contender on a CPU under grading (autograder/checking/isolation.py): the judge's
    baseline and reference with every process of the submission stopped, the learner's call with all but the
    process serving it stopped and counted at the larger of its wall and the submission's CPU time. A submission
    that starts work beside the timed calls (to slow the baseline, or to help its own call) gains nothing."""
    from autograder.checking import isolation
    from minigpt.timing import time_call

    if device != "cpu" or not isolation.available():
        return None

    def judges(fn: Callable[[], Any]) -> float:
        with isolation.submission_stopped():
            return time_call(fn)

    return {"baseline": judges, "reference": judges, "candidate": lambda fn: isolation.time_alone(fn)[0]}


def check_speedup(candidate: Callable[[], Any], baseline: Callable[[], Any], reference: Callable[[], Any], *,
                  what: str, check: str | None = None, min_fraction: dict[str, float] | None = None,
                  repeats: int = 5, warmup: int = 1, device: str = "cpu", rounds: int = SPEED_ROUNDS,
                  min_speedup: float = 0.0) -> dict[str, float]:
    """Assert the learner's speedup over `baseline` is at least a fraction of the reference's, and at least
    `min_speedup` (a floor of its own: where the reference's margin over the baseline is too small for a fraction of
    it to tell a real speedup from noise, as lab 06's speculative decoding over plain decoding).

    The fraction is the calibrated one of `check` on this device class (autograder.checking.thresholds; raises
    Uncalibrated, an AssertionError, before timing anything when there is none), or `min_fraction[class]`.
    The three zero-argument callables are timed interleaved (minigpt.timing.compare) in this process. A round below
    the threshold is measured again, up to `rounds` rounds, and the best round counts: a machine busy with other
    work slows the contenders unevenly for a while, and an honest solution should not lose its points to that; a
    slow implementation stays below in every round (the calibration puts the threshold well above the slow
    implementations' best run: autograder/calibration/). Returns {"speedup", "reference_speedup", "threshold",
    "rounds"} (the best round's figures) where threshold = fraction * reference_speedup.
    """
    from minigpt.timing import compare, device_class

    dev_class = device_class(device)
    if check is not None:
        fraction = thresholds.threshold(check, dev_class)
    elif min_fraction is not None:
        fraction = threshold_for(min_fraction, dev_class)
    else:
        raise TypeError("check_speedup needs a calibrated check name (check=) or min_fraction")
    best: dict[str, float] | None = None
    for round_ in range(1, max(1, rounds) + 1):
        results = compare({"baseline": baseline, "candidate": candidate, "reference": reference},
                          warmup=warmup, repeats=repeats, device=device, measure=_held_timers(device))
        t_base = results["baseline"].median
        learner, ref = t_base / results["candidate"].median, t_base / results["reference"].median
        passed = at_least(learner, fraction * ref) and learner >= min_speedup
        _log_measurement({"what": what, "check": check, "device_class": dev_class, "speedup": learner,
                          "reference_speedup": ref, "min_fraction": fraction, "threshold": fraction * ref,
                          "passed": passed, "round": round_})
        if best is None or learner / ref > best["speedup"] / best["reference_speedup"]:
            best = {"speedup": learner, "reference_speedup": ref, "threshold": fraction * ref, "rounds": round_}
        if passed:
            return best
    assert best is not None
    need = (f"at least {best['threshold']:.2f}x ({fraction:.0%} of the reference, device class {dev_class})" +
            (f" and at least {min_speedup:.2f}x" if min_speedup else ""))
    raise AssertionError(
        f"{what}: your speedup over the baseline is {best['speedup']:.2f}x, the reference solution reaches "
        f"{best['reference_speedup']:.2f}x on this machine, and {need} is needed (best of {rounds} measurements). "
        "Check that the slow path is really gone (no recomputation, no Python loop over tokens, no device<->host "
        "copies).")


def token_list_checked(generation: Any, what: str) -> Any:
    """`generation` (a minigpt.generate.Generation) when its tokens are a list of int token ids; else the check's
    AssertionError (a learner's Generation(None, ...) is a wrong answer, not an error of the check)."""
    tokens = generation.tokens
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise AssertionError(f"{what}: Generation.tokens must be a list of int token ids, got {tokens!r:.200}")
    return generation


def expect_value_error(what: str, fn: Callable[..., Any], *args: Any, naming: Sequence[str] = (), hint: str = "",
                       **kwargs: Any) -> None:
    """fn(*args, **kwargs) must raise a ValueError whose message names each of `naming` (or, with none, has a
    message at all: not empty, not "None"). NotImplementedError: "`what` is not implemented yet"; another exception,
    or none: an AssertionError that says `what` and `hint` (why the input is refused)."""
    try:
        with quiet():
            fn(*args, **kwargs)
    except NotImplementedError:
        raise AssertionError(f"{what}: not implemented yet (NotImplementedError)") from None
    except ValueError as err:
        said = "" if str(err) == "None" else str(err)          # ValueError(None) says nothing
        missing = [n for n in naming if str(n).lower() not in said.lower()] if naming else ([] if said else ["the problem"])
        if missing:
            raise AssertionError(f"{what} raised ValueError, good, but its message should name "
                                 f"{', '.join(map(str, missing))}; got {err!r}") from None
        return
    except Exception as err:
        raise AssertionError(f"{what} should raise ValueError{hint}, got {type(err).__name__}: {err}") from None
    raise AssertionError(f"{what} must raise ValueError{hint}; nothing was raised")


class EachCallItsOwnInput:
    """A zero-argument callable for `check_speedup`: its i-th call is run(input i), and each output is kept with i.

    `inputs` is either a sequence (input i is inputs[i]; a contender called more often than there are inputs fails
    with an AssertionError: no input is ever reused) or a function inputs(i) -> input i, asked once per index and
    remembered. Make it a function of i alone (drawn from a seed the check drew, e.g. with `secrets`): every
    contender's i-th call then gets the same input, each contender its own copy (one that writes into its input
    changes no other's). The inputs are the check's own, so a timed call cannot hand back an answer kept from an
    earlier call; `first_difference` then compares the kept outputs with another contender's, index by index."""

    def __init__(self, run: Callable[[Any], Any], inputs: Sequence[Any] | Callable[[int], Any]) -> None:
        self.run = run
        self.outputs: list[tuple[int, Any]] = []
        self._draw = inputs if callable(inputs) else None
        self._inputs: dict[int, Any] = {} if callable(inputs) else dict(enumerate(inputs))

    def input_at(self, i: int) -> Any:
        """The input of call i (a sequence's i-th item, or inputs(i) asked once)."""
        if i not in self._inputs:
            if self._draw is None:
                raise AssertionError(f"timed call #{i} has no input of its own: the check gave {len(self._inputs)} "
                                     "inputs, and no input is ever reused (give it more, or a function of the call's "
                                     "index)")
            self._inputs[i] = self._draw(i)
        return self._inputs[i]

    def __call__(self) -> Any:
        i = len(self.outputs)
        out = self.run(self.input_at(i))
        self.outputs.append((i, out))
        return out

    def first_difference(self, expected: "EachCallItsOwnInput", same: Callable[[Any, Any], bool]) -> int | None:
        """The index of the first input on which this contender's output is not `same` as expected's, or None."""
        want = dict(expected.outputs)
        return next((i for i, got in self.outputs if i not in want or not same(got, want[i])), None)


def _log_measurement(record: dict[str, Any]) -> None:
    """Append one speed measurement to $COURSE_CALIBRATION_LOG (JSON lines), if set: `make gpu-check` reads it."""
    path = os.environ.get("COURSE_CALIBRATION_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence warnings, logging and progress bars inside a check, so nothing reaches stderr.

    nbgrader scores a test cell with any stderr output as failed. Everything written to stderr
    inside the block (Python-level and C-level) is swallowed; stdout is left alone. Exceptions
    propagate unchanged.
    """
    from minigpt.teaching.profiling import stderr_silenced   # torch is imported only when a check runs

    saved_env = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    previous_disable = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stderr(io.StringIO()), stderr_silenced():
                yield
    finally:
        logging.disable(previous_disable)
        if saved_env is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = saved_env
