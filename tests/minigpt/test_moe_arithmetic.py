"""DeepSeek-V3 arithmetic (lab 11): parameters against the report, and dispatch/combine bytes by hand."""

from __future__ import annotations

import dataclasses

import pytest

from minigpt.moe.arithmetic import (DEEPSEEK_V3, DEEPSEEK_V3_REPORTED_ACTIVE, DEEPSEEK_V3_REPORTED_TOTAL, MoEShape,
                                    dispatch_combine_bytes_per_token, dispatch_combine_bytes_per_token_upper_bound,
                                    expected_remote_ranks, expert_parameters, max_remote_ranks,
                                    mla_attention_parameters, moe_layer_parameters, moe_parameters)

V3 = DEEPSEEK_V3


def test_parameters_match_the_report() -> None:
    total, active = moe_parameters(V3)
    assert total == pytest.approx(DEEPSEEK_V3_REPORTED_TOTAL, rel=1e-3), f"671B expected, got {total / 1e9:.2f}B"
    assert active == pytest.approx(DEEPSEEK_V3_REPORTED_ACTIVE, rel=0.02), f"37B expected, got {active / 1e9:.2f}B"


def test_parameters_by_hand() -> None:
    attention = (7168 * 1536 + 1536 + 1536 * 128 * 192          # wq_a, q_norm, wq_b
                 + 7168 * 576 + 512 + 512 * 128 * 256            # wkv_a, kv_norm, wkv_b
                 + 128 * 128 * 7168)                             # wo
    assert mla_attention_parameters(V3) == attention == 187_107_328
    assert expert_parameters(V3) == 3 * 7168 * 2048
    gate = 256 * 7168
    assert moe_layer_parameters(V3) == (257 * 3 * 7168 * 2048 + gate, 9 * 3 * 7168 * 2048 + gate)
    common = 2 * 129280 * 7168 + 7168 + 61 * (attention + 2 * 7168) + 3 * 3 * 7168 * 18432
    assert moe_parameters(V3) == (common + 58 * (257 * 3 * 7168 * 2048 + gate),
                                  common + 58 * (9 * 3 * 7168 * 2048 + gate))
    assert moe_parameters(V3) == (671_026_404_352, 37_552_282_624)


def test_without_query_compression_and_tied_embeddings() -> None:
    shape = dataclasses.replace(V3, q_lora_rank=0, tie_embeddings=True)
    saved_query = (7168 * 1536 + 1536 + 1536 * 128 * 192) - 7168 * 128 * 192
    assert mla_attention_parameters(shape) == mla_attention_parameters(V3) - saved_query
    assert moe_parameters(shape)[0] == moe_parameters(V3)[0] - 61 * saved_query - 129280 * 7168


def test_remote_ranks() -> None:
    # (ep - 1) * (1 - (1 - 1/ep)^8)
    assert expected_remote_ranks(8, 8) == pytest.approx(7 * (1 - (7 / 8) ** 8))            # 4.5947
    assert expected_remote_ranks(8, 8) == pytest.approx(4.594738, rel=1e-6)
    assert expected_remote_ranks(32, 8) == pytest.approx(6.953304, rel=1e-6)
    assert expected_remote_ranks(256, 8) == pytest.approx(7.860649, rel=1e-6)
    assert expected_remote_ranks(1, 8) == 0
    assert [max_remote_ranks(ep, 8) for ep in (1, 8, 32, 256)] == [0, 7, 8, 8]


@pytest.mark.parametrize("ep, dispatch_bytes", [(8, 32_935.08), (32, 49_841.28), (256, 56_345.13)])
def test_expected_dispatch_combine_bytes(ep: int, dispatch_bytes: float) -> None:
    # remote ranks * 7168 elements * 1 byte (FP8) out, * 2 bytes (BF16) back
    b = dispatch_combine_bytes_per_token(V3, ep)
    assert b.dispatch == pytest.approx(dispatch_bytes, abs=0.01)
    assert b.combine == pytest.approx(2 * dispatch_bytes, abs=0.02)
    assert b.total == pytest.approx(3 * dispatch_bytes, abs=0.03)


@pytest.mark.parametrize("ep, copies", [(8, 7), (32, 8), (256, 8)])
def test_upper_bound_dispatch_combine_bytes(ep: int, copies: int) -> None:
    b = dispatch_combine_bytes_per_token_upper_bound(V3, ep)
    assert (b.remote_ranks, b.dispatch, b.combine) == (copies, copies * 7168, copies * 7168 * 2)
    assert b.dispatch >= dispatch_combine_bytes_per_token(V3, ep).dispatch
    bf16 = dispatch_combine_bytes_per_token_upper_bound(V3, ep, dispatch_bytes_per_element=2)
    assert bf16.dispatch == 2 * b.dispatch


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="ep_size"):
        dispatch_combine_bytes_per_token(V3, 3)               # 256 experts do not spread evenly over 3 ranks
    with pytest.raises(ValueError, match="ep_size"):
        expected_remote_ranks(0, 8)
    with pytest.raises(ValueError, match="dispatch_bytes_per_element"):
        dispatch_combine_bytes_per_token(V3, 8, dispatch_bytes_per_element=0)
    with pytest.raises(ValueError, match="top_k"):
        dataclasses.replace(V3, top_k=300)
    with pytest.raises(ValueError, match="n_dense_layers"):
        dataclasses.replace(V3, n_dense_layers=62)
    with pytest.raises(ValueError, match="d_model"):
        MoEShape("bad", 2, 0, 0, 10, 8, 8, 4, 0, 2, 2, 0, 4, 4, 2, 4)


def test_nodes_reached_by_uniform_and_group_limited_routing():
    """A token's experts over 8 nodes (one expert group a node): uniform top-8 routing reaches
    8 * (1 - C(224, 8) / C(256, 8)) nodes on average, as counted over drawn routings, and more than 4; DeepSeek-V3's group-limited routing (the best 4 of
    8 groups by the sum of each group's two best scores, then the top 8 experts inside them, as its
    `noaux_tc` router does) never reaches more than max_nodes_reached = 4."""
    import torch

    from minigpt.moe.arithmetic import DEEPSEEK_V3 as v3
    from minigpt.moe.arithmetic import expected_nodes_reached, max_nodes_reached

    g = torch.Generator().manual_seed(0)
    scores = torch.rand(20000, v3.n_routed_experts, generator=g)
    per_group = v3.n_routed_experts // v3.n_group
    uniform = scores.topk(v3.top_k, dim=-1).indices // per_group
    reached = torch.tensor([len(set(row.tolist())) for row in uniform], dtype=torch.float64)
    assert abs(reached.mean().item() - expected_nodes_reached(v3, v3.n_group)) < 0.02
    assert reached.max().item() > max_nodes_reached(v3, v3.n_group)
    group_score = scores.view(-1, v3.n_group, per_group).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, group_score.topk(v3.topk_group, -1).indices, True)
    masked = scores.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    limited = masked.topk(v3.top_k, dim=-1).indices // per_group
    assert max(len(set(row.tolist())) for row in limited) == max_nodes_reached(v3, v3.n_group) == 4
