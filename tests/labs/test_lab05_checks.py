"""Lab 05 checks: the solution notebook's answers pass; the stub, each plausible wrong implementation (edge inputs:
all-zero rows and tokens, bf16, a dead activation channel) and the package's reference handed in (itself, a thin
wrapper, a subclass inheriting update(), its Triton kernel) fail."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from autograder import lab05
from autograder.gpu_tier.slow_implementations import dequantize_every_call   # also measured by `make calibrate`
from minigpt.kernels.dequant_gemv import dequant_gemv, dequant_gemv_reference
from minigpt.quant.awq import AWQ_GROUPS, apply_awq_scales
from minigpt.quant.cpu_kernels import Int4WeightOnlyLinear
from minigpt.quant import fp4
from minigpt.quant.formats import pack_int4, quantize, quantize_fp8, unpack_int4
from minigpt.paths import data_dir
from minigpt.quant.gptq import gptq_quantize
from minigpt.quant.kv_cache import QuantizedLayerKVCache
from minigpt.quant.smoothquant import smoothing_factors
from autograder.checking.reference_guard import ReferenceHandedIn
from tests.labs.notebook_solutions import solution_cells

SOLUTION = solution_cells("05_quantization", "ex1_code", "ex2_code", "ex3_code", "ex4_code", "ex5_code", "ex6_code",
                          "ex7_code", "ex8_code", "ex9_code", "ex10_code", preamble="""
import copy
import math
import torch
import torch.nn.functional as F
from minigpt.quant.awq import AWQ_GROUPS
""")
SolutionCache = SOLUTION["Int8LayerKVCache"]


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubCache:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError()


# --- integer quantization ------------------------------------------------------------------------

def ref_quantize(w, bits, group_size=None):
    """The solution notebook's quantize_symmetric."""
    return SOLUTION["quantize_symmetric"](w, bits, group_size)


def wrapper_quantize(w, bits, group_size=None):
    """A thin wrapper around the package's quantize."""
    qt = quantize(w, bits, group_size=group_size)
    return qt.q, qt.scale


def unclamped_quantize(w, bits, group_size=None):
    """No floor on the scale: an all-zero row divides 0 by 0."""
    qmax = 2 ** (bits - 1) - 1
    g = _groups(w.float(), group_size)
    scale = g.abs().amax(-1) / qmax
    q = g / scale[..., None]
    return torch.round(q).clamp(-qmax, qmax).reshape(w.shape), scale


def low_precision_scale_quantize(w, bits, group_size=None):
    """Scales computed (and returned) in the weight's own dtype: bf16 scales are off by up to 0.4%."""
    qmax = 2 ** (bits - 1) - 1
    g = _groups(w, group_size)
    scale = (g.abs().amax(-1) / qmax).clamp(min=1e-12)
    return torch.round(g.float() / scale.float()[..., None]).clamp(-qmax, qmax).to(torch.int8).reshape(w.shape), scale


def _groups(w, group_size):
    return w.reshape(w.shape[0], -1, group_size or w.shape[1])


def mean_scale_quantize(w, bits, group_size=None):
    """Scale from the mean |w| instead of the absolute maximum: large weights are clipped."""
    ref_quantize(w, bits, group_size)                                     # same input validation
    qmax = 2 ** (bits - 1) - 1
    g = _groups(w, group_size)
    scale = g.abs().mean(-1) / qmax * 2
    return torch.round(g / scale[..., None]).clamp(-qmax, qmax).to(torch.int8).reshape(w.shape), scale


def clamp128_quantize(w, bits, group_size=None):
    """Divides by 128 and clamps to [-128, 127]: +max|w| lands on 128 and is clipped, -128 is used."""
    ref_quantize(w, bits, group_size)
    g = _groups(w, group_size)
    scale = g.abs().amax(-1) / 2 ** (bits - 1)
    q = torch.round(g / scale[..., None]).clamp(-2 ** (bits - 1), 2 ** (bits - 1) - 1)
    return q.to(torch.int8).reshape(w.shape), scale


def wrong_axis_quantize(w, bits, group_size=None):
    """Groups run down the output axis (columns of W^T) instead of along each row's inputs."""
    if group_size is None:
        return ref_quantize(w, bits, None)
    q, s = ref_quantize(w.T.contiguous().reshape(w.shape[0], -1), bits, group_size)
    return q.reshape(w.shape[1], w.shape[0]).T.contiguous(), s


