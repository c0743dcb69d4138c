"""Lab 05's contracts (quantization): the differential tests that show a mutant equivalent.

Every input is drawn as a small plain spec (sizes, dtype names, seeds, flags) and made into tensors inside `run`, so
the input a split prints is short and readable. Each `run` returns (what the call gave, the inputs after the call):
no exercise may modify what it is handed. Results are compared exactly (equivalence.same_result): values, dtypes,
shapes and devices; the meta device stands for "not the CPU" where an exercise is device-agnostic.

ex1_code  quantize_symmetric(w, bits, group_size): w (out, in) float32 / float16 / bfloat16, any out >= 1 and in >= 1,
          bits 2, 3, 4, 8, group_size None or any divisor of in (1, in itself), all-zero rows and groups, magnitudes
          from 1e-30 to 1e30, exact half-step ties; refused: other bits, a group size that does not divide in (0,
          negative, larger than in), NaN, +inf, -inf. A ValueError must name the problem: compared is the exception's
          type and which of the offending value's spellings (bits, group_size, "nan", "inf") its message holds, case
          ignored (the check's `naming`).
ex2_code  pack_int4(q) and unpack_int4(packed) (both, through pack_int4's globals): q int8 (..., n), n even (0 too),
          values in [-8, 7], 1 to 3 dimensions, transposed and strided views, the meta device; packed any uint8.
ex3_code  quantize_fp8(x, fmt): x of any shape (a single element, 1 to 3 dimensions) in float32 / float16 /
          bfloat16, magnitudes from subnormal to near the dtype's max, all zeros, fmt "e4m3" or "e5m2" (another
          fmt: the same exception), the meta device.
ex4_code  gptq(w, H, bits, group_size, block_size): w (out, n) float64 or float32, H = 2 X^T X / N of correlated
          inputs with outlier and dead channels (float64 or float32), bits 2, 3, 4, 8, any group size dividing n (1,
          n), any block size (1, not dividing n, larger than n), out from 1.
ex7_code  Int8LayerKVCache(B, S, Hkv, D) and a run of update(k, v) calls: every B, S, Hkv, D from 1, writes of 1 to S
          positions in float32 / float16 / bfloat16, heads of very different ranges, all-zero tokens, a write past
          S (an overflow: the exception's type is compared, then the buffers and length it left, and later writes
          go on).
          Compared: every update's result, the buffers, scales and length after each, the inputs after.
ex8_code  make_int4_linear(weight, group_size) and the function it returns, on x (M, K): N a multiple of 16 and
          group_size 32, 64, 128 or 256 (what PyTorch's CPU INT4 kernel takes; other sizes must raise alike), K
          from one group, weight and x in float32 / float16 / bfloat16, constant groups (max = min), magnitudes
          from 1e-3 to 1e3. CPU only: the exercise is PyTorch's CPU kernel.
ex9_code  triton_dequant_gemv(x, qweight, scale, bits, group_size, block_n, block_k) in Triton's interpreter: INT8
          and INT4, tiles (powers of two; unequal, block_n 1 and 2, block_k from 2) other than the defaults, K one
          to several tiles and ragged, N at a tile's edges, any group size dividing K (odd ones too; K even for
          INT4), x float32 / float16 / bfloat16, scales float32 / float16 / bfloat16, inputs that are slices of a
          NaN-fenced buffer or strided views. On the meta device (not the CPU) the kernel cannot run: the launch is
          recorded instead, and y (its dtype, shape, device) is compared. A masked-out lane of a load without
          `other` is undefined in Triton (a GPU leaves whatever is there; the interpreter fills 0): here it holds NaN
          (float) or a code that is not 0 (integer).
ex10_code round_to_e2m1(x), quantize_mxfp4(w) and quantize_nvfp4(w) (the last two through round_to_e2m1's globals):
          finite x and w in float32 / float16 / bfloat16, every E2M1 value, the ties between them and the step
          boundaries (2, 4, 6) with both signs and signed zeros, values above 6; w (rows, blocks of 32 or 16) with
          blocks from subnormal to 1e30, all-zero blocks, maxima just below a power of two, and NVFP4 blocks far
          enough below the tensor's maximum that their E4M3 scale rounds to 0.
"""

