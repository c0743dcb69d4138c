"""minigpt.costmodel.hardware: the accelerator table is consistent, the measurements return sane numbers (small sizes)."""

import math

import pytest
import torch

from minigpt.costmodel.hardware import (ACCELERATORS, THIS_MACHINE, Accelerator, get_accelerator, measure_copy_bandwidth,
                              measure_matmul_rate, this_machine)

EXPECTED = {"A100-SXM-80GB", "H100-SXM", "H100-PCIe", "H200", "L4", "T4", "RTX-4090"}


def test_table_has_the_common_accelerators():
    assert EXPECTED <= set(ACCELERATORS)
    for name, g in ACCELERATORS.items():
        assert g.name == name
        assert g.source and not g.measured


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_figures_are_in_plausible_ranges(name):
    g = ACCELERATORS[name]
    assert 50e12 <= g.peak("bf16") <= 2e15, "dense bf16 tensor FLOP/s"
    assert 100e9 <= g.memory_bandwidth <= 10e12, "bytes/s"
    assert 8e9 <= g.memory_bytes <= 200e9
    assert isinstance(g.memory_bytes, int)
    for p, v in g.peak_flops.items():
        assert v > 0 and math.isfinite(v), p
    # Lower precision is never slower than bf16 on tensor cores.
    for p in ("fp8", "int8"):
        if p in g.peak_flops:
            assert g.peak(p) >= g.peak("bf16")


def test_dense_not_sparse_figures():
    # Datasheets print sparsity figures; the table must hold half of them.
    assert ACCELERATORS["H100-SXM"].peak("bf16") == pytest.approx(989.5e12)
    assert ACCELERATORS["H100-SXM"].peak("fp8") == pytest.approx(1979e12)
    assert ACCELERATORS["A100-SXM-80GB"].peak("bf16") == pytest.approx(312e12)
    assert ACCELERATORS["L4"].peak("bf16") == pytest.approx(121e12)
    assert ACCELERATORS["H200"].peak("bf16") == ACCELERATORS["H100-SXM"].peak("bf16")
    assert ACCELERATORS["H200"].memory_bandwidth > ACCELERATORS["H100-SXM"].memory_bandwidth


def test_t4_has_no_bf16_and_says_so():
    t4 = ACCELERATORS["T4"]
    assert "bf16" not in t4.peak_flops
    assert t4.peak("bf16") == t4.peak("fp16") == 65e12
    assert "bf16" in t4.notes and "bf16" in t4.precisions()


def test_missing_precision_raises_clearly():
    with pytest.raises(KeyError, match="fp8"):
        ACCELERATORS["A100-SXM-80GB"].peak("fp8")
    with pytest.raises(KeyError, match="unknown accelerator"):
        get_accelerator("H900")


def test_ridge_point():
    g = ACCELERATORS["H100-SXM"]
    assert g.ridge_point("bf16") == pytest.approx(989.5e12 / 3.35e12)


def test_copy_bandwidth_small():
    bw = measure_copy_bandwidth(4 * 2**20, repeats=2)
    assert 1e8 < bw < 1e13


def test_matmul_rate_small():
    assert 1e7 < measure_matmul_rate(128, torch.float32, repeats=2) < 1e15
    assert 1e6 < measure_matmul_rate(64, torch.bfloat16, repeats=2) < 1e15


def test_measurements_reject_bad_sizes():
    with pytest.raises(ValueError):
        measure_copy_bandwidth(0)
    with pytest.raises(ValueError):
        measure_matmul_rate(0)


def test_this_machine_is_an_accelerator():
    here = this_machine(copy_bytes=4 * 2**20, matmul_n=128, repeats=2)
    assert isinstance(here, Accelerator)
    assert here.name == THIS_MACHINE and here.measured
    assert set(here.peak_flops) == {"fp32", "bf16"}
    assert here.memory_bandwidth > 0 and here.memory_bytes > 0
    assert here.ridge_point("fp32") > 0


@pytest.mark.parametrize("device_name, entry", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"), ("NVIDIA A100 80GB PCIe", None),
    ("NVIDIA A100-SXM4-40GB", None), ("NVIDIA L4", "L4"), ("Tesla T4", "T4"), ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA L40S", None), ("NVIDIA B200", None)])
def test_a_device_name_finds_its_own_datasheet_column(device_name, entry):
    from minigpt.costmodel.hardware import ACCELERATORS, device_accelerator
    assert device_accelerator(device_name) is (ACCELERATORS[entry] if entry else None)