def no_validation_quantize(w, bits, group_size=None):
    """Right values, but accepts NaN (scales become NaN silently)."""
    if torch.isnan(w).any():
        return torch.zeros_like(w, dtype=torch.int8), torch.full((w.shape[0], 1), float("nan"))
    return ref_quantize(w, bits, group_size)


def test_quantize_symmetric_solution_passes():
    lab05.check_quantize_symmetric(ref_quantize)


@pytest.mark.parametrize("fn", [wrapper_quantize, lambda w, bits, g=None: quantize(w, bits, group_size=g)])
def test_quantize_symmetric_refuses_the_reference(fn):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_quantize_symmetric(fn)
    with pytest.raises(ReferenceHandedIn):
        lab05.check_int4_model_perplexity(fn)


@pytest.mark.parametrize("fn, match", [
    (_stub, "not implemented"),
    (mean_scale_quantize, "absolute maximum"),
    (clamp128_quantize, "does not use -128|Divide by"),
    (wrong_axis_quantize, "codes differ|scale"),
    (no_validation_quantize, "NaN"),
    (unclamped_quantize, "all-zero row|integers"),
    (low_precision_scale_quantize, "float32"),
])
def test_quantize_symmetric_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_quantize_symmetric(fn)


def test_int4_model_perplexity_reference_passes():
    result = lab05.check_int4_model_perplexity(ref_quantize)
    assert result["perplexity"] == pytest.approx(result["reference"])


@pytest.mark.parametrize("fn, match", [(_stub, "not implemented"), (mean_scale_quantize, "perplexity")])
def test_int4_model_perplexity_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_int4_model_perplexity(fn)


# --- INT4 packing ----------------------------------------------------------------------------------

def swapped_pack(q):
    nib = (q.to(torch.int16) & 0xF).to(torch.uint8)
    return (nib[..., 0::2] << 4) | nib[..., 1::2]


def swapped_unpack(p):
    hi, lo = (p & 0xF).to(torch.int8), (p >> 4).to(torch.int8)
    return torch.stack([(lo ^ 8) - 8, (hi ^ 8) - 8], -1).flatten(-2)


def unsigned_unpack(p):
    return torch.stack([(p & 0xF).to(torch.int8), (p >> 4).to(torch.int8)], -1).flatten(-2)


SOL_PACK, SOL_UNPACK = SOLUTION["pack_int4"], SOLUTION["unpack_int4"]


def test_int4_packing_solution_passes():
    lab05.check_int4_packing(SOL_PACK, SOL_UNPACK)


@pytest.mark.parametrize("pack, unpack", [(pack_int4, SOL_UNPACK), (SOL_PACK, unpack_int4),
                                          (lambda q: pack_int4(q), SOL_UNPACK), (SOL_PACK, lambda p: unpack_int4(p))])
def test_int4_packing_refuses_the_reference(pack, unpack):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_int4_packing(pack, unpack)


