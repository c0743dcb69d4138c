"""No check passes an output of NaN or inf.

`err > tol` as a check's failure test is False for NaN (every comparison with NaN is), so a NaN output passes it.
The checks compare numbers with a tolerance through autograder.harness (within, at_least; assert_finite says where
the NaN/inf is) or torch.allclose / math.isclose (NaN is never close). Two kinds of test:

* a scan (ast) of every check module for a hand-written <, <=, >, >= whose side names a tolerance or an error
  (tol, atol, eps, margin, err, diff, rel, bound, need, threshold...) or computes one (abs(), .abs(), .norm()):
  each is listed as file:line; the few that compare the check's own numbers are exempt below, with the reason;
* for a representative tolerance check of every lab, the solution passes and the same code with one output value
  set to NaN, then to +-inf, fails, saying so (the checks draw their inputs from their own seeded generators).

About 5 s on the shared 2-core machine.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from autograder import lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.attention import _check_shapes, causal_mask, naive_attention
from minigpt.cache import paged_attention as paged_module
from minigpt.engine.metrics import goodput, request_metrics
from minigpt.engine.speculative import sampling_probs
from minigpt.kernels.paged_decode import merge_partials
from minigpt.serving.lora import lora_delta
from tests.labs.learner_copy import as_learner
from tests.labs.notebook_solutions import solution_cells

REPO = Path(__file__).resolve().parents[2]
CHECK_MODULES = sorted({*REPO.glob("autograder/lab0*.py"), *REPO.glob("autograder/lab0*/*.py"),
                        *REPO.glob("autograder/interview/*.py"), REPO / "autograder/gpu_bench.py",
                        REPO / "autograder/gpu_tier/gpu_check.py", REPO / "autograder/harness.py"})

# ---------------------------------------------------------------------------------------------------
# 1. The scan
# ---------------------------------------------------------------------------------------------------

TOLERANCE_WORDS = {"tol", "atol", "rtol", "eps", "tolerance", "margin", "err", "errs", "error", "errors", "diff",
                   "delta", "rel", "bound", "need", "threshold"}
ERROR_CALLS = {"abs", "norm", "fabs"}                     # abs(a - b), (a - b).abs().max(), (a - b).norm()
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
ORDERING_METHODS = {"gt", "lt", "ge", "le", "greater", "less", "greater_equal", "less_equal"}

# (file, enclosing function): why its comparisons need no helper. Each must still match something (no stale entry).
EXEMPT = {
    ("autograder/harness.py", "within"): "the helper itself: finite first, then err <= tol",
    ("autograder/gpu_bench.py", "fits"): "bytes the benchmark will allocate against free GPU memory: the "
                                         "benchmark's own sizing, no learner value",
    ("autograder/interview/questions.py", "_fits"): "picks a (model, GPU) pair for a generated question from the "
                                                    "course's tables, no learner value",
    ("autograder/lab03/scheduler.py", "_check_work_conserving"): "whole block counts (blocks_needed, the pool's "
                                                                 "free count kept by the judge): integers, no NaN",
    ("autograder/lab06/common.py", "noncentrality_for_power"): "seeded Monte Carlo of the chi-square test's power: "
                                                               "the check's own draws, no learner value",
}


def _words(name: str) -> set[str]:
    return set(name.lower().split("_"))


def _error_like(node: ast.AST) -> str | None:
    """What makes an expression look like an error or a tolerance (a name, or an abs()/.abs()/.norm() call)."""
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name and _words(name) & TOLERANCE_WORDS:
            return name
        if isinstance(n, ast.Call):
            called = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
            if called in ERROR_CALLS:
                return f"{called}()"
    return None


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(name of the innermost enclosing function or '<module>', node) for every node."""
    def walk(node: ast.AST, owner: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else owner
            yield name, child
            yield from walk(child, name)
    yield from walk(tree, "<module>")


def bare_comparisons(source: str) -> list[tuple[int, str, str, str]]:
    """(line, enclosing function, why, source) of each hand-written ordering comparison of an error or tolerance."""
    tree = ast.parse(source)
    found = []
    for owner, node in _functions(tree):
        sides: list[ast.AST] = []
        if isinstance(node, ast.Compare) and any(isinstance(op, ORDERING) for op in node.ops):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ORDERING_METHODS:
            sides = [node.func.value, *node.args]              # err.gt(tol), torch.gt(err, tol)
        why = next((w for w in map(_error_like, sides) if w), None)
        if why:
            found.append((node.lineno, owner, why, ast.get_source_segment(source, node) or ""))
    return found


def _scan() -> tuple[list[str], set[tuple[str, str]]]:
    offending, exempt_used = [], set()
    for path in CHECK_MODULES:
        rel = path.relative_to(REPO).as_posix()
        for line, owner, why, text in bare_comparisons(path.read_text()):
            if (rel, owner) in EXEMPT:
                exempt_used.add((rel, owner))
            else:
                offending.append(f"{rel}:{line} ({why}): {text}")
    return offending, exempt_used


def test_check_modules_compare_errors_only_through_the_nan_safe_helpers() -> None:
    offending, _ = _scan()
    assert not offending, ("comparisons of an error with a tolerance that NaN would pass (use autograder.harness."
                           "within / at_least):\n" + "\n".join(offending))


def test_every_exemption_is_still_needed() -> None:
    _, used = _scan()
    assert set(EXEMPT) <= used, f"exemptions that match nothing any more: {sorted(set(EXEMPT) - used)}"


@pytest.mark.parametrize("snippet", [
    "if err > tol:\n    raise AssertionError('x')",
    "if (got - want).abs().max() > 1e-4:\n    raise AssertionError('x')",
    "bad = ((got - want).abs() > ATOL).nonzero()",
    "ok = all(abs(a - b) <= 1e-6 for a, b in pairs)",
    "if rel_error >= 0.01:\n    pass",
    "if learner < need:\n    pass",
    "mask = err.gt(tol)",
    "mask = torch.gt(err, 1e-3)",
])
def test_the_scan_finds_bare_tolerance_comparisons(snippet: str) -> None:
    assert bare_comparisons(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "if not within(err, tol):\n    pass",
    "if len(rows) > 3 or step >= n_layers:\n    pass",
    "if not torch.allclose(got, want, atol=1e-5):\n    pass",
    "if not math.isclose(v, measured, rel_tol=0.0, abs_tol=1e-9):\n    pass",
])
def test_the_scan_leaves_other_comparisons_alone(snippet: str) -> None:
    assert not bare_comparisons(snippet), snippet


