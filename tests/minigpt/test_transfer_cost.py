"""KV transfer between prefill and decode (lab 11): hand-computed bytes, link times, and the layer-wise pipeline."""

from __future__ import annotations

import pytest

from minigpt.disagg.transfer_cost import (DEEPSEEK_V3_MLA, LINKS, RDMA_LATENCY_S, TCP_LATENCY_S, Link,
                                          exposed_after_compute, gbit_per_s, kv_bytes_per_request, layer_send_ends,
                                          layerwise_overlap, transfer_table, transfer_time)
from minigpt.longctx.kv_compression import LAYOUTS
from minigpt.costmodel import calculators as calc
from minigpt.costmodel.calculators import PRESETS, ModelShape
from minigpt.costmodel.hardware import ACCELERATORS

L8, L70 = PRESETS["Llama-3-8B"], PRESETS["Llama-3-70B"]
H100 = ACCELERATORS["H100-SXM"]
MiB = 2**20


# ---------------------------------------------------------------- bytes

def test_llama3_8b_bf16_request_is_512_mib() -> None:
    # 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131_072 bytes a token; x 4096 tokens = 536_870_912 = 512 MiB.
    assert kv_bytes_per_request(L8, 1, 2) == 131_072
    assert kv_bytes_per_request(L8, 4096, 2) == 536_870_912 == 512 * MiB


def test_llama3_70b_bf16_request() -> None:
    # 2 x 80 x 8 x 128 x 2 = 327_680 bytes a token; x 4096 = 1_342_177_280 = 1280 MiB.
    assert kv_bytes_per_request(L70, 4096, 2) == 1_342_177_280 == 1280 * MiB


def test_deepseek_v3_mla_caches_the_latent_only() -> None:
    # 61 layers x (512 latent + 64 RoPE key) = 35_136 elements a token: 70_272 bytes in bf16, 35_136 in fp8.
    assert kv_bytes_per_request(DEEPSEEK_V3_MLA, 1, 2) == 70_272
    assert kv_bytes_per_request(DEEPSEEK_V3_MLA, 1, 1) == 35_136
    assert kv_bytes_per_request(DEEPSEEK_V3_MLA, 4096, 2) == 287_834_112
    # Same widths as the DeepSeek-V2 layout of lab 09, one more layer.
    v2 = LAYOUTS["DeepSeek-V2 (MLA)"]
    assert kv_bytes_per_request(v2, 1, 2) * 61 == kv_bytes_per_request(DEEPSEEK_V3_MLA, 1, 2) * 60


def test_a_kv_layout_and_a_model_shape_agree() -> None:
    assert kv_bytes_per_request(LAYOUTS["Llama-3-8B (GQA)"], 4096, 2) == kv_bytes_per_request(L8, 4096, 2)


def test_empty_prompt_has_no_bytes() -> None:
    assert kv_bytes_per_request(L8, 0, 2) == 0 == kv_bytes_per_request(DEEPSEEK_V3_MLA, 0, 2)


# ---------------------------------------------------------------- links and time

def test_link_bandwidths_one_way() -> None:
    expected = {"NVLink 4 (H100 SXM)": 450e9, "InfiniBand NDR (1 port)": 50e9, "InfiniBand NDR x8 (DGX H100)": 400e9,
                "100 GbE": 12.5e9, "25 GbE": 3.125e9}
    assert {name: link.bandwidth for name, link in LINKS.items()} == pytest.approx(expected)
    assert gbit_per_s(400) == 50e9
    for link in LINKS.values():
        assert link.source, f"{link.name} needs a source"
        assert link.latency_s in (RDMA_LATENCY_S, TCP_LATENCY_S), f"{link.name}: latency must be a stated assumption"


def test_transfer_time_of_512_mib_on_each_link() -> None:
    # latency + 536_870_912 / bandwidth, by hand:
    expected = {"NVLink 4 (H100 SXM)": 5e-6 + 1.193046471e-3,        # 536_870_912 / 450e9
                "InfiniBand NDR (1 port)": 5e-6 + 10.73741824e-3,     # / 50e9
                "InfiniBand NDR x8 (DGX H100)": 5e-6 + 1.34217728e-3,  # / 400e9
                "100 GbE": 20e-6 + 42.94967296e-3,                    # / 12.5e9
                "25 GbE": 20e-6 + 171.79869184e-3}                    # / 3.125e9
    got = {name: transfer_time(512 * MiB, link) for name, link in LINKS.items()}
    assert got == pytest.approx(expected, rel=1e-9)


