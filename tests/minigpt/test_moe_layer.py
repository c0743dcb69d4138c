"""The MoE layer (lab 11): the sparse path equals the every-expert oracle; dispatch, capacity, combine and load."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minigpt_fixtures import seeded

from minigpt.model import SwiGLU
from minigpt.moe.layer import (Expert, MoELayer, Router, capacity_for, combine, contiguous_placement, dense_gates,
                               dense_reference, dispatch, expert_load, rank_load, run_experts)

D, D_FF, E = 16, 32, 6


def make_layer(seed: int, top_k: int, n_shared: int = 0, renormalize: bool = True, n_experts: int = E) -> MoELayer:
    return seeded(seed, lambda: MoELayer(D, D_FF, n_experts, top_k, n_shared=n_shared, renormalize=renormalize))


def make_input(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- sparse path == dense oracle

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("n_shared", [0, 2])
@pytest.mark.parametrize("renormalize", [True, False])
def test_sparse_layer_equals_dense_reference(seed: int, top_k: int, n_shared: int, renormalize: bool) -> None:
    layer = make_layer(seed, top_k, n_shared, renormalize)
    x = make_input(100 + seed, 3, 5, D)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), dense_reference(layer, x))


def test_output_keeps_the_input_shape() -> None:
    layer = make_layer(0, 2)
    x = make_input(0, 2, 7, D)
    assert layer(x).shape == x.shape


class RunsEveryExpert(MoELayer):
    """A wrong layer the oracle test must not be fooled by: weights summed without the top-k mask."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.d_model)
        probs = self.router.probabilities(flat)
        return sum(probs[:, e:e + 1] * expert(flat) for e, expert in enumerate(self.experts)).view_as(x)


def test_the_oracle_rejects_a_layer_that_ignores_top_k() -> None:
    wrong = seeded(0, lambda: RunsEveryExpert(D, D_FF, E, 2))
    x = make_input(1, 2, 4, D)
    with torch.no_grad(), pytest.raises(AssertionError):
        torch.testing.assert_close(wrong(x), dense_reference(wrong, x))


def test_expert_is_the_model_swiglu() -> None:
    expert = seeded(0, lambda: Expert(D, D_FF))
    assert isinstance(expert, SwiGLU)
    assert [name for name, _ in expert.named_parameters()] == ["w_gate.weight", "w_up.weight", "w_down.weight"]
    x = make_input(0, 4, D)
    expected = expert.w_down(torch.nn.functional.silu(expert.w_gate(x)) * expert.w_up(x))
    torch.testing.assert_close(expert(x), expected)


# ---------------------------------------------------------------- router

def test_renormalized_weights_sum_to_one() -> None:
    router = seeded(0, lambda: Router(D, E, top_k=3))
    weights, expert_ids = router(make_input(0, 20, D))
    assert weights.shape == expert_ids.shape == (20, 3)
    assert weights.dtype == torch.float32 and expert_ids.dtype == torch.long
    torch.testing.assert_close(weights.sum(-1), torch.ones(20))


def test_raw_weights_are_the_softmax_probabilities() -> None:
    router = seeded(0, lambda: Router(D, E, top_k=2, renormalize=False))
    x = make_input(0, 10, D)
    weights, expert_ids = router(x)
    probs = torch.softmax(router.gate(x), dim=-1)
    torch.testing.assert_close(weights, probs.gather(1, expert_ids))
    assert bool((weights.sum(-1) < 1).all()), "top-2 of 6 raw probabilities must add up to less than 1"
    assert bool((weights[:, 0] >= weights[:, 1]).all()), "experts come in decreasing probability"


def test_without_renormalization_the_layer_differs() -> None:
    x = make_input(3, 2, 5, D)
    with torch.no_grad():
        renormalized = make_layer(7, top_k=2, renormalize=True)(x)
        raw = make_layer(7, top_k=2, renormalize=False)(x)      # the same weights, seeded alike
    assert not torch.allclose(renormalized, raw, atol=1e-4), "raw softmax weights must change the output"


def test_dense_gates_put_the_weights_at_the_chosen_experts() -> None:
    weights = torch.tensor([[0.7, 0.3], [0.6, 0.4]])
    ids = torch.tensor([[2, 0], [1, 3]])
    expected = torch.tensor([[0.3, 0.0, 0.7, 0.0], [0.0, 0.6, 0.0, 0.4]])
    torch.testing.assert_close(dense_gates(weights, ids, 4), expected)


# ---------------------------------------------------------------- dispatch and combine

def test_dispatch_and_combine_without_capacity_equal_the_layer() -> None:
    layer = make_layer(4, top_k=2, n_shared=1)
    x = make_input(4, 2, 6, D)
    flat = x.reshape(-1, D)
    with torch.no_grad():
        weights, expert_ids = layer.router(flat)
        plan = dispatch(flat, expert_ids, E, capacity=None)
        routed = combine(run_experts(layer.experts, plan), plan, weights, flat.shape[0])
        assert plan.n_dropped == 0 and plan.n_kept == flat.shape[0] * 2
        torch.testing.assert_close((routed + layer.shared_output(flat)).view_as(x), layer(x))


def test_combine_restores_token_order() -> None:
    # Token n goes to expert ids[n]: the packed order (grouped by expert) is tokens 1, 3, 2, 0.
    ids = torch.tensor([[2], [0], [1], [0]])
    x = torch.arange(4 * 3, dtype=torch.float32).view(4, 3)
    plan = dispatch(x, ids, n_experts=3, capacity=None)
    assert plan.token_index.tolist() == [1, 3, 2, 0]
    assert plan.tokens_per_expert == (2, 1, 1)
    torch.testing.assert_close(plan.expert_inputs, x[[1, 3, 2, 0]])
    scale = {0: 10.0, 1: 100.0, 2: 1000.0}           # "expert e" multiplies by scale[e]
    outputs = torch.cat([rows * scale[e] for e, rows in enumerate(plan.per_expert_inputs())])
    weights = torch.tensor([[0.5], [1.0], [2.0], [0.25]])
    out = combine(outputs, plan, weights, n_tokens=4)
    expected = torch.stack([x[n] * scale[int(ids[n, 0])] * weights[n, 0] for n in range(4)])
    torch.testing.assert_close(out, expected)


