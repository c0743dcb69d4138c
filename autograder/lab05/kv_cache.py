"""Exercise 7: the INT8 KV cache, one scale per token and KV head."""

from __future__ import annotations

import torch

from autograder.harness import expect_value_error, quiet, within
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.lab05.common import _KV, _call
from minigpt.quant.kv_cache import QuantizedLayerKVCache


def check_quantized_kv_cache(cache_cls: type) -> None:
    """cache_cls(batch_size, max_seq_len, n_kv_heads, head_dim) storing int8 codes .k, .v (B, S, Hkv, D) with a
    scale per token and head; update(k, v) returns all positions so far, dequantized to float32. The last write is
    bfloat16 and holds an all-zero token and fills the cache exactly; one more position then raises ValueError (as in
    lab 01) and changes nothing."""
    ex = "Exercise 7 (the INT8 KV cache)"
    own_work(cache_cls, (QuantizedLayerKVCache,), what=ex, methods=("__init__", "update"))
    B, S, H, D = 2, 10, 3, 16
    try:
        with quiet():
            cache = cache_cls(B, S, H, D)
    except NotImplementedError:
        raise AssertionError("the quantized cache is not implemented yet (NotImplementedError)") from None
    except Exception as err:
        raise AssertionError(f"{cache_cls.__name__}({B}, {S}, {H}, {D}) raised {type(err).__name__}: {err}") from None
    for name in ("k", "v"):
        buf = getattr(cache, name, None)
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.int8 or tuple(buf.shape) != (B, S, H, D):
            got = f"{buf.dtype} {tuple(buf.shape)}" if isinstance(buf, torch.Tensor) else repr(buf)
            raise AssertionError(f"cache.{name} must be a preallocated int8 tensor {(B, S, H, D)}, got {got}")
    g = torch.Generator().manual_seed(0)
    magnitudes = torch.tensor([100.0, 1.0, 0.01])[None, None, :, None]      # heads differ by orders of magnitude
    ks, vs = [], []
    for step, T in enumerate((5, 1, 2, 2)):
        k = torch.randn(B, T, H, D, generator=g) * magnitudes
        v = torch.randn(B, T, H, D, generator=g) * magnitudes.flip(2)
        what = f"write #{step + 1} of {T} position(s)"
        if step == 3:
            k, v = k.bfloat16(), v.bfloat16()
            k[0, 1] = 0
            v[1, 0] = 0
            what += " in bfloat16, one token all zeros"
        ks.append(k.float())
        vs.append(v.float())
        out = _call(_KV, ex, f"{what}: update(k, v)", cache.update, k.clone(), v.clone())
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{what}: update must return (k_all, v_all)")
        want_k, want_v = torch.cat(ks, 1), torch.cat(vs, 1)
        for got, want, name in ((out[0], want_k, "keys"), (out[1], want_v, "values")):
            if tuple(got.shape) != tuple(want.shape):
                raise AssertionError(f"{what}: returned {name} of shape {tuple(got.shape)}, expected {tuple(want.shape)}")
            if not torch.isfinite(got.float()).all():
                raise AssertionError(f"{what}: returned {name} hold NaN or inf: an all-zero token has max|x| = 0, so "
                                     "its scale must be clamped to a tiny positive value (its codes are then 0)")
            bound = want.abs().amax(-1, keepdim=True) / 254 * 1.01 + 1e-12          # half a step per (token, head)
            if not within((got.float() - want).abs(), bound):
                worst = ((got.float() - want).abs() / bound).amax(dim=(0, 1, 3))
                head = int(worst.argmax())
                hint = (" The error is in the small heads: a scale shared across heads is set by the largest head, so "
                        "small heads round to a few levels. Use one scale per (token, KV head): amax over head_dim only."
                        if head > 0 else " scale = max|x| over head_dim / 127, codes = round(x / scale).")
                raise AssertionError(f"{what}: dequantized {name} of head {head} are off by more than half a step "
                                     f"(max|x| / 254 per token and head).{hint}")
        _check_scales(cache, k, v, sum(x.shape[1] for x in ks) - T, what)
        if getattr(cache, "length", None) != sum(x.shape[1] for x in ks):
            raise AssertionError(f"{what}: cache.length should be {sum(x.shape[1] for x in ks)}, got {getattr(cache, 'length', None)!r}")
    _check_overflow(cache, ex, S)


def _check_overflow(cache: object, ex: str, S: int) -> None:
    """The cache is full (S positions): one more raises ValueError naming the capacity, and changes nothing."""
    codes = (cache.k.clone(), cache.v.clone())
    extra = torch.ones(cache.k.shape[0], 1, *cache.k.shape[2:])
    with no_calls_into(*_KV, what=ex):
        expect_value_error(f"{ex}: writing 1 position into the full cache (max_seq_len={S})", cache.update,
                           extra, extra.clone(), naming=(S,), hint=" naming max_seq_len, as lab 01's cache does; check "
                           "the bounds before writing anything")
    if getattr(cache, "length", None) != S or not (torch.equal(cache.k, codes[0]) and torch.equal(cache.v, codes[1])):
        raise AssertionError(f"{ex}: the rejected write changed the cache (its length or codes); check the bounds "
                             "before writing anything")


def _check_scales(cache: object, k: torch.Tensor, v: torch.Tensor, start: int, what: str) -> None:
    """cache.k_scale, cache.v_scale at the written positions: max over head_dim of |x| / 127, computed in float32 (a
    bfloat16 write's scales rounded to bfloat16 are off by up to 0.4%); an all-zero token's is any positive floor."""
    T = k.shape[1]
    for x, name in ((k, "k_scale"), (v, "v_scale")):
        got = getattr(cache, name, None)
        want = (x.float().abs().amax(-1) / 127).clamp(min=1e-12)
        if not isinstance(got, torch.Tensor) or got.dtype != torch.float32 or tuple(got.shape[:2]) < (k.shape[0], start + T):
            raise AssertionError(f"{what}: cache.{name} must be a float32 tensor (B, max_seq_len, Hkv)")
        written, live = got[:, start:start + T].float(), want > 1e-12       # an all-zero token: any tiny floor
        if not torch.allclose(written[live], want[live], rtol=1e-6, atol=0) or not bool((written[~live] > 0).all()):
            raise AssertionError(f"{what}: cache.{name} at positions {start}..{start + T - 1} differs from "
                                 "max|x| over head_dim / 127 computed in float32 (x.float().abs().amax(-1) / 127)")