def test_each_message_pays_the_latency() -> None:
    link = Link("test", 1e9, 1e-3, "made up")
    assert transfer_time(0, link) == 1e-3
    assert transfer_time(2e9, link, n_messages=4) == pytest.approx(4e-3 + 2.0)


# ---------------------------------------------------------------- the layer-wise recurrence

def _naive_exposed(compute_s, send_s):
    """The WRONG model the recurrence must reject: total send minus total compute, as if the first send could start
    at time 0 and the last could hide behind compute that has already finished."""
    return max(0.0, sum(send_s) - sum(compute_s))


def test_recurrence_when_the_link_is_the_bottleneck() -> None:
    # 3 layers, 1 s of compute and 3 s of send each. Computes end at 1, 2, 3.
    # send 0: starts 1, ends 4; send 1: starts max(2, 4) = 4, ends 7; send 2: starts max(3, 7) = 7, ends 10.
    # Exposed after the prefill (t = 3): 10 - 3 = 7 = x + (N - 1)(x - t) = 3 + 2 * 2.
    compute, send = [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]
    assert layer_send_ends(compute, send) == [4.0, 7.0, 10.0]
    assert exposed_after_compute(compute, send) == 7.0
    assert _naive_exposed(compute, send) == 6.0          # the wrong model misses the first layer's wait


def test_recurrence_when_compute_is_the_bottleneck_leaves_one_layers_send() -> None:
    # 2 s of compute, 1 s of send: each send ends before the next layer's K/V is ready; only the last one shows.
    compute, send = [2.0, 2.0, 2.0], [1.0, 1.0, 1.0]
    assert layer_send_ends(compute, send) == [3.0, 5.0, 7.0]
    assert exposed_after_compute(compute, send) == 1.0
    assert _naive_exposed(compute, send) == 0.0          # the wrong model hides the last send too


def test_recurrence_with_uneven_layers() -> None:
    # Computes end at 1, 2, 6. Sends: 1 -> 4; max(2, 4) = 4 -> 7; max(6, 7) = 7 -> 8. Exposed: 8 - 6 = 2.
    assert layer_send_ends([1.0, 1.0, 4.0], [3.0, 3.0, 1.0]) == [4.0, 7.0, 8.0]
    assert exposed_after_compute([1.0, 1.0, 4.0], [3.0, 3.0, 1.0]) == 2.0


TOY = ModelShape("toy", n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128, vocab_size=256)


def _toy_layer_compute(tokens: int) -> float:
    report = calc.roofline_report(TOY, H100.peak("bf16"), H100.memory_bandwidth, batch=1, seq_len=tokens)
    return report["prefill"].time_s / 3


@pytest.mark.parametrize("ratio, exposed_in_layers", [(3.0, 3.0 + 2 * (3.0 - 1.0)), (0.5, 0.5)])
def test_layerwise_overlap_on_three_layers(ratio, exposed_in_layers) -> None:
    """A link whose per-layer send is `ratio` times a layer's compute: exposed = x + 2(x - t) when x > t, else x."""
    tokens = 64
    t = _toy_layer_compute(tokens)
    layer_bytes = 2 * 2 * 16 * tokens * 2                         # K and V, 2 KV heads of 16, bf16: 8192 bytes
    link = Link("sized", layer_bytes / (ratio * t), 0.0, "made up so that one layer's send is ratio x its compute")
    r = layerwise_overlap(TOY, tokens, H100, link)
    assert r.layer_bytes == layer_bytes and r.kv_bytes == 3 * layer_bytes
    assert r.compute_per_layer_s == pytest.approx(t)
    assert r.send_per_layer_s == pytest.approx(ratio * t)
    assert r.exposed_layerwise_s == pytest.approx(exposed_in_layers * t)
    assert r.transfer_after_prefill_s == pytest.approx(3 * ratio * t)