@pytest.mark.parametrize("pack, unpack, match", [
    (_stub, SOL_UNPACK, "not implemented"),
    (SOL_PACK, _stub, "not implemented"),
    (swapped_pack, swapped_unpack, "wrong order"),
    (SOL_PACK, unsigned_unpack, "sign-extend"),
])
def test_int4_packing_rejects(pack, unpack, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_int4_packing(pack, unpack)


# --- FP8 -----------------------------------------------------------------------------------------

def ref_fp8(x, fmt):
    return SOLUTION["quantize_fp8"](x, fmt)


def wrapper_fp8(x, fmt):
    return quantize_fp8(x, fmt, per_channel=False)


def unclamped_fp8(x, fmt):
    """No floor on the scale: an all-zero tensor gives 0 / 0."""
    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    scale = x.float().abs().max() / torch.finfo(dtype).max
    return (x.float() / scale).to(dtype), scale


def unscaled_fp8(x, fmt):
    """A plain cast: E4M3 saturates at 448 (or overflows to NaN) and tiny values vanish."""
    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    return x.to(dtype), torch.tensor(1.0)


def test_fp8_solution_passes():
    lab05.check_quantize_fp8(ref_fp8)


def test_fp8_refuses_the_reference():
    with pytest.raises(ReferenceHandedIn):
        lab05.check_quantize_fp8(wrapper_fp8)


@pytest.mark.parametrize("fn, match", [(_stub, "not implemented"), (unscaled_fp8, "scale is 1|all-zero"),
                                       (unclamped_fp8, "all-zero")])
def test_fp8_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_quantize_fp8(fn)


# --- GPTQ ----------------------------------------------------------------------------------------

def ref_gptq(w, H, bits, group_size, block_size):
    return SOLUTION["gptq"](w, H, bits, group_size, block_size)


def wrapper_gptq(w, H, bits, group_size, block_size):
    qt = gptq_quantize(w, H, bits, group_size, block_size=block_size)
    return qt.q, qt.scale


def rtn_gptq(w, H, bits, group_size, block_size):
    """No error propagation: GPTQ degenerates to round-to-nearest."""
    return ref_quantize(w, bits, group_size)


def no_lazy_update_gptq(w, H, bits, group_size, block_size):
    """Propagates errors inside each block but forgets the update of later blocks."""
    W = w.double().clone()
    Hd = H.double() + 0.01 * torch.diag(H).double().mean() * torch.eye(H.shape[0], dtype=torch.float64)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(Hd)), upper=True)
    Q = torch.zeros_like(W)
    scales = torch.zeros(W.shape[0], W.shape[1] // group_size, dtype=torch.float64)
    for b0 in range(0, W.shape[1], block_size):
        b1 = min(b0 + block_size, W.shape[1])
        for i in range(b0, b1):
            if i % group_size == 0:
                scales[:, i // group_size] = W[:, i:i + group_size].abs().amax(1) / 7
            s = scales[:, i // group_size]
            q = torch.round(W[:, i] / s).clamp(-7, 7)
            Q[:, i] = q
            err = (W[:, i] - q * s) / U[i, i]
            W[:, i:b1] -= err[:, None] * U[i, i:b1][None]
    return Q.to(torch.int8), scales.float()


def test_gptq_solution_passes():
    lab05.check_gptq(ref_gptq)


def test_gptq_refuses_the_reference():
    with pytest.raises(ReferenceHandedIn):
        lab05.check_gptq(wrapper_gptq)


@pytest.mark.parametrize("fn, match", [
    (_stub, "not implemented"),
    (rtn_gptq, "plain round-to-nearest"),
    (no_lazy_update_gptq, "output error|block_size"),
])
def test_gptq_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_gptq(fn)


# --- AWQ folding and SmoothQuant factors --------------------------------------------------------------

@torch.no_grad()
def unfolded_awq(model, scales):
    """Scales the consumers' columns but never divides the producers: the model computes something else."""
    new = copy.deepcopy(model)
    for key, s in scales.items():
        i, fold = int(key.split(".")[1]), key.split(".", 2)[2]
        for p in next(p for p, f in AWQ_GROUPS if f == fold):
            new.get_submodule(f"layers.{i}.{p}").weight.mul_(s[None, :])
    return new


@torch.no_grad()
def in_place_awq(model, scales):
    """Right folding, but on the caller's model."""
    new = SOLUTION["fold_awq_scales"](model, scales)
    model.load_state_dict(new.state_dict())
    return model


def test_awq_fold_solution_passes():
    lab05.check_awq_fold(SOLUTION["fold_awq_scales"])


@pytest.mark.parametrize("fn", [apply_awq_scales, lambda model, scales: apply_awq_scales(model, scales)])
def test_awq_fold_refuses_the_reference(fn):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_awq_fold(fn)


@pytest.mark.parametrize("fn, match", [
    (_stub, "not implemented"),
    (unfolded_awq, "differ from the original"),
    (in_place_awq, "modified the model"),
])
def test_awq_fold_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_awq_fold(fn)


def swapped_alpha(act, weights, alpha):
    return SOLUTION["smoothing_factors"](act, weights, 1 - alpha)


def first_weight_only(act, weights, alpha):
    return SOLUTION["smoothing_factors"](act, weights[:1], alpha)


def unclamped_smoothing(act, weights, alpha):
    """No floor on the maxima: a dead channel gets s = 0 (and x / s = inf)."""
    w_absmax = torch.cat([w.float().abs() for w in weights]).amax(0)
    return act.float().pow(alpha) / w_absmax.pow(1 - alpha)


def smoothing_abs_in_place(act, weights, alpha):
    """The right factors, but abs_ after .float() makes the caller's float32 weights their absolute values."""
    w_absmax = torch.cat([w.float().abs_() for w in weights]).amax(0)
    return (act.float().clamp(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1 - alpha)).clamp(min=1e-5)


def smoothing_clamps_act_in_place(act, weights, alpha):
    """The right factors, but clamp_ writes the floor into the caller's activation maxima (a dead channel's 0)."""
    w_absmax = torch.cat([w.float().abs() for w in weights]).amax(0)
    return (act.float().clamp_(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1 - alpha)).clamp(min=1e-5)


def test_smoothing_solution_passes():
    lab05.check_smoothing_factors(SOLUTION["smoothing_factors"])


@pytest.mark.parametrize("fn", [smoothing_factors, lambda a, w, alpha: smoothing_factors(a, w, alpha)])
def test_smoothing_refuses_the_reference(fn):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_smoothing_factors(fn)


@pytest.mark.parametrize("fn, match", [
    (_stub, "not implemented"),
    (swapped_alpha, "exponent"),
    (first_weight_only, "ALL the weights"),
    (unclamped_smoothing, "dead activation channel"),
    (smoothing_abs_in_place, "changed its inputs"),
    (smoothing_clamps_act_in_place, "changed its inputs"),
])
def test_smoothing_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_smoothing_factors(fn)


# --- KV cache ------------------------------------------------------------------------------------

class SharedScaleCache(SolutionCache):
    """One scale per token shared by all KV heads: the small heads lose their precision."""

    def update(self, k, v):
        start, end = self.length, self.length + k.shape[1]
        for x, codes, scales in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            s = (x.abs().amax(dim=(-2, -1)) / 127).clamp(min=1e-12)[..., None].expand(x.shape[:3])
            codes[:, start:end] = torch.round(x / s[..., None]).clamp(-127, 127).to(torch.int8)
            scales[:, start:end] = s
        self.length = end
        return (self.k[:, :end].float() * self.k_scale[:, :end, :, None],
                self.v[:, :end].float() * self.v_scale[:, :end, :, None])


class Float32Cache(SolutionCache):
    """Keeps float32 buffers: no memory saved."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.k, self.v = self.k.float(), self.v.float()


class UncheckedCache(SolutionCache):
    """No bound check: past max_seq_len the write broadcasts into an empty slice (nothing stored, no error) and length grows."""

    def update(self, k, v):
        start, end = self.length, self.length + k.shape[1]
        for x, codes, scales in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            s = (x.float().abs().amax(-1) / 127).clamp(min=1e-12)
            codes[:, start:end] = torch.round(x.float() / s[..., None]).clamp(-127, 127).to(torch.int8)
            scales[:, start:end] = s
        self.length = end
        return (self.k[:, :end].float() * self.k_scale[:, :end, :, None],
                self.v[:, :end].float() * self.v_scale[:, :end, :, None])


class CountsBeforeCheckingCache(SolutionCache):
    """Raises the right error, but only after moving `length`: the cache is left claiming a position it lacks."""

    def update(self, k, v):
        if self.length + k.shape[1] > self.k.shape[1]:
            self.length += k.shape[1]
        return super().update(k, v)


class InheritsUpdate(QuantizedLayerKVCache):
    """The reference's cache, renamed."""


class CallsSuperUpdate(QuantizedLayerKVCache):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def update(self, k, v):
        return super().update(k, v)


def test_kv_cache_solution_passes():
    lab05.check_quantized_kv_cache(SolutionCache)


@pytest.mark.parametrize("cls", [QuantizedLayerKVCache, InheritsUpdate, CallsSuperUpdate])
def test_kv_cache_refuses_the_reference(cls):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_quantized_kv_cache(cls)


@pytest.mark.parametrize("cls, match", [
    (StubCache, "not implemented"),
    (SharedScaleCache, "shared across heads"),
    (Float32Cache, "int8"),
    (UncheckedCache, "must raise ValueError"),
    (CountsBeforeCheckingCache, "changed the cache"),
])
def test_kv_cache_rejects(cls, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_quantized_kv_cache(cls)


# --- Triton GEMV and the CPU INT4 kernel ------------------------------------------------------------

SOL_GEMV = SOLUTION["triton_dequant_gemv"]


def swapped_nibble_gemv(x, qw, scale, bits, group_size):
    if bits == 4:
        qw = ((qw >> 4) | (qw << 4)).to(torch.uint8)
    return SOL_GEMV(x, qw, scale, bits, group_size)


def first_group_scale_gemv(x, qw, scale, bits, group_size):
    """Applies each row's first group scale to all its columns (per-channel instead of per-group)."""
    return SOL_GEMV(x, qw, scale[:, :1].expand_as(scale).contiguous(), bits, group_size)


def pytorch_gemv(x, qw, scale, bits, group_size):
    """Right numbers, no Triton kernel."""
    q = SOL_UNPACK(qw) if bits == 4 else qw
    return (q.float().view(q.shape[0], -1, group_size) * scale[..., None]).view(q.shape[0], -1) @ x


def output_on_the_default_device_gemv(x, qweight, scale, bits, group_size, block_n=16, block_k=128):
    """Right on a one-device machine: y is allocated without device= (the CPU, beside x on a GPU)."""
    N, K = qweight.shape[0], x.shape[0]
    y = torch.empty(N, dtype=x.dtype)
    SOLUTION["_gemv_kernel"][((N + block_n - 1) // block_n,)](
        x.contiguous(), qweight.contiguous(), scale.float().contiguous(), y, N, K, K // group_size, GROUP=group_size,
        BITS=bits, BLOCK_N=block_n, BLOCK_K=block_k)
    return y


def test_dequant_gemv_solution_passes():
    lab05.check_dequant_gemv(SOL_GEMV)


@pytest.mark.parametrize("fn", [dequant_gemv, lambda *a: dequant_gemv(*a), dequant_gemv_reference])
def test_dequant_gemv_refuses_the_reference(fn):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_dequant_gemv(fn)


@pytest.mark.parametrize("fn, match", [
    (_stub, "not implemented"),
    (swapped_nibble_gemv, "swapped"),
    (first_group_scale_gemv, "differs"),
    (pytorch_gemv, "no Triton kernel"),
    (output_on_the_default_device_gemv, "default device moved off"),
])
def test_dequant_gemv_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_dequant_gemv(fn)


def full_precision_linear(w, group_size):
    return lambda x: F.linear(x, w)


def slow_int4_linear(w, group_size):
    """`make calibrate`'s slow implementation (its module is the course's, so the check would refuse it as such)."""
    return dequantize_every_call(w, group_size)


def test_int4_cpu_linear_solution_passes():
    result = lab05.check_int4_cpu_linear(SOLUTION["make_int4_linear"], repeats=3)   # the calibrated shape, 4096 x 4096
    assert result["speedup"] >= result["threshold"]


@pytest.mark.parametrize("fn", [Int4WeightOnlyLinear, lambda w, g: Int4WeightOnlyLinear(w, g)])
def test_int4_cpu_linear_refuses_the_reference(fn):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_int4_cpu_linear(fn, repeats=1)


def int4_ranges_in_bf16(w, group_size):
    """The solution without weight.float(): a bf16 checkpoint's ranges, scales and codes round in bf16."""
    N, K = w.shape
    wg = w.reshape(N, K // group_size, group_size)
    lo, hi = wg.amin(-1), wg.amax(-1)
    s = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((wg - lo[..., None]) / s[..., None]).clamp(0, 15).to(torch.int32).reshape(N, K)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.stack([s.T, (lo + 8 * s).T], -1).to(torch.bfloat16).contiguous()
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group_size, scales_and_zeros)


def fast_only_when_timed(w, group_size):
    """Right on the check's small case; on the timed shape (4096 columns) it skips the work and returns zeros."""
    right = SOLUTION["make_int4_linear"](w, group_size)
    return right if w.shape[1] != 4096 else (lambda x: torch.zeros(x.shape[0], w.shape[0]))


def answer_kept_from_the_first_call(w, group_size):
    """Right on its first input, then hands the same output back, whatever the input."""
    right, kept = SOLUTION["make_int4_linear"](w, group_size), []
    return lambda x: kept[0] if kept else kept.append(right(x)) or kept[0]


@pytest.mark.parametrize("fn, match", [
    (_stub, "not implemented"),
    (full_precision_linear, "full-precision weight"),
    (int4_ranges_in_bf16, "bfloat16 weight .*in float32"),
    (slow_int4_linear, "speedup"),
    (fast_only_when_timed, "timed input #0"),
    (answer_kept_from_the_first_call, "timed input #1"),
])
def test_int4_cpu_linear_rejects(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_int4_cpu_linear(fn, repeats=3)


# --- FP4: MXFP4 and NVFP4 -------------------------------------------------------------------------

ref_mx, ref_nv, ref_round = SOLUTION["quantize_mxfp4"], SOLUTION["quantize_nvfp4"], SOLUTION["round_to_e2m1"]


def _mx_with(exponent, rounding=ref_round, block=32):
    """An MXFP4 quantizer whose shared exponent (from max|block|) and element rounding are given."""
    def quantize(w):
        blocks = w.float().reshape(w.shape[0], -1, block)
        amax = blocks.abs().amax(-1)
        scales = torch.where(amax > 0, torch.exp2(exponent(amax.clamp(min=1e-38))), torch.tensor(2.0 ** -127))
        return rounding(blocks / scales[..., None]).reshape(w.shape), scales
    return quantize


def half_away_round(x):
    """Round half away from zero (floor(|x| / step + 0.5)): ties go up, not to the even code."""
    a = x.float().abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.copysign((torch.floor(a / step + 0.5) * step).clamp(max=6.0), x.float())


def no_saturation_round(x):
    """Rounds on the grid but lets values above 6 through (7 -> 8)."""
    a = x.float().abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.copysign(torch.round(a / step) * step, x.float())


def unsigned_round(x):
    """Rounds |x|: the sign is lost."""
    return ref_round(x.abs())


mx_amax_over_6 = lambda w: ((lambda s: (ref_round(w.float().reshape(w.shape[0], -1, 32) / s[..., None].clamp(min=1e-30))
                                        .reshape(w.shape), s))(w.float().reshape(w.shape[0], -1, 32).abs().amax(-1) / 6))
mx_ceil_amax_over_6 = _mx_with(lambda amax: torch.ceil(torch.log2(amax / 6)))
mx_no_emax = _mx_with(lambda amax: torch.floor(torch.log2(amax)))
mx_round_log2 = _mx_with(lambda amax: torch.round(torch.log2(amax)) - 2)
mx_half_away = _mx_with(lambda amax: torch.floor(torch.log2(amax)) - 2, half_away_round)
mx_no_saturation = _mx_with(lambda amax: torch.floor(torch.log2(amax)) - 2, no_saturation_round)
mx_unsigned = _mx_with(lambda amax: torch.floor(torch.log2(amax)) - 2, unsigned_round)
mx_block16 = _mx_with(lambda amax: torch.floor(torch.log2(amax)) - 2, block=16)


def mx_nan_zero_block(w):
    """No guard for an all-zero block: log2(0) = -inf, 0 / 0 = NaN."""
    blocks = w.float().reshape(w.shape[0], -1, 32)
    scales = torch.exp2(torch.floor(torch.log2(blocks.abs().amax(-1))) - 2)
    return ref_round(blocks / scales[..., None]).reshape(w.shape), scales


def _nv_with(block_scale, tensor_scale=lambda amax: amax / (6 * 448), block=16):
    def quantize(w):
        blocks = w.float().reshape(w.shape[0], -1, block)
        t = tensor_scale(blocks.abs().amax()).clamp(min=1e-30).reshape(1)
        s = block_scale(blocks.abs().amax(-1), t).clamp(max=448).to(torch.float8_e4m3fn)
        d = s.float()[..., None] * t
        return torch.where(d > 0, ref_round(blocks / torch.where(d > 0, d, 1.0)), 0.0).reshape(w.shape), s, t
    return quantize


nv_no_tensor_scale = _nv_with(lambda amax, t: amax / 6, tensor_scale=lambda amax: torch.ones(()))
nv_over_4 = _nv_with(lambda amax, t: amax / (4 * t))
nv_power_of_two = _nv_with(lambda amax, t: torch.exp2(torch.ceil(torch.log2((amax / (6 * t)).clamp(min=1e-30)))))
nv_block32 = _nv_with(lambda amax, t: amax / (6 * t), block=32)


def nv_nan_zero_block(w):
    """Divides by the block scale without a guard: an all-zero block gives 0 / 0."""
    blocks = w.float().reshape(w.shape[0], -1, 16)
    t = (blocks.abs().amax() / (6 * 448)).reshape(1)
    s = (blocks.abs().amax(-1) / (6 * t)).to(torch.float8_e4m3fn)
    return ref_round(blocks / (s.float()[..., None] * t)).reshape(w.shape), s, t


def test_fp4_solution_passes():
    lab05.check_fp4_quantize(ref_mx, ref_nv)


@pytest.mark.parametrize("mx, nv", [(fp4.quantize_mxfp4, ref_nv), (ref_mx, fp4.quantize_nvfp4),
                                    (lambda w: fp4.quantize_mxfp4(w), ref_nv),
                                    (_mx_with(lambda a: torch.floor(torch.log2(a)) - 2, fp4.round_to_e2m1), ref_nv)])
def test_fp4_refuses_the_reference(mx, nv):
    with pytest.raises(ReferenceHandedIn):
        lab05.check_fp4_quantize(mx, nv)


@pytest.mark.parametrize("mx, nv, match", [
    (_stub, ref_nv, "not implemented"), (ref_mx, _stub, "not implemented"),
    (mx_amax_over_6, ref_nv, "not a power of two. It is max\\|block\\| / 6"),
    (mx_ceil_amax_over_6, ref_nv, "rounded max\\|block\\| / 6 up"),
    (mx_no_emax, ref_nv, "subtract E2M1's emax"),
    (mx_round_log2, ref_nv, "down \\(floor\\)"),
    (mx_half_away, ref_nv, "tie"),
    (mx_no_saturation, ref_nv, "not an E2M1 value"),
    (mx_unsigned, ref_nv, "sign is lost"),
    (mx_block16, ref_nv, "block of 32"),
    (mx_nan_zero_block, ref_nv, "all-zero block"),
    (ref_mx, nv_no_tensor_scale, "tensor_scale"),
    (ref_mx, nv_over_4, "not 4"),
    (ref_mx, nv_power_of_two, "power of two"),
    (ref_mx, nv_block32, "block of 16"),
    (ref_mx, nv_nan_zero_block, "all-zero block"),
])
def test_fp4_rejects(mx, nv, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_fp4_quantize(mx, nv)


# --- interview questions -------------------------------------------------------------------------

def test_interview_answers():
    lab05.check_q1_e3m2_max(28.0)
    lab05.check_q2_e3m2_smallest_subnormal(2.0 ** -4)
    lab05.check_q3_range_ratio(32768.0)
    lab05.check_q5_gptq_hessian_bytes(6 * (3 * 384 ** 2 + 1024 ** 2) * 4)
    lab05.check_q6_production_choice(5)
    for check, wrong in ((lab05.check_q1_e3m2_max, 14.0), (lab05.check_q1_e3m2_max, 24.0), (lab05.check_q1_e3m2_max, 224.0),
                         (lab05.check_q2_e3m2_smallest_subnormal, 2.0 ** -2),
                         (lab05.check_q2_e3m2_smallest_subnormal, 2.0 ** -5),
                         (lab05.check_q3_range_ratio, 57344 / 448), (lab05.check_q5_gptq_hessian_bytes, 7 * 6 * 384 ** 2 * 4)):
        with pytest.raises(AssertionError, match="Likely mistake"):
            check(wrong)


def _shipped_sweep():
    table = json.loads((data_dir() / "lab05_quality_table.json").read_text())
    sweep = {(r["weight_bits"], r["group_size"], r["method"]): r for r in table["sweep"]}
    return next(r for r in table["rows"] if r["name"] == "fp32"), sweep


def test_q4_reads_the_shipped_table_and_diagnoses_the_kl_share():
    base, sweep = _shipped_sweep()
    rtn, awq = sweep[(3, None, "RTN")], sweep[(3, None, "AWQ")]
    lab05.check_q4_low_bit_recovery((rtn["perplexity"] - awq["perplexity"]) / (rtn["perplexity"] - base["perplexity"]))
    with pytest.raises(AssertionError, match="share of the KL"):
        lab05.check_q4_low_bit_recovery(1 - awq["kl"] / rtn["kl"])


@pytest.mark.parametrize("wrong,match", [(1, "more than the whole GPU"), (2, "over the"), (3, "does not shrink"),
                                         (4, "same bytes"), (6, "no reason")])
def test_q6_diagnoses_each_wrong_format(wrong, match):
    with pytest.raises(AssertionError, match=match):
        lab05.check_q6_production_choice(wrong)