def test_capacity_drops_the_late_comers_top1() -> None:
    # Expert 0 receives tokens 0, 1, 3, 4; capacity 2 keeps 0 and 1 and drops 3 and 4. Expert 1 keeps 2 and 5.
    ids = torch.tensor([[0], [0], [1], [0], [0], [1]])
    x = make_input(0, 6, D)
    plan = dispatch(x, ids, n_experts=2, capacity=2)
    assert plan.n_dropped == 2
    assert plan.dropped_token_index.tolist() == [3, 4]
    assert plan.tokens_per_expert == (2, 2)
    assert plan.token_index.tolist() == [0, 1, 2, 5]
    out = combine(plan.expert_inputs * 3, plan, torch.ones(6, 1), 6)     # "experts" triple their input
    torch.testing.assert_close(out[[3, 4]], torch.zeros(2, D))
    torch.testing.assert_close(out[[0, 1, 2, 5]], 3 * x[[0, 1, 2, 5]])


def test_capacity_drops_per_assignment_top2() -> None:
    # Expert 0 gets (token 0, slot 0), (1, 0), (2, 1); expert 1 gets (0, 1), (1, 1), (2, 0). Capacity 2: token 2's
    # two assignments are the third at each expert, both dropped, so token 2 gets nothing.
    ids = torch.tensor([[0, 1], [0, 1], [1, 0]])
    x = make_input(1, 3, D)
    weights = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.9, 0.1]])
    plan = dispatch(x, ids, n_experts=2, capacity=2)
    assert plan.n_dropped == 2
    assert plan.dropped_token_index.tolist() == [2, 2] and plan.dropped_slot_index.tolist() == [0, 1]
    out = combine(plan.expert_inputs, plan, weights, 3)                    # identity "experts"
    torch.testing.assert_close(out[2], torch.zeros(D))
    torch.testing.assert_close(out[:2], x[:2])                             # weights of tokens 0 and 1 add to 1


def test_capacity_zero_drops_everything_and_layer_capacity_matches_dense_when_large() -> None:
    ids = torch.tensor([[0], [1]])
    assert dispatch(make_input(0, 2, D), ids, 2, capacity=0).n_dropped == 2
    layer = make_layer(5, top_k=2)
    flat = make_input(5, 8, D)
    with torch.no_grad():
        weights, expert_ids = layer.router(flat)
        plan = dispatch(flat, expert_ids, E, capacity=8)                  # 8 tokens: no expert can overflow
        routed = combine(run_experts(layer.experts, plan), plan, weights, 8)
        torch.testing.assert_close(routed, dense_reference(layer, flat[None])[0])


def test_capacity_for() -> None:
    assert capacity_for(n_tokens=64, n_experts=8, top_k=2, capacity_factor=1.0) == 16
    assert capacity_for(n_tokens=64, n_experts=8, top_k=2, capacity_factor=1.25) == 20
    assert capacity_for(n_tokens=10, n_experts=4, top_k=1, capacity_factor=1.0) == 3      # ceil(2.5)
    assert capacity_for(n_tokens=100, n_experts=10, top_k=1, capacity_factor=1.1) == 11   # not 12 from 11.000000002
    assert capacity_for(n_tokens=0, n_experts=4, top_k=2, capacity_factor=2.0) == 0


# ---------------------------------------------------------------- load

def test_expert_and_rank_load_by_hand() -> None:
    ids = torch.tensor([[0, 1], [0, 3], [2, 0], [3, 1]])
    load = expert_load(ids, n_experts=5)
    assert load.tolist() == [3, 2, 1, 2, 0] and load.dtype == torch.long
    assert rank_load(load, [0, 0, 1, 1, 1]).tolist() == [5, 3]
    assert rank_load(load, [1, 0, 1, 0, 0]).tolist() == [4, 4]
    assert rank_load(load, [0, 0, 0, 0, 0], n_ranks=3).tolist() == [8, 0, 0]
    assert contiguous_placement(8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]


# ---------------------------------------------------------------- bad arguments

def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="top_k"):
        Router(D, n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="top_k"):
        MoELayer(D, D_FF, n_experts=2, top_k=3)
    with pytest.raises(ValueError, match="n_shared"):
        MoELayer(D, D_FF, n_experts=2, top_k=1, n_shared=-1)
    x, ids = make_input(0, 2, D), torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="capacity"):
        dispatch(x, ids, 2, capacity=-1)
    with pytest.raises(ValueError, match="expert_ids"):
        dispatch(x, torch.tensor([[0], [2]]), 2, capacity=None)
    with pytest.raises(ValueError, match="placement"):
        rank_load(torch.tensor([1, 2, 3]), [0, 1])
    with pytest.raises(ValueError, match="capacity_factor"):
        capacity_for(8, 2, 1, capacity_factor=0)
    with pytest.raises(ValueError, match="ep_size"):
        contiguous_placement(6, 4)
    with pytest.raises(ValueError, match="d_model"):
        MoELayer(D, D_FF, 2, 1)(make_input(0, 1, 2, D + 1))
    with pytest.raises(ValueError, match="experts"):
        run_experts(nn.ModuleList([Expert(D, D_FF)]), dispatch(x, ids, 2, capacity=None))
