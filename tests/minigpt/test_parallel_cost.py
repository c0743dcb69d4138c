"""The tensor/pipeline-parallel cost model (lab 07): hand-checked figures and invariants."""

from __future__ import annotations

import pytest

from minigpt.costmodel import calculators as calc
from minigpt.costmodel.calculators import PRESETS
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.parallel_cost import (INTERCONNECTS, gpu_kv_bytes, gpu_weight_bytes, parallel_plan, pcie_bandwidth,
                                            pipeline_bubble_fraction, ring_allreduce_time, tp_allreduce_bytes_per_token)

L70 = PRESETS["Llama-3-70B"]
H100 = ACCELERATORS["H100-SXM"]
NVLINK, PCIE = INTERCONNECTS["NVLink 4"], INTERCONNECTS["PCIe Gen5 x16"]


def test_link_figures() -> None:
    assert pcie_bandwidth(32, 16) == pytest.approx(63.015e9, rel=1e-4)
    assert NVLINK.bandwidth == 450e9


def test_allreduce_bytes_formula() -> None:
    assert tp_allreduce_bytes_per_token(L70, 8, 2, wire=False) == 2 * 80 * 8192 * 2
    assert tp_allreduce_bytes_per_token(L70, 8, 2) == 2 * 80 * 8192 * 2 * 14 / 8
    assert tp_allreduce_bytes_per_token(L70, 2, 2) == 2 * 80 * 8192 * 2          # ring factor 1 at n = 2
    assert tp_allreduce_bytes_per_token(L70, 1, 2) == 0


def test_ring_time_and_bubble() -> None:
    assert ring_allreduce_time(1e6, 1, PCIE) == 0
    assert ring_allreduce_time(800, 4, PCIE) == pytest.approx(6 * PCIE.step_latency_s + 1.5 * 800 / PCIE.bandwidth)
    assert pipeline_bubble_fraction(8, 8) == pytest.approx(7 / 15)
    assert pipeline_bubble_fraction(1, 3) == 0
    with pytest.raises(ValueError):
        pipeline_bubble_fraction(0, 1)


def test_weights_split_sums_back_to_the_model() -> None:
    total = calc.weight_bytes(L70, 2)
    assert gpu_weight_bytes(L70, 1) == total
    # tp = 8 == n_kv_heads: nothing replicated but the norms (2 per layer + final, d_model each)
    replicated = (2 * L70.n_layers + 1) * L70.d_model * 2
    assert gpu_weight_bytes(L70, 8) * 8 - 7 * replicated == total


def test_kv_replication_costs_memory() -> None:
    assert gpu_kv_bytes(L70, 8, 1, 1000, 1) == calc.kv_cache_bytes(L70, 1000, 1, 2) // 8
    mqa = PRESETS["Llama-3-8B-MQA (hypothetical)"]
    assert gpu_kv_bytes(mqa, 8, 1, 1000, 1) == calc.kv_cache_bytes(mqa, 1000, 1, 2)      # every GPU a full copy


def test_plan_shape_of_the_answer() -> None:
    plans = {tp: parallel_plan(L70, H100, NVLINK, tp=tp) for tp in (1, 2, 4, 8)}
    assert not plans[1].fits and plans[8].fits
    assert plans[1].tp_comm_s == 0
    times = [plans[tp].time_per_token_s for tp in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True)                     # NVLink: TP keeps paying up to 8
    overlapped = parallel_plan(L70, H100, NVLINK, tp=8, overlap=True)
    assert overlapped.time_per_token_s == pytest.approx(max(plans[8].compute_s, plans[8].tp_comm_s))
    pcie = {tp: parallel_plan(L70, H100, PCIE, tp=tp).time_per_token_s for tp in (4, 8)}
    assert pcie[8] > plans[8].time_per_token_s


def test_pipeline_adds_latency_not_speed() -> None:
    tp8 = parallel_plan(L70, H100, NVLINK, tp=8)
    pp8 = parallel_plan(L70, H100, NVLINK, tp=1, pp=8)
    assert pp8.time_per_token_s > tp8.time_per_token_s
    assert pp8.pp_bytes_per_token == 7 * 8192 * 2 and pp8.tp_bytes_per_token == 0


@pytest.mark.parametrize("tp, pp", [(3, 1), (5, 1), (1, 3)])
def test_bad_splits_are_refused(tp: int, pp: int) -> None:
    with pytest.raises(ValueError):
        parallel_plan(L70, H100, NVLINK, tp=tp, pp=pp)


def test_planner_readout_and_widget() -> None:
    from minigpt.teaching.parallel_planner import ParallelismPlanner, planner_readout

    plan = parallel_plan(L70, H100, NVLINK, tp=8)
    text = planner_readout(L70, H100, NVLINK, 8, plan, 4096, 1)
    assert "4,587,520 bytes" in text and "fits" in text
    with pytest.raises(ValueError, match="TP x PP"):
        planner_readout(L70, H100, NVLINK, 4, plan, 4096, 1)
    w = ParallelismPlanner()
    assert w.image.value and not w.error.value
    w.tp.value = 4
    assert "TP x PP" in w.error.value
    w.n_gpus.value = 4
    assert not w.error.value and "TP=4" in w.readout.value
