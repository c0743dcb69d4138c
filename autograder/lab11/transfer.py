"""Exercise 1: when each layer's KV send finishes if layer l leaves as soon as it is computed and the link is free.

    check_layer_send_ends(layer_send_ends)    seeded cases drawn here (equal layers with the link faster and slower
                                              than the compute, uneven layers, a free link, one layer): every end
                                              time equal to the recurrence's; the likely wrong recurrences named
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.harness import call_learner
from minigpt.disagg import transfer_cost

WHAT = "Exercise 1 (layer_send_ends)"
REFERENCES = (transfer_cost.layer_send_ends, transfer_cost.exposed_after_compute)


def _cases() -> list[tuple[str, list[float], list[float]]]:
    g = torch.Generator().manual_seed(11)
    uneven_c = (torch.rand(7, generator=g, dtype=torch.float64) * 3e-3 + 1e-4).tolist()
    uneven_x = (torch.rand(7, generator=g, dtype=torch.float64) * 4e-3 + 1e-4).tolist()
    return [("8 equal layers, each send shorter than a layer's compute", [2e-3] * 8, [0.5e-3] * 8),
            ("8 equal layers, each send longer than a layer's compute", [1e-3] * 8, [2.5e-3] * 8),
            ("7 uneven layers", uneven_c, uneven_x),
            ("a send of zero seconds", [1e-3, 2e-3, 1e-3], [0.0, 0.0, 0.0]),
            ("one layer", [3e-3], [1e-3]),
            ("a slow first send, then fast ones", [1e-3] * 5, [6e-3] + [0.2e-3] * 4)]


def _wrong_versions(c: list[float], x: list[float]) -> list[tuple[list[float], str]]:
    """The recurrences a learner is likely to write instead, each with what it gets wrong."""
    cum = [sum(c[: i + 1]) for i in range(len(c))]
    after = [cum[-1] + sum(x[: i + 1]) for i in range(len(c))]
    no_queue = [cum[i] + x[i] for i in range(len(c))]
    ends, free = [], 0.0
    for t, s in zip(c, x):
        free = max(t, free) + s
        ends.append(free)
    return [(after, "these are the ends of sends that wait for the WHOLE prefill (the whole-request variant): layer l "
                    "may leave as soon as layer l is computed"),
            (no_queue, "the link carries one send at a time: a send starts when its layer is computed AND the "
                       "previous send has finished, start_l = max(c_l, end_{l-1})"),
            (ends, "c_l is when layer l's compute ENDS: the sum of compute_s[0..l], not compute_s[l] alone")]


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(p, q, rel_tol=1e-9, abs_tol=1e-12) for p, q in zip(a, b))


def check_layer_send_ends(fn: Callable) -> None:
    """fn(compute_s, send_s) -> ends: end_l = max(c_l, end_{l-1}) + send_s[l], c_l = compute_s[0] + ... + compute_s[l]."""
    own_work(fn, REFERENCES, what=WHAT)
    for name, c, x in _cases():
        with no_calls_into(*REFERENCES, what=WHAT):
            got: Any = call_learner(WHAT, fn, list(c), list(x), context=name)
        want = transfer_cost.layer_send_ends(c, x)
        if not isinstance(got, (list, tuple)) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                        for v in got):
            raise AssertionError(f"{WHAT}, {name}: return a list of {len(c)} floats (seconds), got "
                                 f"{type(got).__name__}")
        got = [float(v) for v in got]
        if len(got) != len(want):
            raise AssertionError(f"{WHAT}, {name}: expected one end time per layer ({len(want)}), got {len(got)}")
        if not _close(got, want):
            hints = [msg for wrong, msg in _wrong_versions(c, x) if _close(got, wrong)]
            first = next(i for i, (p, q) in enumerate(zip(got, want))
                         if not math.isclose(p, q, rel_tol=1e-9, abs_tol=1e-12))
            raise AssertionError(f"{WHAT}, {name}: layer {first}'s send ends at {got[first] * 1e3:.4g} ms, but it "
                                 f"should end at {want[first] * 1e3:.4g} ms. "
                                 + (hints[0] if hints else "end_l = max(c_l, end_{l-1}) + send_s[l], with c_l the "
                                    "sum of compute_s[0..l] and end_{-1} = 0"))