# ---------------------------------------------------------------------------------------------------
# 2. One tolerance check per lab: the solution passes, the same code with a NaN or an inf in its output fails
# ---------------------------------------------------------------------------------------------------

SAYS_NON_FINITE = re.compile(r"NaN|\bnan\b|\binf\b|finite", re.IGNORECASE)


def _poison(out: Any, value: float) -> Any:
    """A copy of the tensor `out` with its middle element set to `value`."""
    out = out.detach().clone().contiguous()
    out.view(-1)[out.numel() // 2] = value
    return out


def poisoned(fn: Callable, value: float) -> Callable:
    """fn, its (tensor) output with one element set to value."""
    def learner(*args: Any, **kwargs: Any) -> Any:
        return _poison(fn(*args, **kwargs), value)
    return learner


# The solutions, as a learner's notebook holds them (the checks refuse the package's own objects).
learner_attention = as_learner(naive_attention, _check_shapes=as_learner(_check_shapes),
                               causal_mask=as_learner(causal_mask))
_paged_helpers = {"gather_kv": as_learner(paged_module.gather_kv), "_check": as_learner(paged_module._check)}
learner_paged_decode = as_learner(paged_module.paged_decode_attention, **_paged_helpers)
learner_request_metrics, learner_goodput = as_learner(request_metrics), as_learner(goodput)
learner_merge = as_learner(merge_partials)
learner_sampling_probs = as_learner(sampling_probs)
learner_lora_delta = as_learner(lora_delta)
LAB05 = solution_cells("05_quantization", "ex1_code", "ex2_code", "ex3_code", "ex4_code", preamble="""
import math
import torch
""")
LAB09 = solution_cells("09_long_context", "ex1_code", "ex2_code", "ex7_code", preamble="""
import math
import torch
from minigpt.kernels.paged_decode import merge_partials
from minigpt.longctx import ring_attention as ra, sliding_window as sw
from minigpt.parallel.comm import CountingComm
""")


def roofline(intensity: float, peak_flops: float, bandwidth: float) -> float:
    return min(peak_flops, intensity * bandwidth)


def vocab_logits(x: torch.Tensor, weight_shard: torch.Tensor, comm: Any) -> torch.Tensor:
    return comm.all_gather(x @ weight_shard.t(), dim=-1)


Case = tuple[Callable[..., Any], tuple]          # (check, the answer it is given)


def lab00_case(value: float | None) -> Case:
    return lab00.check_attainable_flops, ((lambda *args: value) if value is not None else roofline,)


def lab03_case(value: float | None) -> Case:
    if value is None:
        return lab03.check_metrics, (learner_request_metrics, learner_goodput)

    def metrics(seq):
        return dataclasses.replace(learner_request_metrics(seq), tpot=value)
    return lab03.check_metrics, (metrics, learner_goodput)


def lab05_case(value: float | None) -> Case:
    def gptq(w, H, bits, group_size, block_size):
        q, scale = LAB05["gptq"](w, H, bits, group_size, block_size)
        return q, (scale if value is None else _poison(scale, value))
    return lab05.check_gptq, (gptq,)


def lab09_cache_case(value: float | None) -> Case:
    class Cache(LAB09["RingKVCache"]):
        def read(self):
            k, v = super().read()
            return (k, v) if value is None else (_poison(k, value), v)
    return lab09.check_ring_cache, (Cache,)


def _plain(check: Callable, fn: Callable) -> Callable[[float | None], Case]:
    """A case whose answer is fn, poisoned with the value (None: fn itself)."""
    return lambda value: (check, (fn if value is None else poisoned(fn, value),))


CASES = {
    "lab00 attainable_flops": lab00_case,
    "lab01 causal_attention": _plain(lab01.check_causal_attention, learner_attention),
    "lab02 paged_decode_attention": _plain(lab02.check_paged_decode_attention, learner_paged_decode),
    "lab03 metrics": lab03_case,
    "lab04 merge_partials": _plain(lab04.check_merge_partials, learner_merge),
    "lab05 gptq": lab05_case,
    "lab06 sampling_probs": _plain(lab06.check_sampling_probs, learner_sampling_probs),
    "lab07 vocab_parallel_logits": _plain(lab07.check_vocab_parallel_logits, vocab_logits),
    "lab08 lora_delta": _plain(lab08.check_lora_delta, learner_lora_delta),
    "lab09 scaled_inv_freq": _plain(lab09.check_scaled_inv_freq, LAB09["scaled_inv_freq"]),
    "lab09 RingKVCache": lab09_cache_case,
    "lab09 ring_attention": _plain(lab09.check_ring_attention, LAB09["ring_attention"]),
}


@pytest.mark.parametrize("case", CASES)
def test_the_solution_passes(case: str) -> None:
    check, args = CASES[case](None)
    check(*args)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("case", CASES)
def test_a_nan_or_inf_output_fails_saying_so(case: str, value: float) -> None:
    check, args = CASES[case](value)
    with pytest.raises(AssertionError) as failure:
        check(*args)
    assert not isinstance(failure.value, ReferenceHandedIn), str(failure.value)
    assert SAYS_NON_FINITE.search(str(failure.value)), str(failure.value)


class _NanGradient(torch.autograd.Function):
    """The identity forward; its backward hands back NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, math.nan)


class NanKeyGradients:
    """A right forward, right dq and dv, and dk all NaN: the middle of the three relative errors, which max() of the
    list skipped (max(0.0, nan) is 0.0)."""

    @staticmethod
    def apply(q, k, v, is_causal):
        from minigpt.kernels.flash_attention import FlashAttentionFunction
        return FlashAttentionFunction.apply(q, _NanGradient.apply(k), v, is_causal)


def test_the_gpu_tier_gradient_check_refuses_a_nan_gradient() -> None:
    """Lab 04's backward speed check on its CPU code path (tiny shapes, the threshold pinned: the speed is not graded)."""
    from autograder.checking.thresholds import fixed

    with fixed(0.0), pytest.raises(AssertionError, match=r"gradients differ from the reference .*\bnan\b"):
        lab04.check_flash_backward_speed(NanKeyGradients, seq_len=20, head_dim=16, batch=1, heads=2, rounds=1,
                                         device="cpu")
