"""Exercise 2: the preallocated layer cache (shapes, writes, length, GQA heads, reset) and its overflow."""

from __future__ import annotations

from typing import Any

import torch

from autograder.harness import expect_value_error, quiet
from autograder.lab01.common import REFERENCE_CACHES
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.wire import storage_address


def _make_cache(cache_cls: type, B: int, S: int, H: int, D: int, **kw: Any) -> Any:
    try:
        with quiet():
            return cache_cls(B, S, H, D, **kw)
    except NotImplementedError:
        raise AssertionError("the cache is not implemented yet (NotImplementedError)") from None
    except Exception as err:
        extra = "".join(f", {name}={value!r}" for name, value in kw.items())
        raise AssertionError(f"{cache_cls.__name__}(batch_size={B}, max_seq_len={S}, n_kv_heads={H}, head_dim={D}{extra}) "
                             f"raised {type(err).__name__}: {err}") from None


def _update(cache: Any, k: torch.Tensor, v: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        with quiet():
            out = cache.update(k, v)
    except NotImplementedError:
        raise AssertionError("update() is not implemented yet (NotImplementedError)") from None
    except Exception as err:
        raise AssertionError(f"{what}: update(k, v) with k, v {tuple(k.shape)} raised {type(err).__name__}: {err}") from None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AssertionError(f"{what}: update(k, v) must return a tuple (k_all, v_all), got {type(out).__name__}")
    return out


CACHE_METHODS = ("__init__", "update", "reset")
CACHE_WHAT = "Exercise 2 (LayerKVCache)"


def check_layer_cache(cache_cls: type) -> None:
    """cache_cls(batch_size, max_seq_len, n_kv_heads, head_dim, dtype=, device=) with .k, .v (B, max_seq_len, Hkv, D)
    of that dtype and device, .length, update(k, v) -> (k_all, v_all) of shape (B, length + T, Hkv, D), views of
    .k / .v (no copy), and reset()."""
    own_work(cache_cls, REFERENCE_CACHES, what=CACHE_WHAT, methods=CACHE_METHODS)
    with no_calls_into(*REFERENCE_CACHES, what=CACHE_WHAT):
        _check_layer_cache(cache_cls)
        _check_dtype_device_and_views(cache_cls)


def _check_dtype_device_and_views(cache_cls: type) -> None:
    """The buffers honour dtype= and device=, and update returns views into them (preallocated, written in place)."""
    B, S, H, D = 1, 6, 2, 4
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float16, torch.bfloat16):
        cache = _make_cache(cache_cls, B, S, H, D, dtype=dtype)
        if cache.k.dtype != dtype or cache.v.dtype != dtype:
            raise AssertionError(f"{cache_cls.__name__}(..., dtype={dtype}) holds k {cache.k.dtype}, v {cache.v.dtype}: "
                                 "allocate the buffers with the dtype asked for (a bf16 model writes bf16 keys)")
        k, v = torch.randn(B, 3, H, D, generator=g).to(dtype), torch.randn(B, 3, H, D, generator=g).to(dtype)
        k_all, v_all = _update(cache, k, v, f"write of 3 {dtype} positions")
        if not (torch.equal(k_all, k) and torch.equal(v_all, v)) or k_all.dtype != dtype:
            raise AssertionError(f"a {dtype} cache returned {k_all.dtype} keys/values that differ from those written")
        for name, buf, out in (("k", cache.k, k_all), ("v", cache.v, v_all)):
            if storage_address(out) != storage_address(buf):
                raise AssertionError(f"update returned {name}_all in new memory, not a view of cache.{name}: return "
                                     f"cache.{name}[:, :length] (a slice, no copy: no .clone(), torch.cat or .to())")
    cache = _make_cache(cache_cls, B, S, H, D, device="meta")
    if cache.k.device.type != "meta" or cache.v.device.type != "meta":
        raise AssertionError(f"{cache_cls.__name__}(..., device='meta') put its buffers on {cache.k.device}: allocate "
                             "them on the device asked for (the model's device)")