from __future__ import annotations

import contextlib
import math

import torch
from hypothesis import strategies as st

from autograder.lab05.gemv_cases import _placed      # the layouts the check lays tensors out in
from autograder.mutation.equivalence import Contract, Raised

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _raised(err: Exception, spellings: tuple = ()) -> tuple:
    """An exception as compared: its type, and which of `spellings` its message holds (case ignored)."""
    text = str(err).lower()
    return (Raised(type(err).__name__), tuple(s.lower() in text for s in spellings))


def _clone(t):
    return t.clone() if isinstance(t, torch.Tensor) else t


# -- ex1: quantize_symmetric ---------------------------------------------------------------------------------------

_MAGNITUDES = (1.0, 1e-30, 1e-3, 1e3, 1e30, 3e4)


@st.composite
def _sym_spec(draw):
    out_f = draw(st.integers(1, 5))
    bits = draw(st.sampled_from((2, 3, 4, 8, 8, 4, 5, 1, 0, 16, -1)))
    mode = draw(st.sampled_from(("none", "group", "group", "bad group")))
    if mode == "none":
        in_f, group = draw(st.integers(1, 40)), None
    elif mode == "group":
        group = draw(st.sampled_from((1, 2, 3, 4, 8, 16, 5)))
        in_f = group * draw(st.integers(1, 4))
    else:
        in_f = draw(st.integers(1, 24))
        group = draw(st.sampled_from((0, -1, in_f + 1, 2 * in_f, 7 if in_f % 7 else 5)))
    dtype = draw(st.sampled_from(("float32", "float16", "bfloat16")))
    magnitude = draw(st.sampled_from(_MAGNITUDES))
    kind = draw(st.sampled_from(("randn", "ties", "positive")))
    special = draw(st.sampled_from(("zero row", "zero group", "none", "nan", "inf", "-inf")))
    device = draw(st.sampled_from(("cpu", "cpu", "cpu", "meta")))
    return (out_f, in_f, bits, group, dtype, magnitude, kind, special, draw(st.integers(0, 2**16)), device)


