"""minigpt.costmodel.calculators (and the pure functions behind minigpt.teaching.widgets): exact arithmetic over whole input ranges."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.costmodel import calculators as calc
from minigpt.costmodel.calculators import PRESETS, GiB, ModelShape
from minigpt.config import DRAFT_CONFIG, TARGET_CONFIG, ModelConfig
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.model import GPT

LLAMA8B = PRESETS["Llama-3-8B"]


@st.composite
def shapes(draw):
    n_kv = draw(st.sampled_from([1, 2, 4, 8, 16]))
    return ModelShape("h", n_layers=draw(st.integers(1, 128)), d_model=draw(st.integers(1, 16384)),
                      n_heads=n_kv * draw(st.sampled_from([1, 2, 4, 8])), n_kv_heads=n_kv,
                      head_dim=draw(st.sampled_from([32, 64, 80, 96, 128, 256])), d_ff=draw(st.integers(1, 65536)),
                      vocab_size=draw(st.integers(1, 262144)), tie_embeddings=draw(st.booleans()))


# ---------------------------------------------------------------- parameters

def test_llama3_8b_parameter_count():
    assert calc.count_parameters(LLAMA8B) == 8_030_261_248          # ~8.03e9, as published


def test_published_sizes():
    assert calc.count_parameters(PRESETS["Llama-3-70B"]) == pytest.approx(70.55e9, rel=1e-3)
    assert calc.count_parameters(PRESETS["Llama-2-7B (MHA)"]) == pytest.approx(6.738e9, rel=1e-3)


@pytest.mark.parametrize("config", [TARGET_CONFIG, DRAFT_CONFIG,
                                    ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=48,
                                                tie_embeddings=False)])
def test_parameter_count_matches_the_real_model(config):
    shape = calc.ModelShape.from_config(config, "x")
    assert calc.count_parameters(shape) == GPT(config).num_parameters()


def test_presets_are_what_they_say():
    assert PRESETS["Llama-2-7B (MHA)"].attention_kind == "MHA"
    assert PRESETS["Llama-3-8B"].attention_kind == "GQA"
    assert PRESETS["Llama-3-8B-MQA (hypothetical)"].attention_kind == "MQA"
    assert PRESETS["minigpt-target"].tie_embeddings


def test_shape_validation():
    with pytest.raises(ValueError, match="multiple"):
        ModelShape("bad", 1, 64, n_heads=6, n_kv_heads=4, head_dim=16, d_ff=64, vocab_size=10)
    with pytest.raises(ValueError, match="positive"):
        ModelShape("bad", 0, 64, 4, 4, 16, 64, 10)
    with pytest.raises(KeyError, match="unknown model preset"):
        calc.get_preset("GPT-5")
    with pytest.raises(KeyError, match="unknown precision"):
        calc.bytes_per_element("fp6")


# ---------------------------------------------------------------- KV cache

def test_llama3_8b_kv_cache_is_one_gib_at_8k():
    assert calc.kv_cache_bytes(LLAMA8B, 8192, 1, 2) == GiB


def test_kv_cache_matches_real_tensors():
    """Count the bytes of the K and V tensors the model actually produces for a cache."""
    cfg = TARGET_CONFIG
    model = GPT(cfg).eval()
    stored = []

    class Recorder:
        def update(self, k, v):
            stored.extend([k, v])
            return k, v

    T, B = 10, 3
    with torch.inference_mode():
        model(torch.zeros(B, T, dtype=torch.long), torch.arange(T), kv_caches=[Recorder() for _ in model.layers])
    actual = sum(t.numel() * t.element_size() for t in stored)
    assert calc.kv_cache_bytes(calc.ModelShape.from_config(cfg, "t"), T, B, 4) == actual


@given(shapes(), st.integers(0, 1 << 20), st.integers(1, 1024), st.sampled_from([1, 2, 4]))
@settings(max_examples=200, deadline=None)
def test_kv_cache_is_exact_and_linear(shape, ctx, batch, bpe):
    b = calc.kv_cache_bytes(shape, ctx, batch, bpe)
    assert isinstance(b, int) and b == calc.kv_bytes_per_token(shape, bpe) * ctx * batch
    mha = dataclasses.replace(shape, n_kv_heads=shape.n_heads)
    assert calc.kv_cache_bytes(mha, ctx, batch, bpe) * shape.n_kv_heads == b * shape.n_heads


def test_bad_kv_inputs():
    with pytest.raises(ValueError, match="context_len"):
        calc.kv_cache_bytes(LLAMA8B, -1)
    with pytest.raises(ValueError, match="batch"):
        calc.kv_cache_bytes(LLAMA8B, 10, 1.5)


# ---------------------------------------------------------------- FLOPs, bytes, roofline

@given(shapes(), st.integers(1, 4096), st.integers(1, 64))
@settings(max_examples=100, deadline=None)
def test_flops_and_bytes_invariants(shape, L, B):
    pf, df = calc.prefill_flops(shape, L, B), calc.decode_flops(shape, L, B)
    assert isinstance(pf, int) and isinstance(df, int)
    # Prefill of L tokens = sum of L "decode" steps at contexts 1..L (causal attention).
    if L <= 64:
        assert pf == sum(calc.decode_flops(shape, i, B) for i in range(1, L + 1))
    assert pf >= df
    assert calc.prefill_flops(shape, L, B) == B * calc.prefill_flops(shape, L, 1)
    # Decode reads the weights once, whatever the batch: each extra sequence adds its cache and one embedding row.
    w = calc.weight_bytes_read(shape, 0, 2)
    assert calc.decode_bytes(shape, L, B) - calc.decode_bytes(shape, L, 1) == (
        calc.kv_cache_bytes(shape, L, B - 1, 2) + (B - 1) * shape.d_model * 2)
    assert calc.decode_bytes(shape, L, B) >= w
    # The per-kernel split adds up to the whole step, and its bound is never below the lumped one.
    kernels = calc.decode_kernels(shape, L, B)
    assert sum(f for f, _ in kernels.values()) == df and sum(m for _, m in kernels.values()) == calc.decode_bytes(shape, L, B)
    lumped = calc.time_lower_bound(df, calc.decode_bytes(shape, L, B), 1e15, 3e12)
    assert calc.decode_step_time(shape, L, B, 1e15, 3e12) >= lumped * (1 - 1e-12)


def test_a_decode_step_reads_rows_of_an_untied_table_and_all_of_a_tied_one():
    untied = LLAMA8B
    tied = dataclasses.replace(LLAMA8B, tie_embeddings=True)
    table = untied.vocab_size * untied.d_model
    # Untied: the stored weights less the table, plus one row per sequence (Llama-3-8B: 1.05 GB of 16.06 GB).
    assert calc.weight_bytes_read(untied, 4, 2) == calc.weight_bytes(untied, 2) - 2 * table + 2 * 4 * untied.d_model
    assert calc.weight_bytes(untied, 2) - calc.weight_bytes_read(untied, 0, 2) == 1_050_673_152
    # Tied: the output projection reads the whole shared matrix; the lookup reads its rows as well.
    assert calc.weight_bytes_read(tied, 4, 2) == calc.weight_bytes(tied, 2) + 2 * 4 * tied.d_model


def test_per_kernel_view_llama3_8b_h100():
    g = ACCELERATORS["H100-SXM"]
    peak, bw = g.peak("bf16"), g.memory_bandwidth
    lumped = calc.time_lower_bound(calc.decode_flops(LLAMA8B, 1024, 512), calc.decode_bytes(LLAMA8B, 1024, 512), peak, bw)
    assert round(lumped * 1e3, 1) == 25.0 and round(calc.decode_step_time(LLAMA8B, 1024, 512, peak, bw) * 1e3, 1) == 28.3
    # The weight matmuls turn compute-bound at the context-0 critical batch, whatever the context.
    b = calc.critical_batch_size(LLAMA8B, 0, peak, bw)
    for ctx in (0, 1024, 8192):
        f, m = calc.decode_kernels(LLAMA8B, ctx, b)["weights"]
        assert f / m >= g.ridge_point("bf16")
        f, m = calc.decode_kernels(LLAMA8B, ctx, b - 1)["weights"]
        assert f / m < g.ridge_point("bf16")


def test_flops_per_token_is_about_twice_the_parameters():
    per_token = calc.decode_flops(LLAMA8B, 0, 1)
    assert per_token == 2 * calc.matmul_parameters(LLAMA8B)
    assert 1.8 * 8.03e9 < per_token < 2 * 8.03e9


@given(st.floats(1e-3, 1e6), st.floats(1e9, 1e16), st.floats(1e9, 1e13))
def test_roofline(ai, peak, bw):
    a = calc.attainable_flops(ai, peak, bw)
    assert a <= peak and a <= ai * bw * (1 + 1e-12)
    assert a == pytest.approx(min(peak, ai * bw))
    ridge = calc.ridge_point(peak, bw)
    assert calc.attainable_flops(ridge, peak, bw) == pytest.approx(peak)


def test_intensity_rejects_zero_bytes():
    with pytest.raises(ValueError):
        calc.arithmetic_intensity(1.0, 0)


# ---------------------------------------------------------------- serving limits

def test_h100_llama3_8b_numbers():
    h100 = ACCELERATORS["H100-SXM"]
    assert calc.max_concurrent_requests(LLAMA8B, 8192, h100.memory_bytes) == 52
    assert calc.max_concurrent_requests(LLAMA8B, 8192, h100.memory_bytes, kv_bytes_per_element=1) == 104
    t = calc.decode_time_lower_bound(LLAMA8B, 4096, 1, h100.memory_bandwidth)
    assert t == pytest.approx((16_060_522_496 - 1_050_673_152 + 2 * 4096 + 4096 * 131072) / 3.35e12)
    assert calc.decode_tokens_per_second(LLAMA8B, 4096, 4, h100.memory_bandwidth) == pytest.approx(
        4 / calc.decode_time_lower_bound(LLAMA8B, 4096, 4, h100.memory_bandwidth))


def test_weights_that_do_not_fit_leave_room_for_nothing():
    assert calc.max_concurrent_requests(PRESETS["Llama-3-70B"], 4096, ACCELERATORS["H100-SXM"].memory_bytes) == 0


@given(shapes(), st.integers(0, 65536), st.floats(1e12, 5e15), st.floats(1e11, 1e13), st.sampled_from([1, 2]))
@settings(max_examples=200, deadline=None)
def test_critical_batch_is_the_smallest(shape, ctx, peak, bw, bpe):
    b = calc.critical_batch_size(shape, ctx, peak, bw, weight_bytes_per_element=bpe, kv_bytes_per_element=bpe)
    ridge = peak / bw
    kw = dict(weight_bytes_per_element=bpe, kv_bytes_per_element=bpe)

    def intensity(B):
        return calc.decode_flops(shape, ctx, B) / calc.decode_bytes(shape, ctx, B, **kw)

    if b is None:
        assert intensity(10**9) < ridge
    else:
        assert b >= 1 and intensity(b) >= ridge * (1 - 1e-12)
        assert b == 1 or intensity(b - 1) < ridge * (1 + 1e-12)


def test_critical_batch_llama3_8b_h100():
    g = ACCELERATORS["H100-SXM"]
    b = calc.critical_batch_size(LLAMA8B, 0, g.peak("bf16"), g.memory_bandwidth)
    assert b == 296 and g.ridge_point("bf16") < b
    assert calc.critical_batch_size(LLAMA8B, 8192, g.peak("bf16"), g.memory_bandwidth) is None


# ---------------------------------------------------------------- pure functions behind the widgets

@given(st.sampled_from(list(PRESETS)), st.sampled_from([2**k for k in range(7, 18)]), st.integers(1, 256),
       st.sampled_from(list(ACCELERATORS)), st.sampled_from(["bf16", "fp16", "fp8", "int8", "fp32"]),
       st.sampled_from(["bf16", "fp8", "int8", "fp32"]), st.sampled_from([0.5 + 0.05 * i for i in range(11)]))
@settings(max_examples=300, deadline=None)
def test_kv_calculator_over_the_slider_ranges(preset, ctx, batch, gpu, wp, kp, util):
    from minigpt.teaching.widgets import kv_calculator_plan, kv_readout

    shape, g = PRESETS[preset], ACCELERATORS[gpu]
    plan = kv_calculator_plan(shape, ctx, batch, g, weight_precision=wp, kv_precision=kp, memory_utilization=util)
    assert plan.kv_bytes == calc.kv_cache_bytes(shape, ctx, batch, calc.bytes_per_element(kp))
    assert plan.weight_bytes == calc.weight_bytes(shape, calc.bytes_per_element(wp))
    assert plan.max_requests == calc.max_concurrent_requests(shape, ctx, g.memory_bytes, memory_utilization=util,
                                                             weight_bytes_per_element=calc.bytes_per_element(wp),
                                                             kv_bytes_per_element=calc.bytes_per_element(kp))
    assert plan.fits == (plan.weight_bytes + plan.kv_bytes <= plan.usable_bytes)
    assert plan.max_requests >= batch or not plan.fits
    assert "max concurrent requests" in kv_readout(shape, ctx, batch, g, plan, kp)


@given(st.integers(1, 128), st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]), st.sampled_from([64, 80, 96, 128, 256]),
       st.floats(0.1, 1000), st.sampled_from([2**k for k in range(7, 18)]))
@settings(max_examples=100, deadline=None)
def test_kv_calculator_custom_shape(layers, kv_heads, head_dim, params_b, ctx):
    from minigpt.teaching.widgets import CustomShape, kv_calculator_plan

    custom = CustomShape(layers, kv_heads, head_dim, int(params_b * 1e9))
    plan = kv_calculator_plan(custom, ctx, 1, ACCELERATORS["H200"])
    assert plan.kv_bytes_per_request == 2 * layers * kv_heads * head_dim * ctx * 2
    assert plan.weight_bytes == int(params_b * 1e9) * 2


@given(st.sampled_from(list(PRESETS)), st.sampled_from(list(ACCELERATORS)), st.sampled_from([2**k for k in range(11)]),
       st.sampled_from([2**k for k in range(4, 16)]))
@settings(max_examples=200, deadline=None)
def test_roofline_report_over_the_slider_ranges(preset, gpu, batch, seq_len):
    from minigpt.teaching.widgets import roofline_readout

    shape, g = PRESETS[preset], ACCELERATORS[gpu]
    for prec in g.precisions():
        bpe = calc.bytes_per_element(prec)
        rep = calc.roofline_report(shape, g.peak(prec), g.memory_bandwidth, batch=batch, seq_len=seq_len,
                                   weight_bytes_per_element=bpe, kv_bytes_per_element=bpe)
        pre, dec = rep["prefill"], rep["decode"]
        assert pre.intensity > dec.intensity                 # prefill amortises the weights over seq_len tokens
        for p in rep.values():
            assert 0 < p.attainable <= g.peak(prec) and math.isfinite(p.time_s) and p.time_s > 0
            assert p.compute_bound == (p.intensity >= g.ridge_point(prec))
        assert "decode" in roofline_readout(shape, g, prec, batch, seq_len, rep)


def test_widgets_redraw_when_a_control_moves():
    from minigpt.teaching.widgets import KVCacheCalculator, RooflineCalculator

    kv = KVCacheCalculator()
    before = (kv.readout.value, kv.image.value)
    kv.context.value = 16384
    assert kv.readout.value != before[0] and kv.image.value != before[1]
    kv.model.value = "custom"
    assert kv.custom_box.layout.display == "" and kv.error.value == ""

    roof = RooflineCalculator()
    before = (roof.readout.value, roof.image.value)
    roof.batch.value = 64
    assert roof.readout.value != before[0] and roof.image.value != before[1]
    roof.gpu.value = "T4"                      # no fp8 there: the precision list follows the GPU
    assert "fp8" not in roof.precision.options and roof.error.value == ""
