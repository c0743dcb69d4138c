"""minigpt.quant and minigpt.kernels.dequant_gemv (lab 05): formats, weight-only linears, GPTQ, AWQ,
SmoothQuant, the quantized KV cache and the CPU kernels, on small seeded tensors and a tiny model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.cache.contiguous import KVCache
from minigpt.model import GPT
from minigpt.quant.awq import apply_awq_scales, awq_scales, search_clip, search_scale
from minigpt.quant.calibration import calibration_tokens, capture_inputs
from minigpt.quant.cpu_kernels import Int4WeightOnlyLinear, Int8DynamicLinear, Int8WeightOnlyLinear
from minigpt.quant.formats import (dequantize, fake_quantize, fp8_format, int_range, pack_int4, quantize,
                                   quantize_fp8, unpack_int4)
from minigpt.quant.gptq import gptq_model, gptq_quantize, hessian
from minigpt.quant.kv_cache import QuantizedKVCache, QuantizedLayerKVCache
from minigpt.quant.linear import (WeightOnlyLinear, projection_names, quantize_fp8_weights, quantize_linears, quantize_weight_only,
                                  weight_bytes)
from minigpt.quant.quality import fidelity, perplexity
from minigpt.quant.smoothquant import W8A8Linear, quantize_per_token, smooth_model, smoothquant_model


def _w(out=16, inp=64, seed=0):
    return torch.randn(out, inp, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group_size", [None, 16])
def test_round_trip_error_is_at_most_half_a_step(bits, symmetric, group_size):
    w = _w()
    qt = quantize(w, bits, symmetric=symmetric, group_size=group_size)
    qmin, qmax = int_range(bits, symmetric)
    assert int(qt.q.min()) >= qmin and int(qt.q.max()) <= qmax
    step = qt.scale.repeat_interleave(group_size or w.shape[1], 1)
    assert ((dequantize(qt) - w).abs() <= step / 2 + 1e-6).all()


def test_symmetric_int8_maps_absmax_to_127_and_never_uses_minus_128():
    w = _w()
    qt = quantize(w, 8)
    assert int(qt.q.abs().max()) == 127 and int(qt.q.min()) >= -127
    assert torch.allclose(qt.scale[:, 0], w.abs().amax(1) / 127)


def test_per_tensor_has_one_scale():
    qt = quantize(_w(), 8, per_tensor=True)
    assert qt.scale.numel() == 1 and torch.allclose(dequantize(qt), _w(), atol=qt.scale.item())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-8, 7), min_size=2, max_size=40).filter(lambda v: len(v) % 2 == 0))
def test_int4_pack_round_trip(values):
    q = torch.tensor(values, dtype=torch.int8)[None]
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == len(values) // 2
    assert torch.equal(unpack_int4(packed), q)
    assert int(packed[0, 0]) == (values[0] & 0xF) | ((values[1] & 0xF) << 4)      # low nibble first


def test_fp8_formats_computed():
    e4, e5 = fp8_format("e4m3"), fp8_format("e5m2")
    assert (e4["max"], e4["smallest_normal"], e4["mantissa_bits"]) == (448.0, 2.0 ** -6, 3)
    assert (e5["max"], e5["smallest_normal"], e5["mantissa_bits"]) == (57344.0, 2.0 ** -14, 2)
    x = _w() * 1000
    codes, scale = quantize_fp8(x, "e4m3")
    assert codes.dtype == torch.float8_e4m3fn
    assert ((codes.float() * scale - x).abs() <= x.abs() * 2 ** -4 + scale * 2 ** -9).all()


@pytest.mark.parametrize("bad, match", [
    (dict(bits=5), "unsupported bits"),
    (dict(bits=4, group_size=24), "does not divide"),
])
def test_bad_input_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        quantize(_w(), **bad)


def test_nan_is_refused():
    w = _w()
    w[2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        quantize(w, 8)
    with pytest.raises(ValueError, match="NaN"):
        quantize_fp8(w)


def test_empty_calibration_is_refused(tiny_model):
    with pytest.raises(ValueError, match="empty"):
        calibration_tokens(0, 16)
    with pytest.raises(ValueError, match="empty"):
        gptq_model(tiny_model, torch.zeros(0, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        hessian(torch.zeros(0, 4))


def test_weight_only_model_is_a_new_model_with_quantized_projections(tiny_model):
    q = quantize_weight_only(tiny_model, 4, 16)
    names = projection_names(tiny_model)
    assert len(names) == 7 * tiny_model.config.n_layers
    assert all(isinstance(q.get_submodule(n), WeightOnlyLinear) for n in names)
    assert isinstance(tiny_model.get_submodule(names[0]), torch.nn.Linear)          # original untouched
    assert torch.equal(q.tok_emb.weight, tiny_model.tok_emb.weight) and q.lm_head.weight is q.tok_emb.weight
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b8, b4 = tiny_model(tokens), quantize_weight_only(tiny_model, 8)(tokens), q(tokens)
    assert (b8 - a).abs().max() < (b4 - a).abs().max() < 0.5
    assert weight_bytes(q) < weight_bytes(quantize_weight_only(tiny_model, 8)) < weight_bytes(tiny_model)


def test_weight_only_linear_stores_packed_nibbles():
    w = _w(8, 32)
    lin = WeightOnlyLinear.from_weight(w, 4, 16)
    assert lin.qweight.shape == (8, 16) and lin.qweight.dtype == torch.uint8
    assert lin.nbytes == 8 * 16 + 8 * 2 * 4
    assert torch.allclose(lin.dequantized_weight(), fake_quantize(w, 4, group_size=16))


def test_fp8_weights_close(tiny_model):
    tokens = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(quantize_fp8_weights(tiny_model)(tokens), tiny_model(tokens), atol=0.05)


def _calib_inputs(seed=0, n=256, d=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    x[:, :4] *= 20                                       # a few outlier channels, as in real activations
    return x


def test_gptq_beats_round_to_nearest_on_the_output_error():
    w, x = _w(32, 64), _calib_inputs()
    qt = gptq_quantize(w, hessian(x), 4, 16)
    rtn = fake_quantize(w, 4, group_size=16)
    err_gptq = (x @ (dequantize(qt) - w).T).pow(2).mean()
    err_rtn = (x @ (rtn - w).T).pow(2).mean()
    assert err_gptq < 0.8 * err_rtn


def test_gptq_with_identity_hessian_is_round_to_nearest():
    w = _w(8, 32)
    qt = gptq_quantize(w, torch.eye(32), 4, 16, damp=0.0)
    assert torch.equal(qt.q, quantize(w, 4, group_size=16).q)


def test_awq_search_never_worse_than_rtn_and_folding_keeps_the_function(tiny_model):
    w, x = _w(32, 64), _calib_inputs()
    s, alpha = search_scale(x, [w], 4, 16)
    q = fake_quantize(w * s, 4, group_size=16) / s
    rtn = fake_quantize(w, 4, group_size=16)
    assert (x @ (q - w).T).pow(2).mean() <= (x @ (rtn - w).T).pow(2).mean() + 1e-9
    calib = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    scales = awq_scales(tiny_model, calib, 4, 16)
    folded = apply_awq_scales(tiny_model, scales)
    with torch.no_grad():
        assert torch.allclose(folded(calib), tiny_model(calib), atol=1e-4)
        assert not torch.equal(folded.layers[0].attn.wq.weight, tiny_model.layers[0].attn.wq.weight)


def test_smoothquant_folding_and_w8a8(tiny_model):
    calib = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    smoothed = smooth_model(tiny_model, calib, 0.5)
    with torch.no_grad():
        assert torch.allclose(smoothed(calib), tiny_model(calib), atol=1e-4)
        q = smoothquant_model(tiny_model, calib)
        assert isinstance(q.layers[0].mlp.w_down, W8A8Linear)
        assert (q(calib) - tiny_model(calib)).abs().max() < 0.5
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    codes, scale = quantize_per_token(x)
    assert scale.shape == (3, 5, 1) and int(codes.abs().max()) == 127


def test_capture_inputs_shares_one_copy_for_wq_wk_wv(tiny_model):
    calib = torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(0))
    names = ["layers.0.attn.wq", "layers.0.attn.wk", "layers.0.mlp.w_down"]
    got = capture_inputs(tiny_model, calib, names, batch_size=2)
    assert got[names[0]] is got[names[1]] and got[names[0]].shape == (24, 32) and got[names[2]].shape == (24, 64)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantized_kv_cache_matches_the_float_cache(tiny_model, fmt):
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    ref_cache = KVCache.for_model(tiny_model, batch_size=2)
    q_cache = QuantizedKVCache.for_model(tiny_model, batch_size=2, fmt=fmt)
    with torch.no_grad():
        for chunk in (tokens[:, :8], tokens[:, 8:9], tokens[:, 9:]):
            a = tiny_model(chunk, positions=ref_cache.next_positions(chunk.shape[1]), kv_caches=ref_cache)
            b = tiny_model(chunk, positions=q_cache.next_positions(chunk.shape[1]), kv_caches=q_cache)
            assert torch.allclose(a, b, atol=0.1 if fmt == "fp8_e5m2" else 0.05)
    assert q_cache.length == 12
    cfg = tiny_model.config
    per_layer = 2 * 2 * cfg.max_seq_len * cfg.n_kv_heads * (cfg.head_dim * 1 + 4)
    assert q_cache.nbytes == cfg.n_layers * per_layer


def test_quantized_kv_cache_scales_are_per_head():
    cache = QuantizedLayerKVCache(1, 4, 2, 8)
    k = torch.randn(1, 2, 2, 8, generator=torch.Generator().manual_seed(4))
    k[:, :, 0] *= 1000                                   # head 0 is huge, head 1 small
    k_all, _ = cache.update(k, k)
    assert torch.allclose(k_all[:, :, 1], k[:, :, 1], rtol=0, atol=k[:, :, 1].abs().max().item() / 254 + 1e-6)
    with pytest.raises(ValueError, match="overflow"):
        cache.update(torch.zeros(1, 3, 2, 8), torch.zeros(1, 3, 2, 8))
    assert cache.length == 2
    with pytest.raises(ValueError, match="unknown KV-cache format"):
        QuantizedLayerKVCache(1, 4, 2, 8, fmt="int4")


def test_cpu_kernels_match_dequantized_products():
    """Own generator for x: drawn from the global RNG, its data (and the INT8 error) depended on the tests before it."""
    w, x = _w(64, 256) * 0.05, torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    ref = x @ w.T
    # Int8DynamicLinear also quantizes x per tensor at run time: over seeds 1..7 of x its relative error spans
    # 0.019..0.048 (0.025 for this seed), so 0.06 bounds the method, not one lucky draw.
    for f, tol in ((Int8DynamicLinear(w), 0.06), (Int8WeightOnlyLinear(w), 0.02), (Int4WeightOnlyLinear(w, 64), 0.15)):
        y = f(x).float()
        assert ((y - ref).norm() / ref.norm()) < tol, type(f).__name__


@pytest.mark.parametrize("bits", [4, 8])
def test_triton_dequant_gemv_matches_reference(bits):
    from minigpt.kernels.dequant_gemv import dequant_gemv, dequant_gemv_reference
    w, x = _w(24, 128), torch.randn(128, generator=torch.Generator().manual_seed(3))
    qt = quantize(w, bits, group_size=32)
    qw = pack_int4(qt.q) if bits == 4 else qt.q
    y = dequant_gemv(x, qw, qt.scale, bits, 32, block_n=16, block_k=64)
    assert torch.allclose(y, dequantize(qt) @ x, atol=1e-4)
    assert torch.allclose(dequant_gemv_reference(x, qw, qt.scale, bits, 32), y, atol=1e-4)
    with pytest.raises(ValueError, match="does not divide"):
        dequant_gemv(x, qw, qt.scale, bits, 48)


def test_explorer_readout_counts_bits_and_memory():
    from minigpt.costmodel.calculators import PRESETS, count_parameters, kv_cache_bytes
    from minigpt.costmodel.hardware import ACCELERATORS
    from minigpt.teaching.quant_explorer import QuantizationExplorer, explorer_readout
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    w = _w(16, 256)
    r = explorer_readout(w, "RTN symmetric", 4, 128, shape, gpu, 8192)
    assert r.bits_per_weight == 4 + 32 / 128 and r.levels_used <= 15 and r.fits
    assert r.model_weight_bytes == int(count_parameters(shape) * 4.25 / 8)
    assert r.kv_bytes == kv_cache_bytes(shape, 8192, 1, 2)
    r8 = explorer_readout(w, "RTN asymmetric", 8, None, shape, gpu, 8192, kv_format="int8 / fp8 + scales")
    assert r8.bits_per_weight == 8 + 64 / 256 and r8.rel_error < r.rel_error
    assert r8.kv_bytes == kv_cache_bytes(shape, 8192, 1, 1) + 2 * shape.n_layers * shape.n_kv_heads * 4 * 8192
    assert explorer_readout(w, "FP8 E4M3", 8, None, shape, gpu, 8192).rel_error < 0.07
    with pytest.raises(ValueError, match="does not divide"):
        explorer_readout(w, "RTN symmetric", 4, 96, shape, gpu, 8192)
    torch.manual_seed(0)
    from minigpt_fixtures import TINY
    view = QuantizationExplorer(GPT(TINY), group_size=32)
    assert "bits/weight" in view.readout.value and view.image.value
    view.group.value = 128                      # does not divide d_model=32: an error line, controls kept
    assert "does not divide" in view.error.value


def test_quantize_linears_keeps_weights_of_plain_linears(tiny_model):
    """GPT.__init__ re-initializes nn.Linear weights; quantize_linears must restore what `make` built."""
    def make(name, w):
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_(w)
        return lin
    copy_model = quantize_linears(tiny_model, make)
    tokens = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(copy_model(tokens), tiny_model(tokens))


def _correlated_inputs(seed=0, n=512, d=64, rank=8):
    """Inputs whose channels are strongly correlated (a few latent factors plus a little noise): X = Z A + 0.1 E."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, rank, generator=g) @ torch.randn(rank, d, generator=g) + 0.1 * torch.randn(n, d, generator=g)


