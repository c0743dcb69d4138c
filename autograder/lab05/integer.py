"""Exercises 1 and 2: symmetric INT8/INT4 quantization (also end to end on the trained model) and INT4 packing."""

from __future__ import annotations

from typing import Callable

import torch

from autograder.harness import quiet, within
from autograder.harness import expect_value_error
from autograder.lab05.common import EX1, _INT_QUANT, _PACKING, _call, _randn
from autograder.checking.reference_guard import own_work
from minigpt.quant import formats
from minigpt.quant.formats import dequantize, quantize, unpack_int4


def check_quantize_symmetric(fn: Callable) -> None:
    """fn(w (out, in), bits, group_size=None) -> (q int8 (out, in), scale float (out, n_groups)) with
    s = max|w_group| / (2^(bits-1) - 1) and q = clamp(round(w / s), -qmax, qmax); n_groups = 1 when group_size is None."""
    own_work(fn, _INT_QUANT, what=EX1)
    cases = [(8, None, (12, 64), torch.float32), (8, 16, (12, 64), torch.float32), (4, None, (10, 32), torch.float32),
             (4, 8, (6, 48), torch.float32), (4, 16, (16, 64), torch.float32), (8, 16, (8, 64), torch.bfloat16),
             (4, None, (6, 32), torch.float16), (2, 8, (6, 32), torch.float32), (3, None, (6, 32), torch.float32),
             (8, 1, (4, 16), torch.float32)]
    for i, (bits, group, shape, dtype) in enumerate(cases):
        w = (_randn(*shape, seed=i) * (1 + torch.arange(shape[0])[:, None])).to(dtype)  # rows of different ranges
        w[1] = 0                                    # a dead output channel: scale 0 must not make NaN codes
        w[2, :group or shape[1]] = 0                # ... and a dead group
        what = f"quantize_symmetric(w {shape} {str(dtype)[6:]} with an all-zero row, bits={bits}, group_size={group})"
        out = _call(_INT_QUANT, EX1, what, fn, w.clone(), bits, group)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{what} must return a tuple (q, scale), got {type(out).__name__}")
        q, scale = out
        ref = quantize(w, bits, group_size=group)
        qmax = 2 ** (bits - 1) - 1
        if isinstance(scale, torch.Tensor) and (not torch.isfinite(scale).all() or (isinstance(q, torch.Tensor) and
                                                                                  q.is_floating_point() and
                                                                                  not torch.isfinite(q).all())):
            raise AssertionError(f"{what}: non-finite scales or codes: an all-zero row (or group) has max|w| = 0; "
                                 "clamp the scale to a tiny positive value (e.g. 1e-12) so its codes are 0")
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != shape:
            raise AssertionError(f"{what}: q must be a tensor of the weight's shape {shape}, got "
                                 f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        if q.is_floating_point():
            raise AssertionError(f"{what}: q must hold integers (torch.int8), got {q.dtype}")
        if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != tuple(ref.scale.shape):
            got = tuple(scale.shape) if isinstance(scale, torch.Tensor) else type(scale).__name__
            hint = (" Groups run along the input axis: one scale per (row, group of group_size columns)."
                    if group is not None else " One scale per output channel (row).")
            raise AssertionError(f"{what}: scale must have shape {tuple(ref.scale.shape)} (out, n_groups), got {got}.{hint}")
        if int(q.min()) < -qmax or int(q.max()) > qmax:
            raise AssertionError(f"{what}: codes must lie in [-{qmax}, {qmax}], got [{int(q.min())}, {int(q.max())}]. "
                                 f"Symmetric quantization does not use -{qmax + 1}: the grid is symmetric around 0.")
        if scale.dtype != torch.float32:
            raise AssertionError(f"{what}: scales must be float32 whatever the weight's dtype, got {scale.dtype}: "
                                 "compute them from w.float()")
        if not torch.allclose(scale.float(), ref.scale, rtol=1e-5, atol=1e-12):
            r = (scale.float() / ref.scale).median().item()
            hint = ""
            if within(abs(r - qmax / (qmax + 1)), 1e-3):
                hint = (f" Your scale is max|w| / {qmax + 1}: then max|w| maps to {qmax + 1}, which the clamp cuts to "
                        f"{qmax}. Divide by {qmax}.")
            elif r < 0.7:
                hint = " Your scale is too small: it must come from the absolute maximum of the group, not its mean."
            elif group is not None:
                hint = " Compute one scale per row and per group of group_size consecutive inputs (w.view(out, -1, group_size))."
            raise AssertionError(f"{what}: scales differ from max|w| / {qmax} (median ratio {r:.4f}).{hint}")
        deq = (q.float().view(shape[0], -1, group or shape[1]) * scale.float()[..., None]).view(shape)
        mismatched = (q.to(torch.int16) != ref.q.to(torch.int16)).float().mean()
        if not within(mismatched, 1e-3) or not within((deq - dequantize(ref)).abs(), ref.scale.max()):
            raise AssertionError(f"{what}: the codes differ from round(w / scale): use round-to-nearest and clamp to "
                                 f"[-{qmax}, {qmax}] with each element divided by its own group's scale")
    w = _randn(4, 32)
    expect_value_error("bits=5 (unsupported)", fn, w, 5, None, naming=("5",))
    expect_value_error("group_size=12 with 32 input features (does not divide)", fn, w, 4, 12, naming=("12",))
    expect_value_error("group_size=0", fn, w, 4, 0, hint=" (a group holds at least one input)")
    bad = w.clone()
    bad[1, 2] = float("nan")
    expect_value_error("a weight with a NaN", fn, bad, 8, None, naming=("nan",))


def check_int4_model_perplexity(fn: Callable, *, n_windows: int = 2, seq_len: int = 128, max_excess: float = 0.005) -> dict[str, float]:
    """End to end: every projection of the trained target replaced by fn's INT4 codes * scales (groups of 128);
    the validation perplexity on seeded windows must be within `max_excess` (relative) of the reference RTN model's."""
    from minigpt.checkpoint import load_model
    from minigpt.quant.linear import quantize_linears, quantize_weight_only
    from minigpt.quant.quality import perplexity, validation_subset

    def make(name: str, w: torch.Tensor) -> torch.nn.Module:
        q, scale = _call(_INT_QUANT, EX1, f"quantize_symmetric({name}, bits=4, group_size=128)", fn, w.clone(), 4, 128)
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_((q.float().view(w.shape[0], -1, 128) * scale.float()[..., None]).view(w.shape))
        return lin

    own_work(fn, _INT_QUANT, what=EX1)
    with quiet():
        model = load_model("target").eval()
    learner_model = quantize_linears(model, make)            # the learner's function runs first: a stub fails fast
    with quiet():
        x, y = validation_subset(n_windows, seq_len, seed=1)
        got = perplexity(learner_model, x, y)
        ref = perplexity(quantize_weight_only(model, 4, 128), x, y)
        base = perplexity(model, x, y)
    if not within(got, ref * (1 + max_excess)):
        raise AssertionError(f"the target with your INT4 g128 weights has perplexity {got:.3f} on {x.numel()} validation "
                             f"tokens; the reference round-to-nearest reaches {ref:.3f} (fp32 {base:.3f}), and at most "
                             f"{ref * (1 + max_excess):.3f} is accepted. Check the scale (absolute maximum / 7) and the clamp.")
    return {"perplexity": got, "reference": ref, "fp32": base}


def check_int4_packing(pack: Callable, unpack: Callable) -> None:
    """pack(q int8 (..., n) in [-8, 7]) -> uint8 (..., n/2), element 2j in the low nibble, 2j+1 in the high;
    unpack(packed) -> int8 (..., n), sign-extended."""
    ex = "Exercise 2 (pack_int4, unpack_int4)"
    own_work(pack, _PACKING, what=ex)
    own_work(unpack, _PACKING, what=ex)
    q = torch.randint(-8, 8, (5, 16), generator=torch.Generator().manual_seed(0), dtype=torch.int64).to(torch.int8)
    q[0, :4] = torch.tensor([1, 2, -1, -8], dtype=torch.int8)
    packed = _call(_PACKING, ex, "pack_int4", pack, q.clone())
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or tuple(packed.shape) != (5, 8):
        got = f"{packed.dtype} {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise AssertionError(f"pack_int4 of int8 (5, 16) must return uint8 (5, 8), two codes per byte; got {got}")
    first = int(packed[0, 0])
    if first != 0x21:
        hint = " The nibbles are in the wrong order: element 2j goes in the LOW nibble, 2j+1 in the high." \
            if first == 0x12 else " Keep the low 4 bits of each code (q & 0xF), the even element in bits 0-3."
        raise AssertionError(f"pack_int4([1, 2, ...]) must start with byte 0x21 (1 | 2 << 4), got {first:#04x}.{hint}")
    if int(packed[0, 1]) != 0x8F:
        raise AssertionError(f"pack_int4([.., .., -1, -8]) must give byte 0x8f (-1 -> 0xf low, -8 -> 0x8 high), "
                             f"got {int(packed[0, 1]):#04x}: store each code's two's-complement low nibble (q & 0xF)")
    if not torch.equal(unpack_int4(packed), q):
        raise AssertionError("your packed bytes do not unpack to the original codes with the reference layout")
    out = _call(_PACKING, ex, "unpack_int4", unpack, formats.pack_int4(q))
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (5, 16):
        raise AssertionError(f"unpack_int4 of uint8 (5, 8) must return (5, 16) codes, got "
                             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    if not torch.equal(out.to(torch.int16), q.to(torch.int16)):
        neg = (q < 0) & (out.to(torch.int16) == (q.to(torch.int16) & 0xF))
        hint = " Negative codes come back as 8..15: sign-extend the nibble ((n ^ 8) - 8)." if neg.any() else \
            " Element 2j is the low nibble (b & 0xF), 2j+1 the high one (b >> 4)."
        raise AssertionError(f"unpack_int4 does not recover the codes.{hint}")
