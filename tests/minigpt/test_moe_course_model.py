"""The course MoE (lab 11): the target's MLPs cut into experts whose sum is the dense MLP, the stored routers, real
routing that is not uniform, and a card that matches the files."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from minigpt.checkpoint import load_card, load_model, sha256_file
from minigpt.moe.course_model import (SlicedMoE, dense_mlps, load_course_moe, router_paths, routing_statistics,
                                      slice_mlp)
from minigpt.moe.eplb import eplb_placement, rank_loads
from minigpt.moe.expert_parallel import ep_moe_forward, moe_forward
from minigpt.moe.layer import contiguous_placement
from minigpt.parallel.launch import run_ranks
from minigpt.training.data import eval_windows, load_tokens


@pytest.fixture(scope="module")
def card() -> dict:
    return json.loads(router_paths()[1].read_text())


@pytest.fixture(scope="module")
def moe_model():
    return load_course_moe()


@pytest.fixture(scope="module")
def val_tokens() -> torch.Tensor:
    return eval_windows(load_tokens("val"), 128, max_windows=16)[0]


def hidden(seed: int, n: int = 40, d: int = 384) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the cut

@pytest.mark.parametrize("n_experts", [4, 16])
def test_the_sum_of_all_experts_is_the_dense_mlp(n_experts: int) -> None:
    target = load_model("target")
    x = hidden(0)
    for i, block in enumerate(target.layers):
        with torch.no_grad():
            parts = sum(part(x) for part in slice_mlp(block.mlp, n_experts))
            torch.testing.assert_close(parts, block.mlp(x), msg=lambda m: f"layer {i}: {m}")


def test_an_expert_is_top_k_times_its_part(moe_model) -> None:
    moe = moe_model.layers[0].mlp
    x = hidden(1)
    with torch.no_grad():
        for expert, part in zip(moe.experts, moe.parts):
            assert torch.equal(expert(x), moe.top_k * part(x))       # k is a power of two: exact


def test_dense_mode_is_the_target(moe_model, val_tokens) -> None:
    target = load_model("target")
    with torch.no_grad(), dense_mlps(moe_model):
        torch.testing.assert_close(moe_model(val_tokens[:2]), target(val_tokens[:2]), atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- the stored routers

def test_loading_puts_the_stored_routers_in_place(moe_model, card) -> None:
    state = load_file(str(router_paths()[0]))
    assert sorted(state) == [f"layers.{i}.router.weight" for i in range(moe_model.config.n_layers)]
    for i, block in enumerate(moe_model.layers):
        assert isinstance(block.mlp, SlicedMoE)
        assert torch.equal(block.mlp.router.gate.weight, state[f"layers.{i}.router.weight"])
        assert block.mlp.router.gate.weight.shape == (card["n_experts"], moe_model.config.d_model)


def test_each_layer_is_usable_through_moe_forward_and_ep(moe_model) -> None:
    moe = moe_model.layers[2].mlp
    xs = [hidden(2, 24), hidden(3, 17)]
    placement = contiguous_placement(moe.n_experts, 2)

    def worker(comm):
        mine = {e: moe.experts[e] for e, r in enumerate(placement) if r == comm.rank}
        with torch.no_grad():
            return ep_moe_forward(xs[comm.rank], moe.probabilities, mine, comm, placement, moe.top_k, None)[0]

    for x, y in zip(xs, run_ranks(worker, 2, backend="threads")):
        with torch.no_grad():
            torch.testing.assert_close(moe_forward(x, moe.probabilities, moe.experts, moe.top_k), moe(x[None])[0])
            torch.testing.assert_close(y, moe(x[None])[0])


def test_the_router_file_is_small(card) -> None:
    assert router_paths()[0].stat().st_size < 1_000_000


# ---------------------------------------------------------------- routing

def test_routing_is_not_uniform(moe_model, val_tokens, card) -> None:
    loads = routing_statistics(moe_model, val_tokens)
    k, n_tokens = card["top_k"], val_tokens.numel()
    assert loads.shape == (moe_model.config.n_layers, card["n_experts"])
    assert (loads.sum(dim=1) == n_tokens * k).all()
    ratios = (loads.double().max(dim=1).values / loads.double().mean(dim=1)).tolist()
    assert max(ratios) > 1.3, f"expected a hot expert in some layer, max/mean per layer {ratios}"
    assert sum(r > 1.15 for r in ratios) >= len(ratios) // 2, f"most layers should be skewed: {ratios}"


def test_eplb_balances_the_real_routing(card) -> None:
    """The card's validation loads: with 4 ranks, one spare slot each, the slowest rank is no slower in any layer."""
    for i, counts in enumerate(card["expert_load_validation"]["counts"]):
        before = rank_loads(counts, [list(range(r * 4, r * 4 + 4)) for r in range(4)]).max()
        after = rank_loads(counts, eplb_placement(counts, 4, card["n_experts"] // 4 + 1)).max()
        assert after <= before, f"layer {i}: slowest rank {float(after):.0f} after EPLB, {float(before):.0f} before"


# ---------------------------------------------------------------- the card

def test_card_matches_the_files(card) -> None:
    weights, _ = router_paths()
    assert card["sha256"] == sha256_file(weights) and card["bytes"] == weights.stat().st_size
    assert card["base_sha256"] == load_card("target")["sha256"]
    assert card["n_experts"] * card["expert_d_ff"] == load_card("target")["config"]["d_ff"]
    counts = torch.tensor(card["expert_load_validation"]["counts"])
    assert (counts.sum(dim=1) == card["validation"]["tokens"] * card["top_k"]).all()


def test_card_figures_say_the_moe_is_close_to_dense_and_far_from_random(card) -> None:
    v = card["validation"]
    assert v["perplexity_dense"] == pytest.approx(load_card("target")["validation"]["perplexity"], rel=1e-3)
    assert v["perplexity_dense"] < v["perplexity_moe"] < 1.35 * v["perplexity_dense"], v
    assert v["perplexity_random_router"] > 1.5 * v["perplexity_moe"], v


def test_measured_perplexities_keep_the_cards_order(moe_model) -> None:
    """A few validation windows: dense < trained router (within 35%) < random router."""
    from minigpt.moe.course_model import random_routers
    from minigpt.training.evaluate import validation_loss

    with dense_mlps(moe_model):
        dense = validation_loss(moe_model, max_windows=4)["perplexity"]
    moe = validation_loss(moe_model, max_windows=4)["perplexity"]
    fresh = load_course_moe()
    random_routers(fresh, 0)
    random = validation_loss(fresh, max_windows=4)["perplexity"]
    assert dense < moe < 1.35 * dense < random, (dense, moe, random)
