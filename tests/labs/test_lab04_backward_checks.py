"""Lab 04 part two's checks (autograder/lab04/backward.py): the solution passes; the stub, the plausible mistakes and
the package's reference (handed in, wrapped, or its kernels launched from the notebook's launcher) are rejected with a
message naming the mistake. The wrong kernels are the solution cell's source with one line changed, compiled as
notebook code. Triton runs in the interpreter; about 90 s on a quiet 2-core machine (fp32 only, except the pass)."""

from __future__ import annotations

import json
import linecache

import pytest
import torch

from autograder import lab04
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.kernels import flash_backward as reference_backward
from minigpt.kernels.flash_attention import FlashAttentionFunction
from minigpt.kernels.flash_backward import flash_attention_backward
from minigpt.kernels.tiled_attention import TiledAttentionFunction, tiled_attention_backward, tiled_attention_forward
from tests.labs.notebook_solutions import SOLUTIONS, solution_cells

_PREAMBLE = """
import math
import torch
import minigpt.kernels
import triton
import triton.language as tl
"""
_CELLS = ("ex2_code", "ex3_code", "ex4_code", "ex7_code", "ex8_code")
SOLUTION = solution_cells("04_flash_attention", *_CELLS, preamble=_PREAMBLE)
FP32 = (torch.float32,)