def _check_layer_cache(cache_cls: type) -> None:
    B, S, H, D = 2, 10, 2, 4
    cache = _make_cache(cache_cls, B, S, H, D)
    for name in ("k", "v"):
        buf = getattr(cache, name, None)
        if not isinstance(buf, torch.Tensor) or tuple(buf.shape) != (B, S, H, D):
            got = tuple(buf.shape) if isinstance(buf, torch.Tensor) else repr(buf)
            raise AssertionError(f"cache.{name} must be a preallocated tensor (batch_size, max_seq_len, n_kv_heads, head_dim) = "
                                 f"{(B, S, H, D)}, got {got}. Under GQA the cache holds the KV heads, not the query heads.")
    if getattr(cache, "length", None) != 0:
        raise AssertionError(f"a new cache must have length 0, got {getattr(cache, 'length', None)!r}")
    g = torch.Generator().manual_seed(1)
    ks, vs = [], []
    for step, T in enumerate([4, 1, 1, 3]):
        k, v = torch.randn(B, T, H, D, generator=g), torch.randn(B, T, H, D, generator=g)
        ks.append(k)
        vs.append(v)
        before = sum(x.shape[1] for x in ks[:-1])
        what = f"write #{step + 1} ({T} position{'s' if T > 1 else ''} after {before} stored)"
        k_all, v_all = _update(cache, k.clone(), v.clone(), what)
        want_k, want_v = torch.cat(ks, 1), torch.cat(vs, 1)
        if tuple(k_all.shape) != tuple(want_k.shape) or tuple(v_all.shape) != tuple(want_v.shape):
            hint = (" The head axis has the query-head count? Store the n_kv_heads KV heads, do not repeat them."
                    if k_all.ndim == 4 and k_all.shape[2] != H else
                    " Return the positions [0, length + T), i.e. everything stored so far including the new ones.")
            raise AssertionError(f"{what}: update must return k_all, v_all of shape {tuple(want_k.shape)}, got "
                                 f"{tuple(k_all.shape)} and {tuple(v_all.shape)}.{hint}")
        if not (torch.equal(k_all, want_k) and torch.equal(v_all, want_v)):
            bad = [t for t in range(want_k.shape[1]) if not (torch.equal(k_all[:, t], want_k[:, t]) and torch.equal(v_all[:, t], want_v[:, t]))]
            raise AssertionError(f"{what}: the returned keys/values are wrong at positions {bad} (expected all writes in order). "
                                 f"Write the new ones at [length, length + T) = [{before}, {before + T}), then advance length.")
        if cache.length != before + T:
            raise AssertionError(f"{what}: cache.length should be {before + T} after the write, got {cache.length!r}; "
                                 "did you forget to advance it by T?")
        if not (torch.equal(cache.k[:, :before + T], want_k) and torch.equal(cache.v[:, :before + T], want_v)):
            raise AssertionError(f"{what}: cache.k / cache.v do not hold the written values at positions [0, {before + T})")
    reset = getattr(cache, "reset", None)
    if not callable(reset):
        raise AssertionError("the cache needs a reset() method that empties it (length back to 0)")
    with quiet():
        reset()
    if cache.length != 0:
        raise AssertionError(f"after reset() the length should be 0, got {cache.length!r}")
    k, v = torch.randn(B, 2, H, D, generator=g), torch.randn(B, 2, H, D, generator=g)
    k_all, v_all = _update(cache, k, v, "write after reset()")
    if not (torch.equal(k_all, k) and torch.equal(v_all, v)):
        raise AssertionError("after reset() a write of 2 positions should return exactly those 2 positions")


def check_cache_overflow(cache_cls: type) -> None:
    """A write past max_seq_len raises ValueError naming the numbers and changes nothing; filling exactly to
    max_seq_len is allowed."""
    own_work(cache_cls, REFERENCE_CACHES, what=CACHE_WHAT, methods=CACHE_METHODS)
    with no_calls_into(*REFERENCE_CACHES, what=CACHE_WHAT):
        _check_cache_overflow(cache_cls)


def _check_cache_overflow(cache_cls: type) -> None:
    B, S, H, D = 1, 8, 2, 4
    g = torch.Generator().manual_seed(2)
    cache = _make_cache(cache_cls, B, S, H, D)
    k6, v6 = torch.randn(B, 6, H, D, generator=g), torch.randn(B, 6, H, D, generator=g)
    _update(cache, k6, v6, "write of 6 positions into an empty cache of 8")
    k_before, v_before = cache.k.clone(), cache.v.clone()
    k3, v3 = torch.randn(B, 3, H, D, generator=g), torch.randn(B, 3, H, D, generator=g)
    expect_value_error(f"writing 3 positions after 6 into a cache of max_seq_len={S} (9 > {S})", cache.update, k3, v3,
                       naming=(6, 3, S), hint=" with a message naming where the write starts (6), how many positions "
                       "(3) and the capacity; check the bounds before writing")
    if cache.length != 6:
        raise AssertionError(f"the rejected write changed cache.length from 6 to {cache.length!r}; check the bounds "
                             "before touching any state")
    if not (torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before)):
        raise AssertionError("the rejected write changed the stored keys/values; check the bounds before writing anything")
    k2, v2 = torch.randn(B, 2, H, D, generator=g), torch.randn(B, 2, H, D, generator=g)
    k_all, v_all = _update(cache, k2, v2, f"write of 2 positions after 6 (filling the cache exactly to max_seq_len={S})")
    if not (torch.equal(k_all, torch.cat([k6, k2], 1)) and torch.equal(v_all, torch.cat([v6, v2], 1))):
        raise AssertionError(f"filling the cache exactly to max_seq_len={S} returned the wrong keys/values")
    if cache.length != S:
        raise AssertionError(f"after filling the cache its length should be {S}, got {cache.length!r}")
