"""Exercise 10: block-scaled FP4, MXFP4 (E2M1 elements, blocks of 32, E8M0 power-of-two scale) and NVFP4 (E2M1
elements, blocks of 16, E4M3 scale, FP32 tensor scale). Every expected value comes from the package's reference
(minigpt.quant.fp4) run here on the same seeded inputs."""

from __future__ import annotations

from typing import Any, Callable

import torch

from autograder.checking.reference_guard import own_work
from autograder.harness import within
from autograder.lab05.common import _FP4, _call, _randn
from minigpt.quant import fp4

EX = "Exercise 10 (FP4: quantize_mxfp4, quantize_nvfp4)"
GRID = torch.tensor(fp4.E2M1_GRID)


def _tensor(x: Any, what: str, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise AssertionError(f"{what}: {name} must be a tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise AssertionError(f"{what}: {name} must have shape {shape}, got {tuple(x.shape)}")
    if dtype is not None and x.dtype != dtype:
        raise AssertionError(f"{what}: {name} must have dtype {dtype}, got {x.dtype}")
    if not torch.isfinite(x.float()).all():
        raise AssertionError(f"{what}: {name} holds NaN or infinite values: an all-zero block has max|w| = 0, so "
                             "log2(0) = -inf or 0 / 0; give such a block zero elements (and the smallest scale)")
    return x


def _elements(got: torch.Tensor, want: torch.Tensor, w: torch.Tensor, scaled: torch.Tensor, what: str) -> None:
    """The elements lie on the E2M1 grid, keep the sign, and equal the reference's (ties to even); `scaled` is w
    divided by the reference's scale, the value each element rounds."""
    g = got.float()
    on_grid = (g.abs()[..., None] == GRID).any(-1)
    if not on_grid.all():
        bad = g[~on_grid][0].item()
        raise AssertionError(f"{what}: element {bad:g} is not an E2M1 value; FP4 E2M1 holds only +-{{0, 0.5, 1, 1.5, "
                             "2, 3, 4, 6}: round w / scale to that grid (and saturate at 6)")
    if (g >= 0).all() and (w < 0).any():
        raise AssertionError(f"{what}: every element is >= 0 although w has negative values: the sign is lost; "
                             "round |w| / scale and put the sign back (torch.copysign)")
    diff = g != want
    if diff.any():
        i = tuple(diff.nonzero()[0].tolist())
        v, a, b = scaled[i].item(), g[i].item(), want[i].item()
        if not within(abs(v), fp4.E2M1_MAX) and abs(a) != fp4.E2M1_MAX:
            hint = "Values above 6 saturate at 6 (E2M1 has no infinity)."
        elif abs(abs(v) - abs(a)) == abs(abs(v) - abs(b)):
            hint = ("That is a tie between two grid values: it goes to the one with an even code (mantissa bit 0): "
                    "0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. torch.round(|x| / step) "
                    "* step does it, with step 0.5 below 2, 1 in [2, 4) and 2 from 4 up.")
        else:
            hint = "Round to the nearest E2M1 value."
        raise AssertionError(f"{what}: at index {i} (w = {w.float()[i].item():.6g}, w / scale = {v:.6g}) your element "
                             f"is {a:g}, expected {b:g} ({int(diff.sum())} of {diff.numel()} elements differ). {hint}")


def _mx_cases() -> list[tuple[str, torch.Tensor]]:
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 0.3, 1.1, 2.2, 4.4])
    row = torch.cat([ties, -ties, torch.tensor([0.0, 6.0, -0.1, 0.6, 3.0, 1.5, 4.0, 2.0])])   # max 7: scale 1
    crafted = torch.stack([row, row * 2 ** -6, row.flip(0) * 2 ** 5, -row])
    w = _randn(6, 128, seed=3) * torch.logspace(-3, 1, 6)[:, None]           # rows of very different ranges
    w[1, 32:64] = 0                                                          # an all-zero block
    w[2, :32] *= 40.0                                                        # one block far above its row
    near_pow2 = _randn(2, 64, seed=9) * 10
    near_pow2[0, 5], near_pow2[1, 40] = 255.0, -127.5     # 2^8 - 1, 2^7 - 0.5: exact in bf16, log2 just below 8, 7
    tiny = _randn(2, 64, seed=10)
    tiny[:, 32:] *= 1e-39                                # max|block| below 2^-125: the exponent clamps at -127
    return [("w (6, 128) float32, rows from 1e-3 to 10, an all-zero block", w),
            ("crafted ties and a value above 6 (scale 1), x2^-6, x2^5, negated", crafted),
            ("w (4, 64) bfloat16", _randn(4, 64, seed=4).bfloat16()),
            ("w (2, 64) bfloat16 whose block maxima (255, -127.5) lie just below a power of two",
             near_pow2.bfloat16()),
            ("w (2, 64) float32 with a block of subnormal values (max|block| < 2^-125)", tiny)]