def _output_error(x, w, w_hat):
    return (x @ (w_hat - w).T).pow(2).mean().item()          # ||X W^T - X Q^T||^2 / (N out)


@pytest.mark.parametrize("group_size", [None, 16])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_reduces_the_output_error_on_correlated_inputs(group_size, act_order):
    w, x = _w(32, 64, seed=1), _correlated_inputs()
    qt = gptq_quantize(w, hessian(x), 3, group_size, act_order=act_order)
    err_gptq = _output_error(x, w, dequantize(qt))
    err_rtn = _output_error(x, w, fake_quantize(w, 3, group_size=group_size))
    assert err_gptq < 0.5 * err_rtn, f"GPTQ output error {err_gptq:.4g} vs round-to-nearest {err_rtn:.4g}"


def test_gptq_lies_between_the_exhaustive_optimum_and_round_to_nearest():
    """A 6-input layer at 3 bits, one scale per row: every code vector (7^6) is tried for each row."""
    w, x = _w(4, 6, seed=2), _correlated_inputs(n=256, d=6, rank=2)
    H = hessian(x)
    qt = gptq_quantize(w, H, 3, None, damp=0.0)
    codes = torch.cartesian_prod(*[torch.arange(-3, 4, dtype=torch.float64)] * 6)          # (117649, 6)
    for row in range(4):
        s, wr = qt.scale[row, 0].double(), w[row].double()
        d = codes * s - wr
        optimum = torch.einsum("ci,ij,cj->c", d, H, d).min().item()
        quad = lambda v: ((v.double() - wr) @ H @ (v.double() - wr)).item()
        err_gptq, err_rtn = quad(dequantize(qt)[row]), quad(fake_quantize(w, 3)[row])
        assert optimum - 1e-9 <= err_gptq <= err_rtn + 1e-9
    total = lambda w_hat: torch.einsum("oi,ij,oj->", (w_hat - w).double(), H, (w_hat - w).double()).item()
    assert total(dequantize(qt)) < 0.5 * total(fake_quantize(w, 3))


