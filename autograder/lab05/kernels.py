"""Exercises 8 and 9: PyTorch's CPU INT4 kernel and the Triton dequantizing GEMV, with their speed checks."""

from __future__ import annotations

import secrets
from typing import Any, Callable

import torch
import torch.nn.functional as F

from autograder.checking.call_conditions import DEVICE_HINT, default_device_elsewhere
from autograder.checking.models import count_triton_launches
from autograder.launches import call_launcher
from autograder.harness import EachCallItsOwnInput, at_least, call_learner, check_speedup, quiet, within
from autograder.lab05.gemv_cases import EDGE_CASES, GemvCase, gemv_cases, gemv_inputs
from autograder.lab05.common import GEMV_SPEED_CHECKS, INT4_CPU_SPEED_CHECK, _call, _randn
from autograder.checking.reference_guard import own_work
from autograder.checking.wire import is_remote, run_where
from minigpt.quant.cpu_kernels import Int4WeightOnlyLinear
from minigpt.quant.formats import quantize
from minigpt.quant.linear import WeightOnlyLinear


def _gemv_case(bits: int, N: int, K: int, group: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from minigpt.quant.formats import pack_int4
    w, x = _randn(N, K, seed=seed), _randn(K, seed=seed + 1)
    qt = quantize(w, bits, group_size=group)
    return x, (pack_int4(qt.q) if bits == 4 else qt.q), qt.scale


class LaunchCounting:
    """fn(*args) -> (its value, the number of Triton kernel launches, the launched kernels' functions), counted where
    fn runs. Built with run_where beside the learner's function: when judged it lives in the learner's kernel and the
    judge calls it like the learner's own code (the reference watch of `_call` applies to it)."""

    def __call__(self, fn: Callable, *args: Any) -> tuple[Any, int, list[Callable]]:
        with count_triton_launches() as launches:
            value = fn(*args)
        return value, launches[0], list(launches.kernels)


def check_dequant_gemv(fn: Callable) -> None:
    """fn(x (K,), qweight, scale (N, K / group_size), bits, group_size) -> y (N,) = dequantized W @ x, with qweight
    int8 (N, K) or uint8 (N, K / 2) packed low nibble first (minigpt.quant.formats.pack_int4)."""
    from minigpt.kernels.dequant_gemv import dequant_gemv, dequant_gemv_reference
    ex = "Exercise 9 (the dequantizing GEMV kernel)"
    own_work(fn, (dequant_gemv, dequant_gemv_reference), what=ex)
    counting = run_where(fn, LaunchCounting)       # where fn runs (the learner's kernel when judged): so does Triton
    for bits, N, K, group, seed in ((8, 20, 64, 32, 0), (4, 20, 64, 32, 1), (4, 33, 128, 64, 2)):
        x, qw, scale = _gemv_case(bits, N, K, group, seed)
        what = f"dequant_gemv(INT{bits}, N={N}, K={K}, group_size={group})"
        y, launches, kernels = _call((dequant_gemv, dequant_gemv_reference), ex, what, counting, fn, x.clone(),
                                     qw.clone(), scale.clone(), bits, group)
        if not launches:
            raise AssertionError(f"{what}: no Triton kernel was launched; write the GEMV as a @triton.jit kernel")
        for kernel in kernels:                     # the package's Triton kernel behind the learner's launcher
            own_work(kernel, (), what=ex)
        want = dequant_gemv_reference(x, qw, scale, bits, group)
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != (N,):
            raise AssertionError(f"{what}: expected y of shape ({N},), got "
                                 f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}")
        if not torch.allclose(y.float().cpu(), want, atol=1e-3, rtol=1e-3):
            hint = ""
            if not torch.isfinite(y.float()).all():
                hint = (" It has NaN: a load read outside its tensor, or a masked load without other= (its masked "
                        "lanes are undefined: NaN in the course's interpreter, as a GPU may leave them).")
            elif bits == 4:
                swapped = ((qw >> 4) | (qw << 4)).to(torch.uint8)
                if torch.allclose(y.float().cpu(), dequant_gemv_reference(x, swapped, scale, bits, group), atol=1e-3, rtol=1e-3):
                    hint = " The nibbles are swapped: column 2j is the LOW nibble (b & 15), 2j+1 the high one (b >> 4)."
                else:
                    hint = " Sign-extend each nibble ((n ^ 8) - 8) and multiply by the scale of group (column // group_size)."
            err = (y.float().cpu() - want).abs().max().item()
            raise AssertionError(f"{what}: differs from the dequantized product by up to {err:.3g}.{hint}")
    _check_gemv_default_device_elsewhere(fn, counting, ex)
    for case in (*gemv_cases(), *EDGE_CASES):
        _check_drawn_gemv(fn, case, ex, (dequant_gemv, dequant_gemv_reference))


def _check_gemv_default_device_elsewhere(fn: Callable, counting: Any, ex: str) -> None:
    """The launcher with torch's default device moved off the inputs': y must be allocated on x's device."""
    from minigpt.kernels.dequant_gemv import dequant_gemv, dequant_gemv_reference
    x, qw, scale = _gemv_case(8, 20, 64, 32, 5)
    what = "dequant_gemv(INT8, N=20, K=64, group_size=32) with torch's default device moved off the inputs'"
    try:
        with default_device_elsewhere():
            y, _, _ = _call((dequant_gemv, dequant_gemv_reference), ex, what, counting, fn, x.clone(), qw.clone(),
                            scale.clone(), 8, 32)
    except AssertionError as err:
        said = str(err).replace("is not implemented yet (NotImplementedError)",
                                "raised NotImplementedError (a tensor on the meta device reached the kernel)")
        raise AssertionError(f"{said.rstrip('.')}. {DEVICE_HINT}.") from None
    if not isinstance(y, torch.Tensor) or y.device != x.device:
        raise AssertionError(f"{what}: y is on {getattr(y, 'device', type(y).__name__)}, x on {x.device}. "
                             f"{DEVICE_HINT}.")
    if not torch.allclose(y.float(), dequant_gemv_reference(x, qw, scale, 8, 32), atol=1e-3, rtol=1e-3):
        raise AssertionError(f"{what}: differs from the dequantized product. {DEVICE_HINT}.")


def _check_drawn_gemv(fn: Callable, case: GemvCase, ex: str, references: tuple) -> None:
    """One drawn or edge case (gemv_cases.py): y in x's dtype and shape, equal to the dequantized product of the contiguous
    copies (float16 output rounds to about 1e-3 relative)."""
    from minigpt.kernels.dequant_gemv import dequant_gemv_reference
    laid, clean = gemv_inputs(case)
    what = f"{ex}, {'edge' if case in EDGE_CASES else 'drawn'} case ({case.describe()})"
    y, launches = call_launcher(what, fn, *laid, case.bits, case.group_size, exercise=ex, watch=references,
                                guard_pages=True, block_n=case.block_n, block_k=case.block_k)
    if not launches:
        raise AssertionError(f"{what}: no Triton kernel was launched")
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (case.N,) or y.dtype != case.dtype:
        got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise AssertionError(f"{what}: expected y of shape ({case.N},) in x's dtype {case.dtype}, got {got}")
    x, qweight, scale = clean
    want = dequant_gemv_reference(x.float(), qweight, scale, case.bits, case.group_size)
    tol = 1e-3 if case.dtype == torch.float32 else 1e-2
    if not torch.allclose(y.float().cpu(), want, atol=tol, rtol=tol):
        err = (y.float().cpu() - want).abs().max().item()
        raise AssertionError(f"{what}: differs from the dequantized product by up to {err:.3g} (NaN: a load read "
                             "outside its tensor, past K or a row, or with another tensor's strides, or a masked load "
                             "without other=, whose masked lanes are undefined; a large error "
                             "with K several tiles long: each tile must ADD to the accumulator, and the packed "
                             "bytes of tile k0 start at k0 // 2). Rerun it: the launcher takes block_n and block_k.")


def check_int4_cpu_linear(make: Callable, *, K: int = 4096, N: int = 4096, group_size: int = 128,
                          repeats: int = 5, allow_reference: bool = False) -> dict[str, float]:
    """make(weight (N, K) float32 or bfloat16, group_size) -> f with f(x (1, K)) ~= x @ W_hat^T, W_hat the asymmetric INT4 weight
    (per group scale and min), computed by PyTorch's CPU INT4 kernel. Correct values first, then the speedup
    over an fp32 matmul must reach the calibrated fraction (INT4_CPU_SPEED_CHECK) of the reference's, timed in the same
    run. `allow_reference=True` (make calibrate) lifts the refusal of the package's Int4WeightOnlyLinear."""
    ex = "Exercise 8 (make_int4_linear)"
    refs = () if allow_reference else (Int4WeightOnlyLinear, WeightOnlyLinear.from_weight, WeightOnlyLinear.forward)
    if refs:
        own_work(make, refs, what=ex)
    x = _randn(3, 256, seed=1)
    for dtype in (torch.float32, torch.bfloat16):        # checkpoints come in bf16: quantize from float32 values
        w = (_randn(192, 256, seed=0) * 0.05).to(dtype)
        _check_int4_values(refs, ex, make, w, x)
    return _int4_speed(make, N, K, group_size, repeats)


def _check_int4_values(refs: tuple, ex: str, make: Callable, w: torch.Tensor, x: torch.Tensor) -> None:
    """make(w (192, 256), 64)(x (3, 256)) within 1% of x @ W_hat^T, W_hat quantized from w's float32 values."""
    name = str(w.dtype).removeprefix("torch.")
    f = _call(refs, ex, f"make_int4_linear(w (192, 256) {name}, 64)", make, w.clone(), 64)
    y = _call(refs, ex, f"the INT4 linear of a {name} weight on x (3, 256)", f, x.clone())
    wg = w.float().view(192, -1, 64)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    s = (hi - lo) / 15
    w_hat = (torch.round((wg - lo) / s).clamp(0, 15) * s + lo).view(192, 256)
    want, exact = x @ w_hat.T, x @ w.float().T
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (3, 192):
        raise AssertionError(f"the INT4 linear of a {name} weight must return (3, 192) for x (3, 256), got "
                             f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}")
    rel = ((y.float() - want).norm() / want.norm()).item()
    if not within(rel, 0.01):
        hint = (" Your output matches the full-precision weight, not its INT4 version: quantize it."
                if within(((y.float() - exact).norm() / exact.norm()).item(), 0.01) else
                " Compute the ranges, scales and codes in float32 (weight.float()): in bfloat16 they round, and codes "
                "near a half step flip." if w.dtype != torch.float32 else
                " The kernel computes (q - 8) * scale + zero per group, so pass zero = min + 8 * scale, "
                "and scales_and_zeros as (n_groups, N, 2) in bf16.")
        raise AssertionError(f"the INT4 linear of a {name} weight differs from x @ W_hat^T by {rel:.3g} "
                             f"(relative).{hint}")


def speed_weight(N: int, K: int) -> torch.Tensor:
    """The timed W (N, K): seeded, so the learner's side and the judge build the same one (64 MiB never cross)."""
    return _randn(N, K, seed=2) * 0.02


def learner_int4_linear(make: Callable, N: int, K: int, group_size: int) -> Callable:
    """make(speed_weight(N, K), group_size): run with run_where beside `make` (judged: in the learner's kernel,
    and the judge gets a handle to the learner's linear)."""
    with quiet():
        return make(speed_weight(N, K), group_size)


def _relative_error(y: Any, want: torch.Tensor) -> float:
    """|y - want| / |want| (inf for anything that is not a tensor of want's shape)."""
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(want.shape):
        return float("inf")
    return ((y.float() - want.float()).norm() / want.float().norm()).item()


def _samples_of(contender: EachCallItsOwnInput, calls: int) -> Callable[[], None]:
    """A sample for `compare`: `calls` calls of the contender, each on its next input (a GEMV is short: one timed
    sample covers several). A contender that lives in the learner's kernel (judged) makes its `calls` calls there in
    one request, timed from here: a round trip per call would time the wire (on a loaded machine the honest solution
    fell below its threshold that way: 0.88x against fp32 in 3 rounds of 3, two mutation runs beside it)."""
    if is_remote(contender.run):
        def remote_sample() -> None:
            indices = range(len(contender.outputs), len(contender.outputs) + calls)
            outs = run_where(contender.run, calls_each, contender.run, [contender.input_at(i) for i in indices])
            contender.outputs.extend(zip(indices, outs))
        return remote_sample

    def sample() -> None:
        for _ in range(calls):
            contender()
    return sample


def calls_each(fn: Callable, inputs: list) -> list:
    """[fn(x) for x in inputs], where fn lives (run_where): one request for several calls."""
    return [fn(x) for x in inputs]


def _int4_speed(make: Callable, N: int, K: int, group_size: int, repeats: int, calls: int = 4) -> dict[str, float]:
    """The learner's INT4 linear (built where `make` runs) against an fp32 matmul and the reference INT4 linear (both
    here), on the same W and the same fresh inputs, timed here around each call; then the learner's outputs against
    the reference's on each input: a linear that returns a kept answer, or garbage fast, has its speed refused."""
    f = run_where(make, learner_int4_linear, make, N, K, group_size)
    w = speed_weight(N, K)
    base = secrets.randbits(32)     # drawn per run: no timed input is foreseen or reused; each contender its own copy
    learner, dense, ref = (EachCallItsOwnInput(fn, lambda i: _randn(1, K, seed=base + i))
                           for fn in (f, _dense(w), Int4WeightOnlyLinear(w, group_size)))
    result = check_speedup(_samples_of(learner, calls), _samples_of(dense, calls), _samples_of(ref, calls),
                           what=f"INT4 GEMV {N}x{K} against fp32", check=INT4_CPU_SPEED_CHECK, repeats=repeats)
    wrong = learner.first_difference(ref, lambda y, want: within(_relative_error(y, want), 0.01))
    if wrong is not None:
        rel = _relative_error(dict(learner.outputs)[wrong], dict(ref.outputs)[wrong])
        raise AssertionError(f"the timed INT4 linear ({N}x{K}) differs from the reference INT4 linear on timed input "
                             f"#{wrong} (relative error {rel:.3g}): its speed does not count")
    return result


def _dense(w: torch.Tensor) -> Callable:
    return lambda x: F.linear(x, w)


def check_gemv_speed(fn: Callable, *, N: int = 8192, K: int = 8192, group_size: int = 128, bits: tuple[int, ...] = (8, 4),
                     device: str = "cuda", rounds: int = 5) -> dict[str, Any]:
    """GPU tier: fn as in check_dequant_gemv, INT8 and INT4 at 8192 x 8192, batch 1, against a bf16 matmul, timed in
    interleaved rounds with the reference kernel; each width's speedup must reach its calibrated fraction
    (GEMV_SPEED_CHECKS) of the reference's. `device="cpu"` (float32, small N, K) runs the same code in the
    interpreter, for tests."""
    from autograder.checking.thresholds import threshold
    from minigpt.kernels.dequant_gemv import dequant_gemv
    from minigpt.timing import bench_interleaved, device_class

    fractions = {b: threshold(GEMV_SPEED_CHECKS[b], device_class(device)) for b in bits}
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    out: dict[str, Any] = {}
    for b in bits:
        x, qw, scale = _gemv_case(b, N, K, group_size, 0)
        x, qw, scale = x.to(device, dtype), qw.to(device), scale.to(device)
        w_dense = _randn(N, K, seed=5).to(device, dtype)
        with quiet():
            want = dequant_gemv(x, qw, scale, b, group_size).float()
            got = call_learner(f"your INT{b} GEMV at {N}x{K}", fn, x, qw, scale, b, group_size)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise AssertionError(f"INT{b} GEMV at {N}x{K}: expected y of shape ({N},), got {getattr(got, 'shape', got)!r}")
        # bf16 operands over K = 8192 terms: a correct kernel that rounds W or y to bf16 lands near 3e-3 in norm
        # (elementwise tolerances fail it where y is near 0); a wrong nibble, group or row is far above 1e-2.
        rel = _relative_error(got, want)
        if not within(rel, 1e-2):
            raise AssertionError(f"INT{b} GEMV at {N}x{K}: differs from the reference kernel by {rel:.3g} "
                                 "(|y - y_ref| / |y_ref|, at most 0.01)")
        with quiet():
            times = bench_interleaved({"dense": lambda: torch.matmul(w_dense, x),
                                       "learner": lambda: fn(x, qw, scale, b, group_size),
                                       "reference": lambda: dequant_gemv(x, qw, scale, b, group_size)},
                                      rounds=rounds, device=device)
        speed, ref = times["dense"] / times["learner"], times["dense"] / times["reference"]
        need = fractions[b] * ref
        weight_bytes = qw.nbytes + scale.nbytes
        out[f"int{b}"] = {"speedup": speed, "reference_speedup": ref, "threshold": need,
                          "GB/s": weight_bytes / times["learner"] / 1e9}
        if not at_least(speed, need):
            raise AssertionError(f"INT{b} GEMV: {speed:.2f}x over a {str(dtype)[6:]} matmul, the reference reaches "
                                 f"{ref:.2f}x; at least {need:.2f}x is needed. Dequantize in registers on the way to "
                                 "the multiply: never write a dequantized copy of W to memory.")
    return out