def test_layerwise_overlap_uses_lab00_prefill_and_decode() -> None:
    r = layerwise_overlap(L8, 4096, H100, LINKS["InfiniBand NDR (1 port)"])
    report = calc.roofline_report(L8, H100.peak("bf16"), H100.memory_bandwidth, batch=1, seq_len=4096)
    assert r.prefill_s == pytest.approx(report["prefill"].time_s)
    assert r.first_decode_step_s == pytest.approx(calc.decode_step_time(L8, 4096, 1, H100.peak("bf16"),
                                                                        H100.memory_bandwidth))
    # At batch 1 both decode kernels are memory-bound, so the step is the bandwidth lower bound.
    assert r.first_decode_step_s == pytest.approx(calc.decode_time_lower_bound(L8, 4096, 1, H100.memory_bandwidth))
    # One NDR port: 16 MiB a layer is 0.34 ms, under a layer's 2.1 ms of compute, so only the last layer shows.
    assert r.send_per_layer_s == pytest.approx(5e-6 + 16 * MiB / 50e9)
    assert r.exposed_layerwise_s == pytest.approx(r.send_per_layer_s)
    assert r.transfer_after_prefill_s == pytest.approx(5e-6 + 512 * MiB / 50e9)
    assert r.layerwise_within_decode_step and not r.whole_within_decode_step


def test_a_slow_link_cannot_hide_behind_the_prefill() -> None:
    r = layerwise_overlap(L8, 4096, H100, LINKS["25 GbE"])
    x, t = r.send_per_layer_s, r.compute_per_layer_s
    assert x > t
    assert r.exposed_layerwise_s == pytest.approx(x + 31 * (x - t))
    assert not r.layerwise_within_decode_step


# ---------------------------------------------------------------- the table

def test_table_has_a_row_per_model_length_and_link() -> None:
    rows = transfer_table([L8, DEEPSEEK_V3_MLA], [1024, 4096], LINKS, H100)
    assert len(rows) == 2 * 2 * len(LINKS)
    first = rows[0]
    assert (first["model"], first["attention"], first["prompt_tokens"], first["link"]) == \
        ("Llama-3-8B", "GQA", 1024, "NVLink 4 (H100 SXM)")
    assert first["kv_bytes"] == 128 * MiB and first["kv_MiB"] == 128.0
    assert first["prefill_s"] > 0 and first["exposed_layerwise_s"] > 0
    mla = [r for r in rows if r["model"] == "DeepSeek-V3 (MLA)"]
    assert all(r["prefill_s"] is None and r["first_decode_step_s"] is None for r in mla)
    assert {r["kv_bytes"] for r in mla} == {1024 * 70_272, 4096 * 70_272}


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("call", [
    lambda: kv_bytes_per_request(L8, -1, 2),
    lambda: kv_bytes_per_request(L8, 4096, 0),
    lambda: kv_bytes_per_request(DEEPSEEK_V3_MLA, 1.5, 2),
    lambda: transfer_time(-1, LINKS["100 GbE"]),
    lambda: transfer_time(10, LINKS["100 GbE"], n_messages=0),
    lambda: Link("broken", 0.0, 1e-6, "none"),
    lambda: Link("broken", 1e9, -1e-6, "none"),
    lambda: layer_send_ends([1.0, 1.0], [1.0]),
    lambda: layer_send_ends([], []),
    lambda: layer_send_ends([1.0], [-1.0]),
    lambda: layerwise_overlap(L8, 0, H100, LINKS["100 GbE"]),
    lambda: layerwise_overlap(L8, 4096, H100, LINKS["100 GbE"], decode_batch=0),
], ids=["negative tokens", "zero bytes", "float tokens", "negative bytes", "no message", "zero bandwidth",
        "negative latency", "lengths differ", "no layers", "negative send", "empty prompt", "no decode batch"])
def test_bad_input_raises_value_error(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_wrong_kind_of_shape_raises_type_error() -> None:
    with pytest.raises(TypeError, match="ModelShape or a kv_compression.KVLayout"):
        kv_bytes_per_request({"n_layers": 32}, 10, 2)
    with pytest.raises(TypeError, match="ModelShape"):
        layerwise_overlap(DEEPSEEK_V3_MLA, 4096, H100, LINKS["100 GbE"])