def test_gptq_act_order_with_independent_inputs_is_round_to_nearest():
    """Uncorrelated inputs (diagonal H) leave nothing to compensate: any column order gives RTN's codes back."""
    w = _w(8, 32, seed=3)
    H = torch.diag(torch.rand(32, generator=torch.Generator().manual_seed(3)) * 10 + 0.1)
    for group_size in (None, 16):
        qt = gptq_quantize(w, H, 4, group_size, damp=0.0, act_order=True)
        assert torch.equal(qt.q, quantize(w, 4, group_size=group_size).q)


@pytest.mark.parametrize("bits,symmetric", [(3, True), (2, False)])
def test_awq_clip_search_is_never_worse_and_helps_at_low_bits(bits, symmetric):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(32, 64, generator=g) ** 3                  # heavy-tailed rows: a few large weights per group
    x = _calib_inputs(seed=4)
    clipped = search_clip(x, w, bits, 16, symmetric=symmetric)
    err_clip = _output_error(x, w, fake_quantize(clipped, bits, symmetric=symmetric, group_size=16))
    err_rtn = _output_error(x, w, fake_quantize(w, bits, symmetric=symmetric, group_size=16))
    assert err_clip < 0.9 * err_rtn


def test_low_bit_weight_only_linear_round_trips():
    w = _w(8, 32, seed=5)
    for bits, symmetric in [(3, True), (2, False)]:
        lin = WeightOnlyLinear.from_weight(w, bits, 16, symmetric)
        assert torch.equal(lin.dequantized_weight(), fake_quantize(w, bits, symmetric=symmetric, group_size=16))


def test_fidelity_of_a_model_against_itself(tiny_model):
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(6))
    y = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(7))
    same = fidelity(tiny_model, tiny_model, x, y)
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["top1"] == 1.0
    assert same["perplexity"] == pytest.approx(perplexity(tiny_model, x, y), rel=1e-6)
    worse = fidelity(quantize_weight_only(tiny_model, 2, 16, symmetric=False), tiny_model, x, y)
    assert worse["kl"] > 0                         # (the untrained tiny model is too flat for its argmax to move)