def _with_bug(name: str, *replacements: tuple[str, str]) -> dict:
    """The solution's cells with ex7_code's source changed by `replacements` (each must apply), in a fresh namespace."""
    nb = json.loads((SOLUTIONS / "04_flash_attention" / "04_flash_attention.ipynb").read_text())
    source = next("".join(c["source"]) for c in nb["cells"]
                  if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ex7_code")
    for old, new in replacements:
        assert old in source, f"{name}: the solution no longer contains {old!r}"
        source = source.replace(old, new)
    namespace = solution_cells("04_flash_attention", "ex4_code", preamble=_PREAMBLE)
    filename = f"/notebook-cells/04_flash_attention/ex7_{name}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def _stub(*args, **kwargs):
    raise NotImplementedError()


BUGS = {
    "delta_per_tile": (("dsT = pT * (dpT - delta[None, :])", "dsT = pT * (dpT - tl.sum(pT * dpT, 0)[None, :])"),
                       ("ds = p * (dp - delta[:, None])", "ds = p * (dp - tl.sum(p * dp, 1)[:, None])")),
    "no_scale_in_ds": (("dk = dk * sm_scale", "dk = dk * 1.0"), ("dq = dq * sm_scale", "dq = dq * 1.0")),
    "dk_not_summed_over_group": (("for g in range(GROUP):", "for g in range(1):"),),
    "causal_bound_drops_diagonal": (("hi = tl.minimum(k_len, start_m + BLOCK_M + offset)",
                                     "hi = tl.minimum(k_len, start_m + offset) // BLOCK_N * BLOCK_N"),),
}
MESSAGES = {"delta_per_tile": "delta was computed per key tile", "no_scale_in_ds": "sqrt\\(D\\) times too large",
            "dk_not_summed_over_group": "only one query head's share", "causal_bound_drops_diagonal": "loop bounds"}


def test_backward_solution_passes():
    lab04.check_flash_backward(SOLUTION["flash_backward"])          # fp32 and fp16, as graded


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_backward_names_the_mistake(bug):
    wrong = _with_bug(bug, *BUGS[bug])["flash_backward"]
    with pytest.raises(AssertionError, match=MESSAGES[bug]):
        lab04.check_flash_backward(wrong, dtypes=FP32)


def test_backward_rejects_the_stub():
    with pytest.raises(AssertionError, match="not implemented"):
        lab04.check_flash_backward(_stub, dtypes=FP32)


def test_backward_rejects_pytorch_without_a_kernel():
    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        lab04.check_flash_backward(SOLUTION["tiled_backward"], dtypes=FP32)


def _reference_wrapper(q, k, v, out, lse, d_out, causal):
    return flash_attention_backward(q, k, v, out, lse, d_out, causal=causal)


def _reference_kernels(q, k, v, out, lse, d_out, causal):
    """The notebook's launcher with the package's kernels substituted."""
    namespace = solution_cells("04_flash_attention", "ex7_code", preamble=_PREAMBLE)
    namespace.update(bwd_preprocess_kernel=reference_backward._bwd_preprocess_kernel)
    return namespace["flash_backward"](q, k, v, out, lse, d_out, causal)


@pytest.mark.parametrize("reference", [flash_attention_backward, _reference_wrapper, _reference_kernels])
def test_backward_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_flash_backward(reference, dtypes=FP32)


# --- the autograd Functions ------------------------------------------------------------------------------------

def test_function_solutions_pass():
    lab04.check_attention_function(SOLUTION["TiledFunction"], triton=False)
    lab04.check_attention_function(SOLUTION["TritonFunction"], triton=True)


class _NoConventionCheck(torch.autograd.Function):
    """Answers is_causal with Tq != Tk with the course's bottom-right mask instead of refusing."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        q4, k4, v4 = (t.unsqueeze(1) if t.ndim == 3 else t for t in (q, k, v))
        out, lse = tiled_attention_forward(q4, k4, v4, causal=bool(is_causal))
        if q.ndim == 3:
            out, lse = out[:, 0], lse[:, 0]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = bool(is_causal)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        if q.ndim == 3:
            grads = tiled_attention_backward(q[:, None], k[:, None], v[:, None], out[:, None], lse[:, None],
                                             d_out[:, None], causal=ctx.is_causal)
            return (*(g[:, 0] for g in grads), None)
        return (*tiled_attention_backward(q, k, v, out, lse, d_out, causal=ctx.is_causal), None)


class _SavesLseWithHeadAxis(_NoConventionCheck):
    """Keeps the (B, 1, Nq) LSE for 3-D inputs."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        SOLUTION["to_heads"](q, k, v, is_causal)
        q4, k4, v4 = (t.unsqueeze(1) if t.ndim == 3 else t for t in (q, k, v))
        out, lse = tiled_attention_forward(q4, k4, v4, causal=bool(is_causal))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = bool(is_causal)
        return out[:, 0] if q.ndim == 3 else out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        if q.ndim == 3:
            grads = tiled_attention_backward(q[:, None], k[:, None], v[:, None], out, lse, d_out[:, None],
                                             causal=ctx.is_causal)
            return (*(g[:, 0] for g in grads), None)
        return (*tiled_attention_backward(q, k, v, out, lse, d_out, causal=ctx.is_causal), None)


class _SubclassesTheReference(FlashAttentionFunction):
    pass


class _WrapsTheReference(torch.autograd.Function):
    """Its own forward and backward, each a thin wrapper around the package's Function."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = FlashAttentionFunction.apply(*leaves, is_causal)
        ctx.graph = (leaves, out)
        return out.detach()

    @staticmethod
    def backward(ctx, d_out):
        leaves, out = ctx.graph
        return (*torch.autograd.grad(out, leaves, d_out), None)


def test_function_rejects_an_answer_for_ambiguous_causal_shapes():
    with pytest.raises(AssertionError, match="raise ValueError when is_causal and Tq != Tk"):
        lab04.check_attention_function(_NoConventionCheck, triton=False)


def test_function_rejects_an_lse_with_the_head_axis():
    with pytest.raises(AssertionError, match="exactly one log-sum-exp tensor of shape \\(2, 19\\)"):
        lab04.check_attention_function(_SavesLseWithHeadAxis, triton=False)


def test_function_needs_triton_for_the_triton_function():
    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        lab04.check_attention_function(SOLUTION["TiledFunction"], triton=True)


@pytest.mark.parametrize("reference", [FlashAttentionFunction, TiledAttentionFunction, _SubclassesTheReference,
                                       _WrapsTheReference])
def test_function_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_attention_function(reference, triton=True)
