"""minigpt.quant.fp4: E2M1 rounding (nearest, ties to even, saturating), the MX shared-exponent rule, NVFP4's two
scales, all-zero blocks, and the bits per weight of both formats."""

from __future__ import annotations

import pytest
import torch

from minigpt.quant import fp4


def _e2m1_from_bits() -> list[float]:
    """Every E2M1 magnitude from its bit layout: bias 1, one mantissa bit, no special encodings."""
    values = set()
    for exp_field in range(4):
        for man in range(2):
            values.add(2.0 ** 0 * man / 2 if exp_field == 0 else 2.0 ** (exp_field - 1) * (1 + man / 2))
    return sorted(values)


def test_the_grid_is_the_bit_layouts():
    assert list(fp4.E2M1_GRID) == _e2m1_from_bits()
    assert fp4.E2M1_MAX == max(_e2m1_from_bits()) == 1.5 * 2 ** fp4.E2M1_EMAX


def test_rounding_is_nearest_ties_to_even_and_saturates():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, 0.26, 2.49, 4.9, -0.75, -5.0, -7.0])
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 0.5, 2.0, 4.0, -1.0, -4.0, -6.0]
    assert fp4.round_to_e2m1(x).tolist() == want


def test_rounding_picks_a_nearest_grid_value():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3
    q = fp4.round_to_e2m1(x)
    grid = torch.tensor(fp4.E2M1_GRID)
    signed = torch.cat([-grid, grid])
    nearest = (x.clamp(-6, 6)[:, None] - signed).abs().amin(1)
    assert torch.allclose((x.clamp(-6, 6) - q).abs(), nearest)


def test_mx_scale_is_the_spec_power_of_two():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 256, generator=g) * torch.logspace(-4, 2, 8)[:, None]
    elements, scales = fp4.quantize_mxfp4(w)
    amax = w.reshape(8, -1, 32).abs().amax(-1)
    assert scales.shape == (8, 8)
    assert torch.equal(scales, torch.exp2(torch.floor(torch.log2(amax)) - 2))
    ratio = amax / scales                                   # max|block| lands in [4, 8) after the division
    assert bool(((ratio >= 4) & (ratio < 8)).all())
    assert torch.equal(fp4.dequantize_mxfp4(elements, scales).reshape(8, -1, 32),
                       fp4.round_to_e2m1(w.reshape(8, -1, 32) / scales[..., None]) * scales[..., None])


def test_nvfp4_scales():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, 64, generator=g) * 0.05
    elements, block_scales, tensor_scale = fp4.quantize_nvfp4(w)
    assert block_scales.dtype == torch.float8_e4m3fn and block_scales.shape == (4, 4)
    assert torch.allclose(tensor_scale, w.abs().amax().reshape(1) / (6 * 448))
    assert block_scales.float().max().item() == 448.0      # the largest block lands on E4M3's max
    err = (fp4.dequantize_nvfp4(elements, block_scales, tensor_scale) - w).norm() / w.norm()
    assert err < 0.15


@pytest.mark.parametrize("quantize, dequantize", [(fp4.quantize_mxfp4, fp4.dequantize_mxfp4),
                                                  (fp4.quantize_nvfp4, fp4.dequantize_nvfp4)])
def test_all_zero_blocks_and_tensors_give_zeros(quantize, dequantize):
    w = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    w[0, :32] = 0
    for x in (w, torch.zeros(2, 64)):
        out = quantize(x)
        back = dequantize(*out)
        assert all(torch.isfinite(t.float()).all() for t in out)
        assert torch.isfinite(back).all() and bool((back[x == 0] == 0).all())


def test_bad_shapes_and_values_are_refused():
    with pytest.raises(ValueError, match="multiple of the block size 32"):
        fp4.quantize_mxfp4(torch.ones(2, 48))
    with pytest.raises(ValueError, match="NaN"):
        fp4.quantize_nvfp4(torch.full((1, 16), float("nan")))


def test_bits_per_weight():
    assert fp4.bits_per_weight(fp4.MX_BLOCK) == 4.25
    assert fp4.bits_per_weight(fp4.NV_BLOCK) == 4.5
