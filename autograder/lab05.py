"""Checks for Lab 05, quantization.

Each check takes the learner's function or class, runs it on small seeded tensors (or a tiny model) and
raises AssertionError saying what is wrong (which input, expected vs got, likely cause).

CPU tier (correctness):
    check_quantize_symmetric(fn)        INT8/INT4 symmetric, per channel and per group; bad input errors
    check_int4_model_perplexity(fn)     the trained target with the learner's INT4 g128 weights: perplexity bound
    check_int4_packing(pack, unpack)    two codes per byte, element 2j in the low nibble
    check_quantize_fp8(fn)              scale so max|x| lands on the format's max, then cast
    check_gptq(fn)                      error propagation through the Cholesky of H^-1, lazy blocks
    check_awq_fold(fn)                  scales folded into the producers: same function in full precision
    check_smoothing_factors(fn)         SmoothQuant's migration factors for several alphas
    check_quantized_kv_cache(cls)       INT8 K/V with one scale per token and KV head
    check_dequant_gemv(fn)              the Triton GEMV (interpreter on CPU) against the dequantized product
    check_int4_cpu_linear(make)         PyTorch's CPU INT4 kernel: right values, speed relative to the reference
Interview questions: check_q1_e4m3_max ... check_q5_gptq_hessian_bytes.
Edge inputs: an all-zero row / group / token / tensor (scale 0 must not give NaN), bf16 / fp16 inputs, a dead
activation channel and a dead input channel of the Hessian. Every check refuses the package's reference handed in
(reference_guard: minigpt.quant.* itself, a subclass inheriting update(), a thin wrapper calling it, the package's
Triton kernel behind the notebook's launcher).
GPU tier (speed): check_gemv_speed(fn) behind autograder.harness.require_gpu.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.nn.functional as F

from autograder.harness import call_learner, check_answer, check_speedup, quiet
from autograder.reference_guard import no_calls_into, own_work
from minigpt.config import TARGET_CONFIG, ModelConfig
from minigpt.model import GPT
from minigpt.quant import formats
from minigpt.quant.awq import AWQ_GROUPS, apply_awq_scales, awq_model
from minigpt.quant.cpu_kernels import Int4WeightOnlyLinear
from minigpt.quant.formats import dequantize, fp8_format, quantize, unpack_int4
from minigpt.quant.gptq import gptq_model, gptq_quantize, hessian
from minigpt.quant.kv_cache import QuantizedLayerKVCache, dequantize_kv, quantize_kv
from minigpt.quant.linear import WeightOnlyLinear
from minigpt.quant.smoothquant import smooth_model, smoothing_factors

__all__ = ["check_quantize_symmetric", "check_int4_model_perplexity", "check_int4_packing", "check_quantize_fp8", "check_gptq", "check_awq_fold",
           "check_smoothing_factors", "check_quantized_kv_cache", "check_dequant_gemv", "check_int4_cpu_linear",
           "check_gemv_speed", "check_q1_e4m3_max", "check_q2_e5m2_smallest_normal", "check_q3_range_ratio",
           "check_q4_gptq_recovery", "check_q5_gptq_hessian_bytes", "INT4_CPU_SPEED_CHECK", "GEMV_SPEED_CHECKS",
           "TINY_CONFIG"]

# Speed thresholds, calibrated per device class by `make calibrate` (autograder/calibrate.py): a fraction of the
# reference's speedup in the same run, chosen between the reference's ratio and a slow implementation's.
# CPU: INT4 kernel vs fp32 at 4096 x 4096, batch 1 (slow: dequantize to float on every call).
INT4_CPU_SPEED_CHECK = "lab05_int4_cpu_linear"
# GPU: the learner's Triton GEMV against a bf16 matmul at 8192 x 8192, batch 1, one check per width
# (slow: dequantize to a bf16 matrix, then matmul).
GEMV_SPEED_CHECKS = {8: "lab05_dequant_gemv_int8", 4: "lab05_dequant_gemv_int4"}

TINY_CONFIG = ModelConfig(vocab_size=128, max_seq_len=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)


# The package's code a learner's answer must not be (nor call), per exercise.
_INT_QUANT = (formats.quantize, formats.fake_quantize, formats.QuantizedTensor, WeightOnlyLinear.from_weight,
              gptq_quantize, quantize_kv)
_PACKING = (formats.pack_int4, formats.unpack_int4)
_FP8 = (formats.quantize_fp8, quantize_kv)
_GPTQ = (gptq_quantize, gptq_model)
_AWQ = (apply_awq_scales, awq_model)
_SMOOTH = (smoothing_factors, smooth_model)
_KV = (QuantizedLayerKVCache.update, quantize_kv, dequantize_kv)


EX1 = "Exercise 1 (quantize_symmetric)"


def _call(references: tuple, exercise: str, what: str, fn: Callable, *args: Any) -> Any:
    """call_learner, refusing a call into the exercise's reference code while the learner's code runs."""
    with no_calls_into(*references, what=exercise):
        return call_learner(what, fn, *args)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _expect_value_error(fn: Callable, what: str, *args: Any, **kwargs: Any) -> None:
    try:
        with quiet():
            fn(*args, **kwargs)
    except NotImplementedError:
        raise AssertionError("the function is not implemented yet (NotImplementedError)") from None
    except ValueError as err:
        if not str(err):
            raise AssertionError(f"{what}: the ValueError needs a message naming the problem") from None
        return
    except Exception as err:
        raise AssertionError(f"{what}: expected a ValueError naming the problem, got {type(err).__name__}: {err}") from None
    raise AssertionError(f"{what}: expected a ValueError naming the problem, but the call returned normally")


# ---------------------------------------------------------------------------------------------------
# Integer formats
# ---------------------------------------------------------------------------------------------------

def check_quantize_symmetric(fn: Callable) -> None:
    """fn(w (out, in), bits, group_size=None) -> (q int8 (out, in), scale float (out, n_groups)) with
    s = max|w_group| / (2^(bits-1) - 1) and q = clamp(round(w / s), -qmax, qmax); n_groups = 1 when group_size is None."""
    own_work(fn, _INT_QUANT, what=EX1)
    cases = [(8, None, (12, 64), torch.float32), (8, 16, (12, 64), torch.float32), (4, None, (10, 32), torch.float32),
             (4, 8, (6, 48), torch.float32), (4, 16, (16, 64), torch.float32), (8, 16, (8, 64), torch.bfloat16),
             (4, None, (6, 32), torch.float16)]
    for i, (bits, group, shape, dtype) in enumerate(cases):
        w = (_randn(*shape, seed=i) * (1 + torch.arange(shape[0])[:, None])).to(dtype)  # rows of different ranges
        w[1] = 0                                    # a dead output channel: scale 0 must not make NaN codes
        w[2, :group or shape[1]] = 0                # ... and a dead group
        what = f"quantize_symmetric(w {shape} {str(dtype)[6:]} with an all-zero row, bits={bits}, group_size={group})"
        out = _call(_INT_QUANT, EX1, what, fn, w.clone(), bits, group)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{what} must return a tuple (q, scale), got {type(out).__name__}")
        q, scale = out
        ref = quantize(w, bits, group_size=group)
        qmax = 2 ** (bits - 1) - 1
        if isinstance(scale, torch.Tensor) and (not torch.isfinite(scale).all() or (isinstance(q, torch.Tensor) and
                                                                                  q.is_floating_point() and
                                                                                  not torch.isfinite(q).all())):
            raise AssertionError(f"{what}: non-finite scales or codes: an all-zero row (or group) has max|w| = 0; "
                                 "clamp the scale to a tiny positive value (e.g. 1e-12) so its codes are 0")
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != shape:
            raise AssertionError(f"{what}: q must be a tensor of the weight's shape {shape}, got "
                                 f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        if q.is_floating_point():
            raise AssertionError(f"{what}: q must hold integers (torch.int8), got {q.dtype}")
        if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != tuple(ref.scale.shape):
            got = tuple(scale.shape) if isinstance(scale, torch.Tensor) else type(scale).__name__
            hint = (" Groups run along the input axis: one scale per (row, group of group_size columns)."
                    if group is not None else " One scale per output channel (row).")
            raise AssertionError(f"{what}: scale must have shape {tuple(ref.scale.shape)} (out, n_groups), got {got}.{hint}")
        if int(q.min()) < -qmax or int(q.max()) > qmax:
            raise AssertionError(f"{what}: codes must lie in [-{qmax}, {qmax}], got [{int(q.min())}, {int(q.max())}]. "
                                 f"Symmetric quantization does not use -{qmax + 1}: the grid is symmetric around 0.")
        if scale.dtype != torch.float32:
            raise AssertionError(f"{what}: scales must be float32 whatever the weight's dtype, got {scale.dtype}: "
                                 "compute them from w.float()")
        if not torch.allclose(scale.float(), ref.scale, rtol=1e-5, atol=1e-12):
            r = (scale.float() / ref.scale).median().item()
            hint = ""
            if abs(r - qmax / (qmax + 1)) < 1e-3:
                hint = (f" Your scale is max|w| / {qmax + 1}: then max|w| maps to {qmax + 1}, which the clamp cuts to "
                        f"{qmax}. Divide by {qmax}.")
            elif r < 0.7:
                hint = " Your scale is too small: it must come from the absolute maximum of the group, not its mean."
            elif group is not None:
                hint = " Compute one scale per row and per group of group_size consecutive inputs (w.view(out, -1, group_size))."
            raise AssertionError(f"{what}: scales differ from max|w| / {qmax} (median ratio {r:.4f}).{hint}")
        deq = (q.float().view(shape[0], -1, group or shape[1]) * scale.float()[..., None]).view(shape)
        if (q.to(torch.int16) != ref.q.to(torch.int16)).float().mean() > 1e-3 or (deq - dequantize(ref)).abs().max() > ref.scale.max():
            raise AssertionError(f"{what}: the codes differ from round(w / scale): use round-to-nearest and clamp to "
                                 f"[-{qmax}, {qmax}] with each element divided by its own group's scale")
    w = _randn(4, 32)
    _expect_value_error(fn, "bits=5 (unsupported)", w, 5, None)
    _expect_value_error(fn, "group_size=12 with 32 input features (does not divide)", w, 4, 12)
    bad = w.clone()
    bad[1, 2] = float("nan")
    _expect_value_error(fn, "a weight with a NaN", bad, 8, None)


def check_int4_model_perplexity(fn: Callable, *, n_windows: int = 2, seq_len: int = 128, max_excess: float = 0.005) -> dict[str, float]:
    """End to end: every projection of the trained target replaced by fn's INT4 codes * scales (groups of 128);
    the validation perplexity on seeded windows must be within `max_excess` (relative) of the reference RTN model's."""
    from minigpt.checkpoint import load_model
    from minigpt.quant.linear import quantize_linears, quantize_weight_only
    from minigpt.quant.quality import perplexity, validation_subset

    def make(name: str, w: torch.Tensor) -> torch.nn.Module:
        q, scale = _call(_INT_QUANT, EX1, f"quantize_symmetric({name}, bits=4, group_size=128)", fn, w.clone(), 4, 128)
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_((q.float().view(w.shape[0], -1, 128) * scale.float()[..., None]).view(w.shape))
        return lin

    own_work(fn, _INT_QUANT, what=EX1)
    with quiet():
        model = load_model("target").eval()
    learner_model = quantize_linears(model, make)            # the learner's function runs first: a stub fails fast
    with quiet():
        x, y = validation_subset(n_windows, seq_len, seed=1)
        got = perplexity(learner_model, x, y)
        ref = perplexity(quantize_weight_only(model, 4, 128), x, y)
        base = perplexity(model, x, y)
    if not got <= ref * (1 + max_excess):
        raise AssertionError(f"the target with your INT4 g128 weights has perplexity {got:.3f} on {x.numel()} validation "
                             f"tokens; the reference round-to-nearest reaches {ref:.3f} (fp32 {base:.3f}), and at most "
                             f"{ref * (1 + max_excess):.3f} is accepted. Check the scale (absolute maximum / 7) and the clamp.")
    return {"perplexity": got, "reference": ref, "fp32": base}


