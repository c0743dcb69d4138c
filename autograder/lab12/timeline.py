"""Exercise 1: the step timeline, serial and overlapped (the cost model of overlap scheduling)."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from autograder.checking.reference_guard import own_work, watched
from autograder.harness import call_learner, expect_value_error
from minigpt.engine.overlap import step_timeline

EX1 = "Exercise 1 (step_timeline)"
REFERENCES = (step_timeline,)
TOL = 1e-9


def _cases() -> list[tuple[list[float], list[float], float]]:
    """(model_s, cpu_s, handoff_s): hand-made edge cases, then drawn ones (the model slower or faster than the CPU
    step by step, a hand-off or none)."""
    cases = [([4.0], [1.0], 0.5), ([4.0, 4.0, 4.0], [1.0, 1.0, 6.0], 0.5), ([2.0, 2.0], [3.0, 3.0], 0.0),
             ([1.0, 5.0, 1.0, 5.0], [2.0, 0.0, 4.0, 1.0], 0.25)]
    g = torch.Generator().manual_seed(12)
    for n in (5, 9, 16):
        model = (torch.rand(n, generator=g) * 8 + 0.5).tolist()
        cpu = (torch.rand(n, generator=g) * 6).tolist()
        cases.append((model, cpu, float(torch.rand(1, generator=g)) * 0.5))
    return cases


def _diagnose(model: list[float], cpu: list[float], handoff: float, overlapped: bool, got: list) -> str:
    """The likely mistake behind a wrong timeline, tried against known wrong versions."""
    def serial(with_handoff: bool) -> list[tuple[float, float]]:
        out, end = [], 0.0
        for m, c in zip(model, cpu):
            start = end + c + (handoff if with_handoff else 0.0)
            out.append((start, start + m))
            end = start + m
        return out

    def overlapped_as(start_of: Callable[[list, float], float]) -> list[tuple[float, float]]:
        out: list = []
        for i, (m, c) in enumerate(zip(model, cpu)):
            start = c + handoff if not out else start_of(out, c)
            out.append((start, start + m))
        return out

    wrong = {
        "the serial loop has no model thread to hand over to: start_i = end_(i-1) + cpu_i": serial(True),
    } if not overlapped else {
        "the overlapped CPU work of step i starts when step i-1 is LAUNCHED (start_(i-1)), not at time 0: "
        "start_i = max(end_(i-1), start_(i-1) + cpu_i) + handoff":
            overlapped_as(lambda out, c: max(out[-1][1], c) + handoff),
        "a step cannot launch before the step before it has ended (the model runs one step at a time): "
        "start_i = max(end_(i-1), start_(i-1) + cpu_i) + handoff":
            overlapped_as(lambda out, c: out[-1][0] + c + handoff),
        "every overlapped launch pays the hand-off, after the later of the two events":
            overlapped_as(lambda out, c: max(out[-1][1], out[-1][0] + c)),
        "overlapped, step i's CPU work runs beside step i-1's model call: it is not added to it": serial(False),
    }
    for why, timeline in wrong.items():
        if _same(got, timeline):
            return why
    return "see the rule in the exercise: end_i = start_i + model_i, and start_i as stated for each mode"


def _same(got: Any, want: list[tuple[float, float]]) -> bool:
    try:
        pairs = [(float(a), float(b)) for a, b in got]
    except (TypeError, ValueError):
        return False
    return len(pairs) == len(want) and all(math.isclose(a, c, abs_tol=TOL) and math.isclose(b, d, abs_tol=TOL)
                                           for (a, b), (c, d) in zip(pairs, want))


def check_step_timeline(fn: Callable) -> None:
    """fn(model_s, cpu_s, *, overlapped, handoff_s) -> [(start, end)] of each model step, against the reference on
    hand-made and drawn timelines, both modes; unequal lengths and negative times refused."""
    own_work(fn, REFERENCES, what=EX1)
    fn = watched(fn, REFERENCES, EX1)
    for model, cpu, handoff in _cases():
        for overlapped in (False, True):
            what = (f"{EX1}, {len(model)} steps, model_s={[round(m, 3) for m in model[:4]]}..., "
                    f"cpu_s={[round(c, 3) for c in cpu[:4]]}..., overlapped={overlapped}, handoff_s={handoff:.3f}")
            got = call_learner(EX1, fn, list(model), list(cpu), overlapped=overlapped, handoff_s=handoff, context=what)
            want = step_timeline(model, cpu, overlapped=overlapped, handoff_s=handoff)
            if not _same(got, want):
                shown = got[:3] if isinstance(got, (list, tuple)) else got
                raise AssertionError(f"{what}: expected (start, end) pairs beginning {[(round(a, 3), round(b, 3)) for a, b in want[:3]]}, "
                                     f"got {shown!r}. {_diagnose(model, cpu, handoff, overlapped, got)}")
    expect_value_error(f"{EX1}: 2 model times and 3 CPU times", fn, [1.0, 2.0], [1.0, 1.0, 1.0], overlapped=True,
                       handoff_s=0.0)
    expect_value_error(f"{EX1}: a negative time", fn, [1.0, -2.0], [1.0, 1.0], overlapped=False, handoff_s=0.0)