def _check_mx(fn: Callable) -> None:
    for label, w in _mx_cases():
        what = f"quantize_mxfp4({label})"
        out = _call(_FP4, EX, what, fn, w.clone())
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{what} must return (elements, scales)")
        want_e, want_s = fp4.quantize_mxfp4(w)
        rows, n = w.shape
        if isinstance(out[1], torch.Tensor) and out[1].ndim == 2 and out[1].shape[-1] == n // 16:
            raise AssertionError(f"{what}: scales have {n // 16} columns, one per 16 weights; MXFP4 shares one scale "
                                 f"per block of 32 (expected shape {(rows, n // 32)}); 16 is NVFP4's block")
        elements = _tensor(out[0], what, "elements", (rows, n))
        scales = _tensor(out[1], what, "scales", (rows, n // 32)).double()
        exp = torch.log2(scales.clamp(min=1e-300))
        if (scales <= 0).any() or (exp != exp.round()).any():
            s = scales[(scales <= 0) | (exp != exp.round())][0].item()
            amax = w.double().reshape(rows, -1, 32).abs().amax(-1)
            hint = (" It is max|block| / 6, NVFP4's choice (an E4M3 scale);"
                    if torch.allclose(scales, amax / 6, rtol=1e-2, atol=1e-30) else "")
            raise AssertionError(f"{what}: scale {s:.6g} is not a power of two.{hint} MX stores the shared scale as "
                                 "E8M0, an exponent alone: scale = 2^(floor(log2 max|block|) - 2), where 2 is the "
                                 "exponent of E2M1's largest value 6 = 1.5 * 2^2")
        if not torch.equal(scales, want_s.double()):
            bad = (scales != want_s.double()).nonzero()[0].tolist()
            amax = w.float().reshape(rows, -1, 32).abs().amax(-1)[tuple(bad)].item()
            got_e, want_e2 = int(exp[tuple(bad)].item()), int(torch.log2(want_s[tuple(bad)].double()).item())
            live = w.double().reshape(rows, -1, 32).abs().amax(-1)
            nz = live > 0
            rules = {"ceil": torch.ceil(torch.log2(live / 6)), "no emax": torch.floor(torch.log2(live)),
                     "round": torch.round(torch.log2(live)) - 2}
            hint = ""
            in_own_dtype = torch.floor(torch.log2(w.reshape(rows, -1, 32).abs().amax(-1))).double() - 2
            if w.dtype != torch.float32 and torch.equal(exp[nz], in_own_dtype[nz]):
                hint = (f" log2 in {str(w.dtype).removeprefix('torch.')} rounds up to the next integer for maxima "
                        "just below a power of two: compute the block maxima and log2 in float32 (w.float()).")
            elif live[tuple(bad)] < 2.0 ** -125:
                hint = " E8M0's smallest scale is 2^-127: clamp the exponent to [-127, 127]."
            elif torch.equal(exp[nz], rules["ceil"][nz]):
                hint = (" You rounded max|block| / 6 up to a power of two (no element saturates); the spec takes "
                        "floor(log2 max|block|) - 2, which maps max|block| into [4, 8) and lets values above 6 "
                        "saturate.")
            elif torch.equal(exp[nz], rules["no emax"][nz]):
                hint = " You forgot to subtract E2M1's emax (2): the exponent is floor(log2 max|block|) - 2."
            elif torch.equal(exp[nz], rules["round"][nz]):
                hint = " Round log2(max|block|) down (floor), not to nearest."
            raise AssertionError(f"{what}: block {tuple(bad)} (max|block| = {amax:.6g}) has scale 2^{got_e}, "
                                 f"expected 2^{want_e2}.{hint}")
        scaled = w.double().reshape(rows, -1, 32) / want_s.double()[..., None]
        _elements(elements, want_e, w, scaled.reshape(rows, n), what)


def _nv_cases() -> list[tuple[str, torch.Tensor]]:
    w = _randn(6, 64, seed=5) * torch.logspace(-2, 1, 6)[:, None]
    w[3, 16:32] = 0
    return [("w (6, 64) float32, rows from 1e-2 to 10, an all-zero block", w),
            ("w (4, 48) bfloat16", _randn(4, 48, seed=6).bfloat16()),
            ("w (2, 32) float32 of one tiny block beside large ones", torch.cat([_randn(2, 16, seed=7) * 1e-3,
                                                                                _randn(2, 16, seed=8) * 50], 1)),
            ("w (2, 32) float32: a block of 1e6 beside one of about 1, whose E4M3 scale rounds to 0",
             torch.cat([_randn(2, 16, seed=11) * 1e6, _randn(2, 16, seed=12)], 1))]


def _check_nv(fn: Callable) -> None:
    for label, w in _nv_cases():
        what = f"quantize_nvfp4({label})"
        out = _call(_FP4, EX, what, fn, w.clone())
        if not (isinstance(out, tuple) and len(out) == 3):
            raise AssertionError(f"{what} must return (elements, block_scales, tensor_scale)")
        want_e, want_b, want_t = fp4.quantize_nvfp4(w)
        rows, n = w.shape
        if isinstance(out[1], torch.Tensor) and out[1].ndim == 2 and out[1].shape[-1] == n // 32:
            raise AssertionError(f"{what}: block scales have {n // 32} columns, one per 32 weights; NVFP4 shares one "
                                 f"scale per block of 16 (expected shape {(rows, n // 16)}); 32 is MX's block")
        elements = _tensor(out[0], what, "elements", (rows, n))
        blocks = _tensor(out[1], what, "block_scales", (rows, n // 16), torch.float8_e4m3fn)
        t = out[2]
        if not isinstance(t, torch.Tensor) or t.numel() != 1 or t.dtype != torch.float32:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise AssertionError(f"{what}: tensor_scale must be a one-element float32 tensor, got {got}")
        if not torch.isclose(t.reshape(1).double(), want_t.double(), rtol=1e-6).all():
            hint = (" A tensor scale of 1 leaves the E4M3 block scales to cover the weights' range alone: small "
                    "blocks underflow." if t.item() == 1.0 else "")
            raise AssertionError(f"{what}: tensor_scale {t.item():.6g}, expected max|w| / (6 * 448) = "
                                 f"{want_t.item():.6g}, so the largest block scale lands on E4M3's max.{hint}")
        if not torch.equal(blocks.float(), want_b.float()):
            bad = tuple((blocks.float() != want_b.float()).nonzero()[0].tolist())
            amax = w.float().reshape(rows, -1, 16).abs().amax(-1)[bad].item()
            got_s, want_s = blocks.float()[bad].item(), want_b.float()[bad].item()
            hint = ""
            if got_s > 0 and within(torch.log2(torch.tensor(got_s)).item() % 1, 1e-9) and want_s > 0 and got_s != want_s:
                hint = " That is a power of two (MX's rule); NVFP4's E4M3 scale is max|block| / (6 * tensor_scale), cast."
            elif want_s > 0 and within(abs(got_s / want_s - 6 / 4), 0.1):
                hint = " Divide by 6, E2M1's largest value, not 4."
            raise AssertionError(f"{what}: block {bad} (max|block| = {amax:.6g}) has block scale {got_s:g}, expected "
                                 f"e4m3(max|block| / (6 * tensor_scale)) = {want_s:g}.{hint}")
        dead = (want_b.float() == 0)[..., None].expand(rows, n // 16, 16).reshape(rows, n)
        if (elements.float()[dead] != 0).any():
            raise AssertionError(f"{what}: a block whose E4M3 scale rounds to 0 (max|block| far below the tensor's "
                                 "max) must give zero elements; you divided it by another denominator instead.")
        scaled = w.double().reshape(rows, -1, 16) / (want_b.double()[..., None] * want_t.double()).clamp(min=1e-300)
        _elements(elements, want_e, w, scaled.reshape(rows, n), what)


def check_fp4_quantize(quantize_mxfp4: Callable, quantize_nvfp4: Callable) -> None:
    """quantize_mxfp4(w (rows, n)) -> (elements (rows, n), scales (rows, n / 32) float32 powers of two) and
    quantize_nvfp4(w) -> (elements, block_scales (rows, n / 16) float8_e4m3fn, tensor_scale (1,) float32), each
    equal to the reference's on seeded inputs: crafted ties, values above 6, negative values, all-zero blocks,
    bf16 input."""
    own_work(quantize_mxfp4, _FP4, what=EX)
    own_work(quantize_nvfp4, _FP4, what=EX)
    _check_mx(quantize_mxfp4)
    _check_nv(quantize_nvfp4)