def _sym_weight(spec) -> torch.Tensor:
    out_f, in_f, bits, group, dtype, magnitude, kind, special, seed, device = spec
    g = _gen(seed)
    if kind == "ties":          # every group's max is `magnitude`, the rest on half steps of its scale: round's ties
        qmax = max(2 ** (bits - 1) - 1, 1) if bits > 0 else 1
        w = torch.randint(-2 * qmax, 2 * qmax + 1, (out_f, in_f), generator=g).double() / 2 / qmax
        w[:, 0] = 1.0
        if group and group > 0 and in_f % group == 0:
            w[:, ::group] = 1.0
        w = w * magnitude
    else:
        w = torch.randn(out_f, in_f, generator=g, dtype=torch.float64) * magnitude
        w = w * (1 + torch.arange(out_f, dtype=torch.float64))[:, None]        # rows of different ranges
        if kind == "positive":
            w = w.abs()
    w = w.to(_DTYPES[dtype])
    if special == "zero row":
        w[out_f // 2] = 0
    elif special == "zero group":
        w[out_f - 1, : (group if group and group > 0 else in_f)] = 0
    elif special in ("nan", "inf", "-inf"):
        w[out_f - 1, in_f // 2] = float(special)
    return w.to(device)


def _run_sym(fn, spec):
    w = _sym_weight(spec)
    bits, group = spec[2], spec[3]
    try:
        got = fn(w, bits, group)
    except Exception as err:                        # noqa: BLE001
        got = _raised(err, (str(bits), str(group), "nan", "inf"))
    return got, w


def _sym_corners(ns: dict) -> list:
    return [(1, 1, 8, None, "float32", 1.0, "randn", "none", 0, "cpu"),
            (1, 1, 2, 1, "float32", 1.0, "ties", "none", 1, "cpu"),
            (3, 12, 3, 4, "float16", 1.0, "ties", "zero row", 2, "cpu"),
            (4, 16, 4, 8, "bfloat16", 1e30, "randn", "zero group", 3, "cpu"),
            (2, 8, 8, None, "float32", 1e-30, "randn", "zero row", 4, "cpu"),
            (2, 8, 8, None, "float32", 1.0, "randn", "nan", 5, "cpu"),
            (2, 8, 4, 4, "float32", 1.0, "randn", "-inf", 6, "cpu"),
            (2, 8, 5, None, "float32", 1.0, "randn", "none", 7, "cpu"),
            (2, 8, 4, 3, "float32", 1.0, "randn", "none", 8, "cpu"),
            (2, 8, 4, 0, "float32", 1.0, "randn", "none", 9, "cpu"),
            (2, 8, 4, 4, "float32", 1.0, "randn", "none", 10, "meta")]


# -- ex2: pack_int4, unpack_int4 -----------------------------------------------------------------------------------

@st.composite
def _pack_spec(draw):
    which = draw(st.sampled_from(("pack", "unpack")))
    lead = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    n = 2 * draw(st.integers(0, 6))
    layout = draw(st.sampled_from(("contiguous", "transposed", "strided")))
    device = draw(st.sampled_from(("cpu", "cpu", "cpu", "meta")))
    return (which, lead, n, layout, draw(st.integers(0, 2**16)), device)


def _pack_input(spec) -> torch.Tensor:
    which, lead, n, layout, seed, device = spec
    g = _gen(seed)
    width = n if which == "pack" else n // 2 or 1
    if which == "pack":
        full = torch.randint(-8, 8, (*lead, 2 * width + 1), generator=g).to(torch.int8)
    else:
        full = torch.randint(0, 256, (*lead, 2 * width + 1), generator=g).to(torch.uint8)
    if layout == "strided":
        t = full[..., 1::2]
    elif layout == "transposed" and len(lead) >= 1:
        t = full[..., :width].transpose(0, -1).contiguous().transpose(0, -1)
    else:
        t = full[..., :width].clone()
    return t.to(device)


def _run_pack(pack, spec):
    fn = pack if spec[0] == "pack" else pack.__globals__["unpack_int4"]
    t = _pack_input(spec)
    try:
        got = fn(t)
    except Exception as err:                        # noqa: BLE001
        got = _raised(err)
    return got, t


def _pack_corners(ns: dict) -> list:
    return [("pack", (), 2, "contiguous", 0, "cpu"), ("pack", (1,), 0, "contiguous", 0, "cpu"),
            ("pack", (3, 2), 8, "strided", 1, "cpu"), ("pack", (3,), 6, "transposed", 2, "cpu"),
            ("pack", (2,), 4, "contiguous", 3, "meta"), ("unpack", (2, 3), 8, "contiguous", 4, "cpu"),
            ("unpack", (), 2, "strided", 5, "cpu"), ("unpack", (2,), 4, "contiguous", 6, "meta")]


# -- ex3: quantize_fp8 ---------------------------------------------------------------------------------------------

@st.composite
def _fp8_spec(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from(("float32", "float16", "bfloat16")))
    fmt = draw(st.sampled_from(("e4m3", "e5m2", "e4m3", "e5m2", "e3m4")))
    magnitude = draw(st.sampled_from((1.0, 1e-3, 3000.0, 1e-40, 1e-6, 1e30, 6e4, 3e38)))
    kind = draw(st.sampled_from(("randn", "randn", "zeros", "one large", "positive")))
    device = draw(st.sampled_from(("cpu", "cpu", "cpu", "meta")))
    return (shape, dtype, fmt, magnitude, kind, draw(st.integers(0, 2**16)), device)


def _fp8_input(spec) -> torch.Tensor:
    shape, dtype, fmt, magnitude, kind, seed, device = spec
    if kind == "zeros":
        x = torch.zeros(shape, dtype=torch.float64)
    else:
        x = torch.randn(shape, generator=_gen(seed), dtype=torch.float64)
        x = x / x.abs().max().clamp(min=1e-300)          # max|x| = 1 before scaling
        if kind == "one large":
            x.view(-1)[0] = 1.0
            x.view(-1)[1:] *= 1e-3
        if kind == "positive":
            x = x.abs()
        x = x * magnitude
    limit = torch.finfo(_DTYPES[dtype]).max
    return x.clamp(-limit, limit).to(_DTYPES[dtype]).to(device)


def _run_fp8(fn, spec):
    x = _fp8_input(spec)
    try:
        got = fn(x, spec[2])
    except Exception as err:                        # noqa: BLE001
        got = _raised(err)
    return got, x


def _fp8_corners(ns: dict) -> list:
    return [((1,), "float32", "e4m3", 1.0, "randn", 0, "cpu"), ((4, 8), "float32", "e5m2", 1.0, "zeros", 0, "cpu"),
            ((8, 32), "float32", "e4m3", 3000.0, "randn", 3000, "cpu"),
            ((64, 64), "bfloat16", "e4m3", 20.0, "randn", 20, "cpu"),
            ((64, 64), "bfloat16", "e5m2", 20.0, "randn", 20, "cpu"),
            ((3, 5), "float16", "e4m3", 6e4, "one large", 1, "cpu"),
            ((3, 5), "float32", "e5m2", 3e38, "randn", 2, "cpu"),
            ((2, 3), "float32", "e4m3", 1e-40, "positive", 3, "cpu"),
            ((2, 3), "bfloat16", "e5m2", 1.0, "randn", 4, "meta")]


# -- ex4: gptq -----------------------------------------------------------------------------------------------------

@st.composite
def _gptq_spec(draw):
    out = draw(st.integers(1, 6))
    group = draw(st.sampled_from((1, 2, 3, 4, 8, 16)))
    n = group * draw(st.integers(1, max(1, 24 // group)))
    bits = draw(st.sampled_from((2, 3, 4, 8)))
    block = draw(st.sampled_from((1, 2, 3, 5, 8, 16, 128)))
    w_dtype = draw(st.sampled_from(("float64", "float32")))
    h_dtype = draw(st.sampled_from(("float64", "float32")))
    samples = draw(st.sampled_from((2 * n + 8, max(1, n // 2))))      # fewer samples than inputs: H singular
    dead = draw(st.booleans())
    return (out, n, group, bits, block, w_dtype, h_dtype, samples, dead, draw(st.integers(0, 2**16)))


def _gptq_inputs(spec):
    out, n, group, bits, block, w_dtype, h_dtype, samples, dead, seed = spec
    g = _gen(seed)
    mix = torch.randn(n, n, generator=g, dtype=torch.float64) / n ** 0.5 + torch.eye(n, dtype=torch.float64)
    x = torch.randn(samples, n, generator=g, dtype=torch.float64) @ mix
    x[:, : max(1, n // 8)] *= 8                                          # outlier channels
    if dead and n > 1:
        x[:, n // 2] = 0                                                 # a dead input channel: H[j, j] = 0
    H = (2 * x.T @ x / samples).to(_DTYPES[h_dtype])
    w = torch.randn(out, n, generator=g, dtype=torch.float64).to(_DTYPES[w_dtype])
    return w, H


def _run_gptq(fn, spec):
    w, H = _gptq_inputs(spec)
    try:
        got = fn(w, H, spec[3], spec[2], spec[4])
    except Exception as err:                        # noqa: BLE001
        got = _raised(err)
    return got, (w, H)


def _gptq_corners(ns: dict) -> list:
    return [(1, 1, 1, 4, 128, "float64", "float64", 10, False, 0),
            (24, 64, 16, 4, 16, "float64", "float64", 512, True, 0),
            (24, 64, 16, 4, 64, "float64", "float64", 512, True, 1),
            (3, 12, 4, 3, 5, "float32", "float32", 32, True, 2),
            (2, 8, 8, 2, 3, "float64", "float32", 4, False, 3),
            (4, 16, 2, 8, 1, "float32", "float64", 40, True, 4)]


# -- ex7: Int8LayerKVCache -----------------------------------------------------------------------------------------

@st.composite
def _kv_spec(draw):
    B, S, H, D = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 3)), draw(st.integers(1, 9))
    writes, total = [], 0
    for _ in range(draw(st.integers(1, 4))):
        T = draw(st.integers(1, max(1, S - total))) if total < S else 1
        overflow = total + T > S
        if not overflow and draw(st.integers(0, 5)) == 0:
            T = S - total + 1                                                 # one position too many
        writes.append((T, draw(st.sampled_from(("float32", "float16", "bfloat16"))),
                       draw(st.sampled_from((1.0, 100.0, 1e-3, 1e-30, 1e30))), draw(st.booleans()),
                       draw(st.integers(0, 2**16))))
        total += T if total + T <= S else 0
    return (B, S, H, D, tuple(writes))


def _kv_tensor(B, T, H, D, dtype, magnitude, zero, seed, salt):
    g = _gen(seed * 2 + salt)
    heads = torch.logspace(0, -2, H, dtype=torch.float64)[None, None, :, None]   # heads of different ranges
    if salt:
        heads = heads.flip(2)
    x = torch.randn(B, T, H, D, generator=g, dtype=torch.float64) * heads * magnitude
    limit = torch.finfo(_DTYPES[dtype]).max
    x = x.clamp(-limit, limit).to(_DTYPES[dtype])
    if zero:
        x[B - 1, T - 1] = 0                                                   # an all-zero token
    return x


def _run_kv(cls, spec):
    B, S, H, D, writes = spec
    try:
        cache = cls(B, S, H, D)
    except Exception as err:                        # noqa: BLE001
        return _raised(err)
    results = []
    for T, dtype, magnitude, zero, seed in writes:
        k = _kv_tensor(B, T, H, D, dtype, magnitude, zero, seed, 0)
        v = _kv_tensor(B, T, H, D, dtype, magnitude, zero, seed, 1)
        try:
            got = cache.update(k, v)
        except Exception as err:                    # noqa: BLE001
            got = _raised(err)                      # an overflow: its type; the state it left is compared below
        results.append((got, k, v, _clone(cache.k), _clone(cache.v), _clone(cache.k_scale),
                        _clone(cache.v_scale), cache.length))
    return results


def _kv_corners(ns: dict) -> list:
    return [(1, 1, 1, 1, ((1, "float32", 1.0, False, 0),)),
            (2, 10, 3, 16, ((5, "float32", 100.0, False, 0), (1, "float32", 1.0, False, 1),
                            (2, "float32", 1.0, False, 2), (2, "bfloat16", 1.0, True, 3))),
            (1, 4, 2, 8, ((3, "float16", 1e-3, True, 4), (2, "float32", 1.0, False, 5), (1, "bfloat16", 1e30, True, 6))),
            (2, 3, 1, 4, ((1, "float32", 1e-30, True, 7), (2, "float16", 100.0, False, 8)))]


# -- ex8: make_int4_linear -----------------------------------------------------------------------------------------

@st.composite
def _int4_spec(draw):
    N = 16 * draw(st.integers(1, 3))
    group = draw(st.sampled_from((32, 64, 128, 256, 32, 64, 16)))
    K = group * draw(st.integers(1, 3))
    if draw(st.integers(0, 9)) == 0:
        N = draw(st.sampled_from((1, 8, 24)))                                 # the kernel takes N % 16 == 0 only
    return (N, K, group, draw(st.sampled_from(("float32", "bfloat16", "float16"))),
            draw(st.sampled_from(("float32", "bfloat16", "float16"))), draw(st.integers(1, 4)),
            draw(st.sampled_from((0.05, 1.0, 1e-3, 1e3))), draw(st.sampled_from(("randn", "constant groups", "positive"))),
            draw(st.integers(0, 2**16)))


def _int4_inputs(spec):
    N, K, group, w_dtype, x_dtype, M, magnitude, kind, seed = spec
    g = _gen(seed)
    w = torch.randn(N, K, generator=g) * magnitude
    if kind == "positive":
        w = w.abs()
    if kind == "constant groups":                                             # max = min in some groups
        w.view(N, -1, group)[::2] = w.view(N, -1, group)[::2, :, :1]
    x = torch.randn(M, K, generator=g)
    return w.to(_DTYPES[w_dtype]), x.to(_DTYPES[x_dtype])


def _run_int4(make, spec):
    w, x = _int4_inputs(spec)
    try:
        f = make(w, spec[2])
        got = f(x)
    except Exception as err:                        # noqa: BLE001
        got = _raised(err)
    return got, (w, x)


def _int4_corners(ns: dict) -> list:
    return [(192, 256, 64, "float32", "float32", 3, 0.05, "randn", 0),
            (16, 32, 32, "float32", "float32", 1, 1.0, "randn", 1),
            (16, 256, 256, "bfloat16", "bfloat16", 2, 1.0, "constant groups", 2),
            (32, 128, 128, "float16", "float16", 1, 1e3, "positive", 3),
            (48, 64, 32, "float32", "bfloat16", 4, 1e-3, "randn", 4)]


# -- ex9: triton_dequant_gemv --------------------------------------------------------------------------------------

_TILES = (1, 2, 4, 8, 16, 32)


@st.composite
def _gemv_spec(draw):
    bits = draw(st.sampled_from((4, 8)))
    block_n = draw(st.sampled_from(_TILES))
    block_k = draw(st.sampled_from(_TILES[1:] + (64,)))
    group = draw(st.sampled_from((16, 8, 32, 2, 4, 6, 3, 1)))
    if bits == 4 and group % 2:
        group *= 2 if draw(st.booleans()) else 1
    k_tiles = draw(st.sampled_from((1, 1.5, 2.5, 0.5, 3)))
    K = max(group, math.ceil(k_tiles * block_k / group) * group)
    if bits == 4 and K % 2:
        K *= 2
    N = max(1, draw(st.sampled_from((block_n + 1, block_n - 1, 2 * block_n + 3, 1, block_n))))
    layouts = tuple(draw(st.sampled_from(("contiguous", "slice of a fenced buffer", "strided view"))) for _ in range(3))
    x_dtype = draw(st.sampled_from(("float32", "float16", "bfloat16")))
    s_dtype = draw(st.sampled_from(("float32", "float32", "float16", "bfloat16")))
    device = draw(st.sampled_from(("cpu",) * 7 + ("meta",)))
    return (bits, N, K, group, block_n, block_k, x_dtype, s_dtype, layouts, draw(st.integers(0, 2**16)), device)


def _gemv_inputs(spec):
    bits, N, K, group, block_n, block_k, x_dtype, s_dtype, layouts, seed, device = spec
    g = _gen(seed)
    x = torch.randn(K, generator=g).to(_DTYPES[x_dtype])
    scale = (torch.rand(N, K // group, generator=g) * 0.1 + 0.01).to(_DTYPES[s_dtype])
    if bits == 8:
        qweight, fence = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8), 100
    else:
        qweight, fence = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8), 0x77
    laid = (_placed(x, layouts[0], math.nan), _placed(qweight, layouts[1], fence), _placed(scale, layouts[2], math.nan))
    return tuple(t.to(device) for t in laid)


class _RecordedLaunch:
    """Stands for the kernel where it cannot run (the meta device): `kernel[grid](...)` only records the launch."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _undefined_masked_lanes():
    """A masked-out lane of a load without `other` holds NaN (a float) or the dtype's largest value (an integer), not
    the interpreter's 0: the language leaves it undefined ("If `other` is None, the masked-out value is undefined":
    triton.language.load), and the course's interpreter says so everywhere
    (minigpt.kernels.triton_support.undefined_lanes_as_nan, on importing minigpt.kernels)."""
    from minigpt.kernels.triton_support import undefined_lanes_as_nan

    undefined_lanes_as_nan()
    yield


def _run_gemv(fn, spec):
    x, qweight, scale = _gemv_inputs(spec)
    bits, group, block_n, block_k, device = spec[0], spec[3], spec[4], spec[5], spec[10]
    names = fn.__globals__
    kernel = names.get("_gemv_kernel")
    if device == "meta":
        names["_gemv_kernel"] = _RecordedLaunch()
    try:
        with _undefined_masked_lanes():
            got = fn(x, qweight, scale, bits, group, block_n=block_n, block_k=block_k)
    except Exception as err:                        # noqa: BLE001
        got = _raised(err)
    finally:
        names["_gemv_kernel"] = kernel
    return got, (x, qweight, scale)


def _gemv_corners(ns: dict) -> list:
    c = ("contiguous",) * 3
    fenced = ("slice of a fenced buffer", "strided view", "slice of a fenced buffer")
    return [(4, 5, 32, 16, 1, 8, "float32", "float32", c, 0, "cpu"),          # block_n 1: a one-row tile
            (4, 3, 8, 4, 2, 8, "float32", "float32", c, 1, "cpu"),
            (8, 20, 64, 32, 16, 128, "float32", "float32", c, 0, "cpu"),      # the check's fixed cases
            (4, 20, 64, 32, 16, 128, "float32", "float32", c, 1, "cpu"),
            (4, 9, 40, 8, 8, 16, "float16", "float32", fenced, 2, "cpu"),     # ragged K, views
            (8, 7, 40, 8, 8, 16, "float16", "float32", fenced, 3, "cpu"),
            (8, 33, 48, 16, 32, 16, "bfloat16", "float16", ("strided view",) * 3, 4, "cpu"),
            (4, 17, 24, 6, 16, 4, "float32", "bfloat16", fenced, 5, "cpu"),
            (8, 3, 9, 3, 2, 4, "float32", "float32", c, 6, "cpu"),
            (4, 20, 64, 32, 16, 128, "float32", "float32", c, 7, "meta"),
            (8, 20, 64, 32, 16, 128, "bfloat16", "float16", c, 8, "meta")]


@st.composite
def _smooth_spec(draw) -> tuple:
    """smoothing_factors(act_absmax (in,), [W (out_i, in)], alpha): maxima >= 0 with dead channels (0), one to three
    weights, float32 or bfloat16, alpha in [0, 1]; the default run compares the arguments after the call too."""
    n_in = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    values = st.one_of(st.just(0.0), st.floats(1e-7, 100.0))
    act = torch.tensor(draw(st.lists(values, min_size=n_in, max_size=n_in)), dtype=dtype)
    weights = []
    for _ in range(draw(st.integers(1, 3))):
        rows = draw(st.integers(1, 4))
        flat = draw(st.lists(st.one_of(st.just(0.0), st.floats(-10.0, 10.0)), min_size=rows * n_in,
                             max_size=rows * n_in))
        weights.append(torch.tensor(flat, dtype=dtype).reshape(rows, n_in))
    return (act, weights, draw(st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0])))


# -- ex10: round_to_e2m1, quantize_mxfp4, quantize_nvfp4 -----------------------------------------------------------

_E2M1_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 1.99,
                2.01, 3.99, 4.01, 5.99, 6.01, 0.3, 1e-3, 100.0)
_BLOCK_SIZES = (1e-39, 1e-30, 1e-3, 1.0, 255.0, 127.5, 1e6, 1e30, 0.0)


@st.composite
def _fp4_spec(draw) -> tuple:
    which = draw(st.sampled_from(("round", "mx", "nv")))
    dtype = draw(st.sampled_from(("float32", "float32", "bfloat16", "float16")))
    if which == "round":
        n = draw(st.integers(1, 12))
        values = tuple(draw(st.sampled_from(_E2M1_POINTS)) * draw(st.sampled_from((1.0, -1.0))) for _ in range(n))
        return (which, dtype, values, draw(st.integers(0, 2**16)))
    blocks = tuple(draw(st.sampled_from(_BLOCK_SIZES)) for _ in range(draw(st.integers(1, 4))))
    return (which, dtype, (draw(st.integers(1, 3)), blocks), draw(st.integers(0, 2**16)))


def _fp4_input(spec) -> torch.Tensor:
    which, dtype, shape, seed = spec
    if which == "round":
        return torch.tensor(shape, dtype=torch.float64).to(_DTYPES[dtype])
    rows, maxima = shape
    size = 32 if which == "mx" else 16
    g = _gen(seed)
    w = torch.randn(rows, len(maxima), size, generator=g, dtype=torch.float64)
    w = w / w.abs().amax(-1, keepdim=True) * torch.tensor(maxima, dtype=torch.float64)[None, :, None]
    limit = torch.finfo(_DTYPES[dtype]).max
    return w.reshape(rows, -1).clamp(-limit, limit).to(_DTYPES[dtype])     # finite in every dtype (1e30 saturates)


def _run_fp4(round_to_e2m1, spec):
    names = round_to_e2m1.__globals__
    fn = {"round": round_to_e2m1, "mx": names["quantize_mxfp4"], "nv": names["quantize_nvfp4"]}[spec[0]]
    x = _fp4_input(spec)
    try:
        got = fn(x)
    except Exception as err:                        # noqa: BLE001
        got = _raised(err)
    return got, x


def _fp4_corners(ns: dict) -> list:
    every = tuple(v * s for v in _E2M1_POINTS for s in (1.0, -1.0))
    return [("round", "float32", every, 0), ("round", "bfloat16", every, 1), ("round", "float16", every, 2),
            ("mx", "float32", (2, (1e-39, 1.0, 0.0, 1e30)), 3), ("mx", "bfloat16", (2, (255.0, 127.5)), 4),
            ("nv", "float32", (2, (1e6, 1.0, 0.0, 1e-3)), 5), ("nv", "bfloat16", (1, (1e-39, 1e-30)), 6),
            ("nv", "float16", (3, (127.5, 255.0, 0.0)), 7)]


CONTRACTS = {
    "ex6_code": Contract("smoothing_factors", lambda ns: _smooth_spec()),
    "ex1_code": Contract("quantize_symmetric", lambda ns: _sym_spec(), run=_run_sym, corners=_sym_corners,
                         examples=150),
    "ex2_code": Contract("pack_int4", lambda ns: _pack_spec(), run=_run_pack, corners=_pack_corners),
    "ex3_code": Contract("quantize_fp8", lambda ns: _fp8_spec(), run=_run_fp8, corners=_fp8_corners, examples=150),
    "ex4_code": Contract("gptq", lambda ns: _gptq_spec(), run=_run_gptq, corners=_gptq_corners, examples=60),
    "ex7_code": Contract("Int8LayerKVCache", lambda ns: _kv_spec(), run=_run_kv, corners=_kv_corners),
    "ex8_code": Contract("make_int4_linear", lambda ns: _int4_spec(), run=_run_int4, corners=_int4_corners,
                         examples=60),
    "ex9_code": Contract("triton_dequant_gemv", lambda ns: _gemv_spec(), run=_run_gemv, corners=_gemv_corners,
                         examples=30),
    "ex10_code": Contract("round_to_e2m1", lambda ns: _fp4_spec(), run=_run_fp4, corners=_fp4_corners, examples=150),
}