def check_int4_packing(pack: Callable, unpack: Callable) -> None:
    """pack(q int8 (..., n) in [-8, 7]) -> uint8 (..., n/2), element 2j in the low nibble, 2j+1 in the high;
    unpack(packed) -> int8 (..., n), sign-extended."""
    ex = "Exercise 2 (pack_int4, unpack_int4)"
    own_work(pack, _PACKING, what=ex)
    own_work(unpack, _PACKING, what=ex)
    q = torch.randint(-8, 8, (5, 16), generator=torch.Generator().manual_seed(0), dtype=torch.int64).to(torch.int8)
    q[0, :4] = torch.tensor([1, 2, -1, -8], dtype=torch.int8)
    packed = _call(_PACKING, ex, "pack_int4", pack, q.clone())
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or tuple(packed.shape) != (5, 8):
        got = f"{packed.dtype} {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise AssertionError(f"pack_int4 of int8 (5, 16) must return uint8 (5, 8), two codes per byte; got {got}")
    first = int(packed[0, 0])
    if first != 0x21:
        hint = " The nibbles are in the wrong order: element 2j goes in the LOW nibble, 2j+1 in the high." \
            if first == 0x12 else " Keep the low 4 bits of each code (q & 0xF), the even element in bits 0-3."
        raise AssertionError(f"pack_int4([1, 2, ...]) must start with byte 0x21 (1 | 2 << 4), got {first:#04x}.{hint}")
    if int(packed[0, 1]) != 0x8F:
        raise AssertionError(f"pack_int4([.., .., -1, -8]) must give byte 0x8f (-1 -> 0xf low, -8 -> 0x8 high), "
                             f"got {int(packed[0, 1]):#04x}: store each code's two's-complement low nibble (q & 0xF)")
    if not torch.equal(unpack_int4(packed), q):
        raise AssertionError("your packed bytes do not unpack to the original codes with the reference layout")
    out = _call(_PACKING, ex, "unpack_int4", unpack, formats.pack_int4(q))
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (5, 16):
        raise AssertionError(f"unpack_int4 of uint8 (5, 8) must return (5, 16) codes, got "
                             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    if not torch.equal(out.to(torch.int16), q.to(torch.int16)):
        neg = (q < 0) & (out.to(torch.int16) == (q.to(torch.int16) & 0xF))
        hint = " Negative codes come back as 8..15: sign-extend the nibble ((n ^ 8) - 8)." if neg.any() else \
            " Element 2j is the low nibble (b & 0xF), 2j+1 the high one (b >> 4)."
        raise AssertionError(f"unpack_int4 does not recover the codes.{hint}")


# ---------------------------------------------------------------------------------------------------
# FP8
# ---------------------------------------------------------------------------------------------------

def check_quantize_fp8(fn: Callable) -> None:
    """fn(x, fmt) with fmt "e4m3" or "e5m2" -> (codes in torch.float8_e4m3fn / float8_e5m2, float32 scale
    (a one-element tensor)), scale = max|x| / fp8_max, codes = (x / scale) cast; x ~ codes * scale."""
    ex = "Exercise 3 (quantize_fp8)"
    own_work(fn, _FP8, what=ex)
    for fmt, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        info = fp8_format(fmt)
        zeros = _call(_FP8, ex, f"quantize_fp8(an all-zero x, '{fmt}')", fn, torch.zeros(4, 8), fmt)
        if not (isinstance(zeros, tuple) and len(zeros) == 2 and isinstance(zeros[0], torch.Tensor)
                and torch.isfinite(zeros[0].float()).all() and torch.isfinite(torch.as_tensor(zeros[1]).float()).all()
                and bool((zeros[0].float() * torch.as_tensor(zeros[1]).float() == 0).all())):
            raise AssertionError(f"quantize_fp8(an all-zero x, '{fmt}') must give zero codes and a finite scale: "
                                 "max|x| = 0 makes scale 0 and x / scale NaN; clamp the scale to a tiny positive value")
        for magnitude, xdtype in ((3000.0, torch.float32), (1e-3, torch.float32), (20.0, torch.bfloat16)):
            x = (_randn(8, 32, seed=int(magnitude)) * magnitude).to(xdtype)
            what = f"quantize_fp8(x {str(xdtype)[6:]} with max|x| = {x.abs().max().item():.3g}, '{fmt}')"
            out = _call(_FP8, ex, what, fn, x.clone(), fmt)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise AssertionError(f"{what} must return (codes, scale)")
            codes, scale = out
            if not isinstance(codes, torch.Tensor) or codes.dtype != dtype:
                raise AssertionError(f"{what}: codes must have dtype {dtype}, got "
                                     f"{codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__}")
            scale = torch.as_tensor(scale, dtype=torch.float32)
            back = codes.float() * scale
            x = x.float()
            rel = ((back - x).abs() / x.abs().clamp(min=x.abs().max().item() * 1e-2)).max().item()
            if not torch.isfinite(back).all() or rel > info["eps"]:
                hint = ""
                if torch.allclose(scale, torch.ones_like(scale)):
                    hint = (f" Your scale is 1: a plain cast saturates at {info['max']:g} (E4M3 has no infinity) and "
                            "loses small values to subnormals and zero. Divide by max|x| / fp8_max first.")
                raise AssertionError(f"{what}: codes * scale differs from x by up to {rel:.3g} relative "
                                     f"(the format's step is {info['eps']:g}).{hint}")
            if abs(codes.float().abs().max().item() - info["max"]) > 1e-3 * info["max"]:
                raise AssertionError(f"{what}: max|x| should map to the format's max {info['max']:g}, "
                                     f"got {codes.float().abs().max().item():g}; scale = max|x| / fp8 max")


# ---------------------------------------------------------------------------------------------------
# GPTQ
# ---------------------------------------------------------------------------------------------------

def _output_error(w_hat: torch.Tensor, w: torch.Tensor, H: torch.Tensor) -> float:
    d = (w_hat.double() - w.double())
    return torch.einsum("oi,ij,oj->", d, H.double(), d).item() / w.shape[0]


def check_gptq(fn: Callable) -> None:
    """fn(w (out, in), H (in, in), bits, group_size, block_size) -> (q (out, in) ints, scale (out, in / group_size)),
    symmetric codes: w_hat = q * scale per group. Checked on the Hessian of correlated inputs with outlier channels
    and a dead channel."""
    own_work(fn, _GPTQ, what="Exercise 4 (gptq)")
    g = torch.Generator().manual_seed(0)
    n, d_in, d_out, group = 512, 64, 24, 16
    mix = torch.randn(d_in, d_in, generator=g) / d_in ** 0.5 + torch.eye(d_in)
    x = torch.randn(n, d_in, generator=g) @ mix
    x[:, :3] *= 8
    x[:, 40] = 0                                    # a dead input channel: H[40, 40] = 0 (the damping keeps H invertible)
    H = hessian(x).float()
    w = torch.randn(d_out, d_in, generator=g)
    ref = gptq_quantize(w, H, 4, group, block_size=16)
    err_ref = _output_error(dequantize(ref), w, H)
    rtn = quantize(w, 4, group_size=group)
    err_rtn = _output_error(dequantize(rtn), w, H)
    results = {}
    for block in (16, 64):
        what = f"gptq(w {tuple(w.shape)}, H, bits=4, group_size={group}, block_size={block})"
        out = _call(_GPTQ, "Exercise 4 (gptq)", what, fn, w.clone(), H.clone(), 4, group, block)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{what} must return (q, scale)")
        q, scale = out
        if tuple(q.shape) != tuple(w.shape) or tuple(scale.shape) != (d_out, d_in // group):
            raise AssertionError(f"{what}: expected q {tuple(w.shape)} and scale {(d_out, d_in // group)}, got "
                                 f"{tuple(q.shape)} and {tuple(scale.shape)}")
        if int(q.min()) < -7 or int(q.max()) > 7:
            raise AssertionError(f"{what}: 4-bit symmetric codes must lie in [-7, 7], got [{int(q.min())}, {int(q.max())}]")
        w_hat = (q.float().view(d_out, -1, group) * scale.float()[..., None]).view(d_out, d_in)
        err = _output_error(w_hat, w, H)
        results[block] = w_hat
        if abs(err - err_rtn) <= 1e-6 * err_rtn or torch.equal(q.to(torch.int16), rtn.q.to(torch.int16)):
            raise AssertionError(f"{what}: your codes are plain round-to-nearest (output error {err:.4g}, the same as RTN). "
                                 "After quantizing column i, spread its error err = (w_i - q_i) / U[i, i] over the "
                                 "remaining columns: w[:, j] -= err * U[i, j] for j > i (U = cholesky(H^-1), upper).")
        if err > 1.05 * err_ref:
            raise AssertionError(f"{what}: output error tr(dW H dW^T)/out = {err:.4g}; GPTQ reaches {err_ref:.4g} and "
                                 f"round-to-nearest {err_rtn:.4g}. Check the damping (1% of mean diag H), the upper "
                                 "Cholesky factor of H^-1, and that group scales come from the already-updated weights.")
    if not torch.allclose(results[16], results[64], atol=1e-4 * w.abs().max().item()):
        raise AssertionError("block_size=16 and block_size=64 give different weights: the lazy block update is only a "
                             "reordering of the same arithmetic. After each block apply W[:, end:] -= Err @ U[start:end, end:].")


# ---------------------------------------------------------------------------------------------------
# AWQ and SmoothQuant
# ---------------------------------------------------------------------------------------------------

def _tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(TINY_CONFIG).eval()
    with torch.no_grad():       # norms with non-trivial weights, so folding into them is visible
        for block in model.layers:
            block.attn_norm.weight.uniform_(0.5, 1.5)
            block.mlp_norm.weight.uniform_(0.5, 1.5)
    return model


def _tiny_scales(model: GPT, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scales = {}
    for i in range(len(model.layers)):
        for projs, fold in AWQ_GROUPS:
            width = model.get_submodule(f"layers.{i}.{projs[0]}").weight.shape[1]
            scales[f"layers.{i}.{fold}"] = torch.rand(width, generator=g) * 3 + 0.25
    return scales


def check_awq_fold(fn: Callable) -> None:
    """fn(model, scales) -> a new model where, for each key "layers.i.<producer>" with s (in,), the consumers'
    weight columns are multiplied by s and the producer (a norm weight, or w_up's rows) divided by s."""
    model = _tiny_model()
    before = copy.deepcopy(model.state_dict())
    scales = _tiny_scales(model)
    own_work(fn, _AWQ, what="Exercise 5 (fold_awq_scales)")
    new = _call(_AWQ, "Exercise 5 (fold_awq_scales)", "fold_awq_scales", fn, model, {k: v.clone() for k, v in scales.items()})
    if not isinstance(new, GPT):
        raise AssertionError(f"fold_awq_scales must return a GPT, got {type(new).__name__}")
    if any(not torch.equal(v, model.state_dict()[k]) for k, v in before.items()):
        raise AssertionError("fold_awq_scales modified the model it was given: work on a copy (copy.deepcopy)")
    wq = new.layers[0].attn.wq.weight.detach()
    s = scales["layers.0.attn_norm"]
    if not torch.allclose(wq, before["layers.0.attn.wq.weight"] * s[None, :], rtol=1e-5, atol=1e-7):
        raise AssertionError("layers.0.attn.wq: its input columns must be multiplied by s (W[:, j] * s_j), so the "
                             "salient channels get a finer grid once quantized")
    tokens = torch.randint(0, TINY_CONFIG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = model(tokens), new(tokens)
    if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        err = (got - want).abs().max().item()
        raise AssertionError(f"the folded model's logits differ from the original's by {err:.3g} in full precision. "
                             "Every s must be undone where the input is produced: divide the norm weight "
                             "(attn_norm, mlp_norm) by s, and w_up's output rows by s for w_down's scales.")


def check_smoothing_factors(fn: Callable) -> None:
    """fn(act_absmax (in,), weights [W (out_i, in)], alpha) -> s (in,) = act^alpha / max|W[:, j]|^(1 - alpha)."""
    ex = "Exercise 6 (smoothing_factors)"
    own_work(fn, _SMOOTH, what=ex)
    g = torch.Generator().manual_seed(0)
    act = torch.rand(32, generator=g) * 10 + 0.1
    act[3] = 80.0
    weights = [torch.randn(16, 32, generator=g), torch.randn(8, 32, generator=g) * 1.5]
    dead_act = act.clone()
    dead_act[7] = 0.0                               # a dead activation channel (never fires on the calibration set)
    s = _call(_SMOOTH, ex, "smoothing_factors with a dead channel", fn, dead_act, [w.clone() for w in weights], 0.5)
    if not isinstance(s, torch.Tensor) or not torch.isfinite(s).all() or not bool((s > 0).all()):
        raise AssertionError("smoothing_factors with a dead activation channel (max|x_7| = 0) must still give finite, "
                             f"positive factors (x is divided by s), got s[7] = {s[7] if isinstance(s, torch.Tensor) else s!r}"
                             ": clamp both maxima to a small positive value (1e-5) before the powers")
    for alpha in (0.5, 0.8, 0.2):
        what = f"smoothing_factors(alpha={alpha})"
        s = _call(_SMOOTH, ex, what, fn, act.clone(), [w.clone() for w in weights], alpha)
        want = smoothing_factors(act, weights, alpha)
        if not isinstance(s, torch.Tensor) or s.shape != want.shape:
            raise AssertionError(f"{what}: expected a tensor of shape {tuple(want.shape)} (one factor per input channel)")
        if not torch.allclose(s.float(), want, rtol=1e-4):
            hint = " The weight maximum is over all output rows of ALL the weights that read x (torch.cat them)." \
                if torch.allclose(s.float(), smoothing_factors(act, weights[:1], alpha), rtol=1e-4) else \
                " alpha is the exponent of the activation maximum, 1 - alpha that of the weight maximum."
            raise AssertionError(f"{what}: factors differ from max|x_j|^alpha / max|W_:,j|^(1-alpha).{hint}")


# ---------------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------------

def check_quantized_kv_cache(cache_cls: type) -> None:
    """cache_cls(batch_size, max_seq_len, n_kv_heads, head_dim) storing int8 codes .k, .v (B, S, Hkv, D) with a
    scale per token and head; update(k, v) returns all positions so far, dequantized to float32. The last write is
    bfloat16 and holds an all-zero token."""
    ex = "Exercise 7 (the INT8 KV cache)"
    own_work(cache_cls, (QuantizedLayerKVCache,), what=ex, methods=("__init__", "update"))
    B, S, H, D = 2, 10, 3, 16
    try:
        with quiet():
            cache = cache_cls(B, S, H, D)
    except NotImplementedError:
        raise AssertionError("the quantized cache is not implemented yet (NotImplementedError)") from None
    except Exception as err:
        raise AssertionError(f"{cache_cls.__name__}({B}, {S}, {H}, {D}) raised {type(err).__name__}: {err}") from None
    for name in ("k", "v"):
        buf = getattr(cache, name, None)
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.int8 or tuple(buf.shape) != (B, S, H, D):
            got = f"{buf.dtype} {tuple(buf.shape)}" if isinstance(buf, torch.Tensor) else repr(buf)
            raise AssertionError(f"cache.{name} must be a preallocated int8 tensor {(B, S, H, D)}, got {got}")
    g = torch.Generator().manual_seed(0)
    magnitudes = torch.tensor([100.0, 1.0, 0.01])[None, None, :, None]      # heads differ by orders of magnitude
    ks, vs = [], []
    for step, T in enumerate((5, 1, 2, 2)):
        k = torch.randn(B, T, H, D, generator=g) * magnitudes
        v = torch.randn(B, T, H, D, generator=g) * magnitudes.flip(2)
        what = f"write #{step + 1} of {T} position(s)"
        if step == 3:
            k, v = k.bfloat16(), v.bfloat16()
            k[0, 1] = 0
            v[1, 0] = 0
            what += " in bfloat16, one token all zeros"
        ks.append(k.float())
        vs.append(v.float())
        out = _call(_KV, ex, f"{what}: update(k, v)", cache.update, k.clone(), v.clone())
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{what}: update must return (k_all, v_all)")
        want_k, want_v = torch.cat(ks, 1), torch.cat(vs, 1)
        for got, want, name in ((out[0], want_k, "keys"), (out[1], want_v, "values")):
            if tuple(got.shape) != tuple(want.shape):
                raise AssertionError(f"{what}: returned {name} of shape {tuple(got.shape)}, expected {tuple(want.shape)}")
            if not torch.isfinite(got.float()).all():
                raise AssertionError(f"{what}: returned {name} hold NaN or inf: an all-zero token has max|x| = 0, so "
                                     "its scale must be clamped to a tiny positive value (its codes are then 0)")
            bound = want.abs().amax(-1, keepdim=True) / 254 * 1.01 + 1e-12          # half a step per (token, head)
            if ((got.float() - want).abs() > bound).any():
                worst = ((got.float() - want).abs() / bound).amax(dim=(0, 1, 3))
                head = int(worst.argmax())
                hint = (" The error is in the small heads: a scale shared across heads is set by the largest head, so "
                        "small heads round to a few levels. Use one scale per (token, KV head): amax over head_dim only."
                        if head > 0 else " scale = max|x| over head_dim / 127, codes = round(x / scale).")
                raise AssertionError(f"{what}: dequantized {name} of head {head} are off by more than half a step "
                                     f"(max|x| / 254 per token and head).{hint}")
        if getattr(cache, "length", None) != sum(x.shape[1] for x in ks):
            raise AssertionError(f"{what}: cache.length should be {sum(x.shape[1] for x in ks)}, got {getattr(cache, 'length', None)!r}")


# ---------------------------------------------------------------------------------------------------
# Triton GEMV and the CPU INT4 kernel
# ---------------------------------------------------------------------------------------------------

def _gemv_case(bits: int, N: int, K: int, group: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from minigpt.quant.formats import pack_int4
    w, x = _randn(N, K, seed=seed), _randn(K, seed=seed + 1)
    qt = quantize(w, bits, group_size=group)
    return x, (pack_int4(qt.q) if bits == 4 else qt.q), qt.scale


def check_dequant_gemv(fn: Callable) -> None:
    """fn(x (K,), qweight, scale (N, K / group_size), bits, group_size) -> y (N,) = dequantized W @ x, with qweight
    int8 (N, K) or uint8 (N, K / 2) packed low nibble first (minigpt.quant.formats.pack_int4)."""
    from autograder.lab04 import count_triton_launches, own_kernels
    from minigpt.kernels.dequant_gemv import dequant_gemv, dequant_gemv_reference
    ex = "Exercise 9 (the dequantizing GEMV kernel)"
    own_work(fn, (dequant_gemv, dequant_gemv_reference), what=ex)
    for bits, N, K, group, seed in ((8, 20, 64, 32, 0), (4, 20, 64, 32, 1), (4, 33, 128, 64, 2)):
        x, qw, scale = _gemv_case(bits, N, K, group, seed)
        what = f"dequant_gemv(INT{bits}, N={N}, K={K}, group_size={group})"
        with count_triton_launches() as launches:
            y = _call((dequant_gemv, dequant_gemv_reference), ex, what, fn, x.clone(), qw.clone(), scale.clone(), bits,
                      group)
        if not launches[0]:
            raise AssertionError(f"{what}: no Triton kernel was launched; write the GEMV as a @triton.jit kernel")
        own_kernels(launches, ex)
        want = dequant_gemv_reference(x, qw, scale, bits, group)
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != (N,):
            raise AssertionError(f"{what}: expected y of shape ({N},), got "
                                 f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}")
        if not torch.allclose(y.float().cpu(), want, atol=1e-3, rtol=1e-3):
            hint = ""
            if bits == 4:
                swapped = ((qw >> 4) | (qw << 4)).to(torch.uint8)
                if torch.allclose(y.float().cpu(), dequant_gemv_reference(x, swapped, scale, bits, group), atol=1e-3, rtol=1e-3):
                    hint = " The nibbles are swapped: column 2j is the LOW nibble (b & 15), 2j+1 the high one (b >> 4)."
                else:
                    hint = " Sign-extend each nibble ((n ^ 8) - 8) and multiply by the scale of group (column // group_size)."
            err = (y.float().cpu() - want).abs().max().item()
            raise AssertionError(f"{what}: differs from the dequantized product by up to {err:.3g}.{hint}")


def check_int4_cpu_linear(make: Callable, *, K: int = 4096, N: int = 4096, group_size: int = 128,
                          repeats: int = 5, allow_reference: bool = False) -> dict[str, float]:
    """make(weight (N, K), group_size) -> f with f(x (1, K)) ~= x @ W_hat^T, W_hat the asymmetric INT4 weight
    (per group scale and min), computed by PyTorch's CPU INT4 kernel. Correct values first, then the speedup
    over an fp32 matmul must reach the calibrated fraction (INT4_CPU_SPEED_CHECK) of the reference's, timed in the same
    run. `allow_reference=True` (make calibrate) lifts the refusal of the package's Int4WeightOnlyLinear."""
    ex = "Exercise 8 (make_int4_linear)"
    refs = () if allow_reference else (Int4WeightOnlyLinear, WeightOnlyLinear.from_weight, WeightOnlyLinear.forward)
    if refs:
        own_work(make, refs, what=ex)
    w = _randn(192, 256, seed=0) * 0.05
    x = _randn(3, 256, seed=1)
    f = _call(refs, ex, "make_int4_linear(w (192, 256), 64)", make, w.clone(), 64)
    y = _call(refs, ex, "the INT4 linear on x (3, 256)", f, x.clone())
    wg = w.view(192, -1, 64)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    s = (hi - lo) / 15
    w_hat = (torch.round((wg - lo) / s).clamp(0, 15) * s + lo).view(192, 256)
    want, exact = x @ w_hat.T, x @ w.T
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (3, 192):
        raise AssertionError(f"the INT4 linear must return (3, 192) for x (3, 256), got "
                             f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}")
    rel = ((y.float() - want).norm() / want.norm()).item()
    if rel > 0.01:
        hint = (" Your output matches the full-precision weight, not its INT4 version: quantize it."
                if ((y.float() - exact).norm() / exact.norm()).item() < 0.01 else
                " The kernel computes (q - 8) * scale + zero per group, so pass zero = min + 8 * scale, "
                "and scales_and_zeros as (n_groups, N, 2) in bf16.")
        raise AssertionError(f"the INT4 linear differs from x @ W_hat^T by {rel:.3g} (relative).{hint}")
    W = _randn(N, K, seed=2) * 0.02
    xb = _randn(1, K, seed=3)
    with quiet():
        learner = make(W, group_size)
        reference = Int4WeightOnlyLinear(W, group_size)
    return check_speedup(lambda: learner(xb), lambda: F.linear(xb, W), lambda: reference(xb),
                         what=f"INT4 GEMV {N}x{K} against fp32", check=INT4_CPU_SPEED_CHECK, repeats=repeats)


def check_gemv_speed(fn: Callable, *, N: int = 8192, K: int = 8192, group_size: int = 128, bits: tuple[int, ...] = (8, 4),
                     device: str = "cuda", rounds: int = 5) -> dict[str, Any]:
    """GPU tier: fn as in check_dequant_gemv, INT8 and INT4 at 8192 x 8192, batch 1, against a bf16 matmul, timed in
    interleaved rounds with the reference kernel; each width's speedup must reach its calibrated fraction
    (GEMV_SPEED_CHECKS) of the reference's. `device="cpu"` (float32, small N, K) runs the same code in the
    interpreter, for tests."""
    from autograder.thresholds import threshold
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
        if not torch.allclose(got.float(), want, atol=1e-1, rtol=2e-2):
            raise AssertionError(f"INT{b} GEMV at {N}x{K}: differs from the reference kernel by "
                                 f"{(got.float() - want).abs().max().item():.3g}")
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
        if speed < need:
            raise AssertionError(f"INT{b} GEMV: {speed:.2f}x over a {str(dtype)[6:]} matmul, the reference reaches "
                                 f"{ref:.2f}x; at least {need:.2f}x is needed. Dequantize in registers on the way to "
                                 "the multiply: never write a dequantized copy of W to memory.")
    return out


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

def check_q1_e4m3_max(answer: Any) -> None:
    check_answer(answer, 448.0, "Q1: the largest finite FP8 E4M3 (float8_e4m3fn) value", unit="a plain number",
                 mistakes={240.0: "240 is the IEEE-style E4M3 with infinities; e4m3fn ('finite') uses the top exponent "
                                  "for normal values and keeps only one NaN pattern, reaching 1.75 * 2^8.",
                           57344.0: "57344 is the E5M2 maximum.", 480.0: "only S.1111.111 is NaN: the largest mantissa is 110."})


def check_q2_e5m2_smallest_normal(answer: Any) -> None:
    check_answer(answer, 2.0 ** -14, "Q2: the smallest positive normal FP8 E5M2 value", unit="a plain number",
                 mistakes={2.0 ** -6: "2^-6 is E4M3's smallest normal (bias 7); E5M2 has bias 15.",
                           2.0 ** -16: "2^-16 is E5M2's smallest subnormal, not the smallest normal.",
                           2.0 ** -15: "the smallest normal exponent is 1 - bias = -14."})


def check_q3_range_ratio(answer: Any) -> None:
    check_answer(answer, (57344.0 / 2.0 ** -14) / (448.0 / 2.0 ** -6),
                 "Q3: E5M2's dynamic range (max / smallest normal) divided by E4M3's", unit="a ratio",
                 mistakes={57344.0 / 448.0: "that compares only the maxima; the range is max / smallest normal."})


def check_q4_gptq_recovery(answer: Any, ppl: dict[str, float]) -> None:
    """ppl: the lab's measured {"fp32", "INT4 RTN g64", "INT4 GPTQ g64"} perplexities."""
    base, rtn, gptq = ppl["fp32"], ppl["INT4 RTN g64"], ppl["INT4 GPTQ g64"]
    if rtn <= base:
        raise AssertionError("INT4 RTN lost no perplexity in your measurement; recompute the table first")
    want = (rtn - gptq) / (rtn - base)
    check_answer(answer, want, "Q4: the fraction of INT4 RTN's (g64) perplexity loss that GPTQ recovers", unit="a fraction",
                 rel=1e-3, mistakes={1 - want: "that is the fraction GPTQ still loses, not what it recovers.",
                                     (rtn - gptq) / base: "divide by RTN's loss (rtn - fp32), not by the fp32 perplexity."})


def check_q5_gptq_hessian_bytes(answer: Any) -> None:
    c = TARGET_CONFIG
    per_layer = 2 * c.d_model ** 2 + (c.n_heads * c.head_dim) ** 2 + c.d_ff ** 2
    want = c.n_layers * per_layer * 4
    check_answer(answer, want, "Q5: float32 bytes of all GPTQ Hessians of the target model (one per distinct input)",
                 unit="bytes", mistakes={c.n_layers * 7 * c.d_model ** 2 * 4: "w_down reads d_ff features, not d_model.",
                                         c.n_layers * (4 * c.d_model ** 2 + 2 * c.d_ff ** 2) * 4:
                                             "wq, wk, wv share one input (one Hessian), and so do w_gate and w_up.",
                                         want // 4: "float32 is 4 bytes per entry."})
