"""minigpt.longctx.mla: the materialised and absorbed paths agree, prefill is causal, and the decode-step cost."""

from __future__ import annotations

import torch

from minigpt.longctx import mla

SMALL = mla.MLAShape(d_model=24, n_heads=3, kv_lora_rank=10, rope_dim=4, nope_dim=6, v_dim=5)


def _layer(seed: int, T: int = 9, batch: int = 2):
    g = torch.Generator().manual_seed(seed)
    w = mla.MLAWeights.draw(SMALL, g, dtype=torch.float64)
    x = torch.randn(batch, T, SMALL.d_model, generator=g, dtype=torch.float64)
    return w, mla.project(w, x, torch.arange(T))


def test_every_prefill_row_is_the_absorbed_step_over_the_tokens_before_it() -> None:
    w, (q_nope, q_rope, c_kv, k_rope) = _layer(0)
    prefill = mla.materialised_attention(w, q_nope, q_rope, c_kv, k_rope)
    for t in range(c_kv.shape[1]):
        step = mla.absorbed_decode(q_nope[:, t], q_rope[:, t], c_kv[:, :t + 1], k_rope[:, :t + 1], w.w_uk, w.w_uv,
                                   w.w_o)
        assert torch.allclose(step, prefill[:, t], atol=1e-12), f"position {t}"


def test_the_naive_step_equals_the_absorbed_one() -> None:
    w, (q_nope, q_rope, c_kv, k_rope) = _layer(1)
    args = (q_nope[:, -1], q_rope[:, -1], c_kv, k_rope, w.w_uk, w.w_uv, w.w_o)
    assert torch.allclose(mla.naive_decode(*args), mla.absorbed_decode(*args), atol=1e-12)


def test_the_rope_key_carries_position() -> None:
    """Shifting every position by the same amount leaves the scores (so the outputs) unchanged; the latents ignore
    position."""
    g = torch.Generator().manual_seed(2)
    w = mla.MLAWeights.draw(SMALL, g, dtype=torch.float64)
    x = torch.randn(1, 5, SMALL.d_model, generator=g, dtype=torch.float64)
    a, b = mla.project(w, x, torch.arange(5)), mla.project(w, x, torch.arange(5) + 7)
    assert torch.equal(a[2], b[2]) and not torch.allclose(a[3], b[3])
    assert torch.allclose(mla.materialised_attention(w, *a), mla.materialised_attention(w, *b), atol=1e-10)


def test_deepseek_v3_shape_is_its_config() -> None:
    v3 = mla.DEEPSEEK_V3
    assert (v3.d_model, v3.n_heads, v3.kv_lora_rank, v3.rope_dim, v3.nope_dim, v3.v_dim, v3.n_layers) == \
        (7168, 128, 512, 64, 128, 128, 61)
    assert abs(v3.scale - 192 ** -0.5) < 1e-15


def test_the_absorbed_step_reads_the_latents_and_the_two_matrices_once() -> None:
    v3, T = mla.DEEPSEEK_V3, 32_768
    cost = mla.decode_step_cost(v3, T, batch=1, bytes_per_element=2)
    assert cost["absorbed"].bytes == T * 576 * 2 + 128 * 512 * 256 * 2
    assert cost["materialised"].bytes == cost["absorbed"].bytes + 2 * T * 128 * 256 * 2
    assert cost["materialised"].flops > 100 * cost["absorbed"].flops
    two = mla.decode_step_cost(v3, T, batch=2)
    assert two["absorbed"].flops == 2 * cost["absorbed"].flops
