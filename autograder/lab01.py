"""Checks for Lab 01, the KV cache.

Each check takes the learner's object (a class or a function), runs it on small seeded models and
raises AssertionError saying what is wrong (which input, which step, expected vs got, likely cause).

CPU tier (correctness):
    check_causal_attention(attention_fn)         bottom-right causal mask, GQA
    check_layer_cache(LayerKVCache)               shapes, writes, length, GQA heads, reset
    check_cache_overflow(LayerKVCache)            clear error, state untouched, exact fill allowed
    check_generate_kv_cache(generate_fn, ...)     identical to the naive generator, one token per decode step
    check_cached_speedup(generate_fn)             speedup vs the naive loop, relative to the reference
Interview questions: check_q1_kv_bytes_per_token ... check_q4_compute_bound_batch.
GPU tier (speed): check_graphed_decode(make_step) behind autograder.harness.require_gpu.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch

from autograder.harness import check_answer, check_speedup, quiet
from autograder.reference_guard import no_calls_into, own_work
from minigpt import attention as attention_module
from minigpt.attention import naive_attention, resolve_attention, sdpa_attention
from minigpt.cache.contiguous import LayerKVCache as ReferenceLayerKVCache
from minigpt.config import TARGET_CONFIG, ModelConfig
from minigpt.generate import Generation, generate_naive
from minigpt.cache.contiguous import KVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.cuda_graph import GraphedDecodeStep
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads

__all__ = ["check_causal_attention", "check_layer_cache", "check_cache_overflow", "check_generate_kv_cache",
           "check_cached_speedup", "time_cached_speedup", "check_graphed_decode", "check_q1_kv_bytes_per_token", "check_q2_max_batch",
           "check_q3_naive_tokens", "check_q4_compute_bound_batch", "SMALL_CONFIGS", "CACHED_SPEED_CHECK",
           "GRAPH_SPEED_CHECK"]

# Small models for the correctness checks: GQA (2 query heads per KV head) and MQA (one KV head).
SMALL_CONFIGS = {
    "GQA 4q/2kv": ModelConfig(vocab_size=256, max_seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128),
    "MQA 4q/1kv": ModelConfig(vocab_size=256, max_seq_len=48, d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=128),
}

# Speed thresholds: the learner's speedup over the baseline must reach a fraction of the reference's speedup
# measured in the same run. The fractions are calibrated per device class by `make calibrate` (autograder/calibrate.py,
# files autograder/calibration/<check>.<device class>.json), between the reference's ratio and a slow implementation's.
CACHED_SPEED_CHECK = "lab01_cached_speedup"       # slow implementation: generate_naive (recomputes everything)
GRAPH_SPEED_CHECK = "lab01_cuda_graph_decode"     # slow implementation: the fixed-shape step run eagerly (no graph)

ATOL = 1e-4     # float32 logits: cached vs full recomputation differ only by summation order

# The package's attention functions: the reference of Exercise 1 (the setup cell imports naive_attention).
REFERENCE_ATTENTION = tuple(f for name, f in vars(attention_module).items()
                            if callable(f) and getattr(f, "__module__", None) == attention_module.__name__
                            and not isinstance(f, type) and not name.startswith("_"))
# The package's caches and cached generator: the references of Exercises 2 and 3.
REFERENCE_CACHES = (ReferenceLayerKVCache, KVCache)


def _small_model(name: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(SMALL_CONFIGS[name]).eval()


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (n,), generator=g).tolist()


# ---------------------------------------------------------------------------------------------------
# Attention with the bottom-right causal mask
# ---------------------------------------------------------------------------------------------------

def _top_left(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The classic bug: torch.tril(ones(Tq, Tk)), i.e. SDPA's is_causal=True, aligned top-left."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v


def check_causal_attention(attention_fn: Callable) -> None:
    """attention_fn(q (B,Hq,Tq,D), k (B,Hkv,Tk,D), v) -> (B,Hq,Tq,D) must match minigpt.attention.naive_attention
    for prefill (Tq == Tk), decode (Tq == 1) and chunks (1 < Tq < Tk), with MHA, GQA and MQA."""
    cases = [  # (B, Hq, Hkv, Tq, Tk, D, what)
        (2, 4, 4, 6, 6, 8, "prefill, MHA (Tq == Tk)"),
        (2, 4, 2, 6, 6, 8, "prefill, GQA (Tq == Tk)"),
        (2, 4, 2, 1, 9, 8, "decode, GQA (Tq == 1 < Tk)"),
        (1, 6, 1, 1, 5, 16, "decode, MQA (Tq == 1 < Tk)"),
        (2, 4, 2, 3, 8, 8, "chunk after a cache, GQA (1 < Tq < Tk)"),
        (1, 2, 2, 1, 1, 4, "first token (Tq == Tk == 1)"),
    ]
    own_work(attention_fn, REFERENCE_ATTENTION, what="Exercise 1 (causal_attention)")
    g = torch.Generator().manual_seed(0)
    for B, Hq, Hkv, Tq, Tk, D, what in cases:
        q = torch.randn(B, Hq, Tq, D, generator=g)
        k, v = torch.randn(B, Hkv, Tk, D, generator=g), torch.randn(B, Hkv, Tk, D, generator=g)
        _compare_attention(attention_fn, q, k, v, what, Tq, Tk)
    # Edge inputs: scores of a few hundred (exp overflows without the max subtracted), and half precision.
    q = torch.randn(2, 4, 3, 8, generator=g) * 30
    k, v = torch.randn(2, 2, 8, 8, generator=g) * 30, torch.randn(2, 2, 8, 8, generator=g)
    _compare_attention(attention_fn, q, k, v, "chunk with scores in the hundreds (softmax must subtract the max)", 3, 8)
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(2, 4, 3, 8, generator=g).to(dtype)
        k, v = torch.randn(2, 2, 8, 8, generator=g).to(dtype), torch.randn(2, 2, 8, 8, generator=g).to(dtype)
        _compare_attention(attention_fn, q, k, v, f"chunk in {dtype} (GQA)", 3, 8)


def _compare_attention(attention_fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, what: str,
                       Tq: int, Tk: int) -> None:
    """The learner's attention on (q, k, v) against naive_attention computed in float32."""
    shapes = f"q {tuple(q.shape)}, k/v {tuple(k.shape)}"
    try:
        with quiet(), torch.no_grad(), no_calls_into(*REFERENCE_ATTENTION, what="Exercise 1 (causal_attention)"):
            got = attention_fn(q.clone(), k.clone(), v.clone())
    except NotImplementedError:
        raise AssertionError("attention is not implemented yet (NotImplementedError)") from None
    except AssertionError:
        raise
    except Exception as err:
        raise AssertionError(f"{what}: your attention raised {type(err).__name__}: {err} for {shapes}. "
                             "Under GQA repeat each KV head for its group of query heads "
                             "(query head h reads KV head h // (Hq // Hkv)).") from None
    want = naive_attention(q.float(), k.float(), v.float())
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise AssertionError(f"{what}: expected an output of shape {tuple(want.shape)} (B, Hq, Tq, D) for {shapes}, got {shape}")
    if got.dtype != q.dtype:
        raise AssertionError(f"{what}: the output is {got.dtype} for {q.dtype} inputs; keep the inputs' dtype "
                             "(the model runs in bf16/fp16 on a GPU)")
    atol, rtol = (1e-5, 1e-4) if q.dtype == torch.float32 else (3e-2, 3e-2)
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: the output has NaN/inf for {shapes}. exp() of large scores overflows: "
                             "use torch.softmax (or subtract each row's max before exp).")
    if not torch.allclose(got.float(), want, atol=atol, rtol=rtol):
        err = (got.float() - want).abs().max().item()
        hint = ""
        if Tq < Tk and torch.allclose(got.float(), _top_left(q.float(), k.float(), v.float()), atol=atol, rtol=rtol):
            hint = (" Your mask is aligned to the top-left corner (torch.tril(ones(Tq, Tk)) or SDPA's is_causal=True): "
                    f"with a cache the {Tq} queries are the LAST {Tq} of the {Tk} positions, so query i sits at "
                    "position Tk - Tq + i and sees keys j <= Tk - Tq + i.")
        elif Tq == 1:
            hint = " A single new query sits at the last position and may see every key: no mask is needed."
        raise AssertionError(f"{what}: output differs from naive_attention by up to {err:.3g} for {shapes}.{hint}")


# ---------------------------------------------------------------------------------------------------
# The layer cache
# ---------------------------------------------------------------------------------------------------

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
            if out.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
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
    try:
        with quiet():
            cache.update(k3, v3)
    except NotImplementedError:
        raise AssertionError("update() is not implemented yet (NotImplementedError)") from None
    except ValueError as err:
        if str(S) not in str(err):
            raise AssertionError(f"the overflow error should name the numbers (the capacity max_seq_len={S} at least); "
                                 f"your message was: {err!r}") from None
    except Exception as err:
        raise AssertionError(f"writing 3 positions after 6 into a cache of max_seq_len={S} should raise ValueError "
                             f"with a clear message, got {type(err).__name__}: {err}. Check the bounds before writing.") from None
    else:
        raise AssertionError(f"writing 3 positions after 6 into a cache of max_seq_len={S} (9 > {S}) must raise ValueError, "
                             "but nothing was raised")
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


# ---------------------------------------------------------------------------------------------------
# Cached generation, end to end
# ---------------------------------------------------------------------------------------------------

class _Recorder:
    """Records, per forward call of a model: tokens fed, positions, last-position logits, and the key/value
    shapes its attention receives."""

    def __init__(self, model: GPT, attention: Callable | None) -> None:
        self.model = model
        self.calls: list[dict[str, Any]] = []
        self.attn_shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.key_buffers: list[int] = []        # per attention call: address of the memory the keys live in
        inner = resolve_attention(attention if attention is not None else "sdpa")

        def recording_attention(q, k, v):
            self.attn_shapes.append((tuple(q.shape), tuple(k.shape)))
            self.key_buffers.append(k.untyped_storage().data_ptr())
            return inner(q, k, v)

        model.set_attention(recording_attention)
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output) -> None:
        tokens = args[0] if args else kwargs.get("tokens")
        positions = args[1] if len(args) > 1 else kwargs.get("positions")
        self.calls.append({"tokens": tuple(tokens.shape),
                           "positions": None if positions is None else positions.reshape(-1)[-tokens.shape[-1]:].tolist(),
                           "logits": output[:, -1].detach().float().clone()})

    def close(self) -> None:
        self.handle.remove()
        self.model.set_attention("sdpa")


GENERATE_WHAT = "Exercise 3 (generate_kv_cache)"


def _run(generate_fn: Callable, model: GPT, prompt: list[int], n: int, sampling: SamplingParams,
         attention: Callable | None, what: str, *, learner: bool = True, **kw: Any) -> tuple[Generation, _Recorder]:
    """Run a generator under a _Recorder; the learner's (`learner`) may not enter the package's cached generator
    or caches."""
    rec = _Recorder(model, attention)
    watch = no_calls_into(generate_kv_cache, *REFERENCE_CACHES, what=GENERATE_WHAT) if learner else contextlib.nullcontext()
    try:
        with quiet(), watch:
            out = generate_fn(model, list(prompt), n, sampling, **kw)
    except NotImplementedError:
        raise AssertionError("generate_kv_cache is not implemented yet (NotImplementedError)") from None
    except AssertionError:
        raise
    except Exception as err:
        raise AssertionError(f"{what}: your generator raised {type(err).__name__}: {err}") from None
    finally:
        rec.close()
    if not isinstance(out, Generation):
        raise AssertionError(f"{what}: return a minigpt.generate.Generation, got {type(out).__name__}")
    return out, rec


def _diagnose(rec: _Recorder, ref: _Recorder, cfg: ModelConfig, prompt: list[int], what: str) -> None:
    """Per-step comparison of a cached run against the naive run: the first difference, with its likely cause."""
    P = len(prompt)
    for _, k_shape in rec.attn_shapes:
        if k_shape[1] != cfg.n_kv_heads:
            raise AssertionError(f"{what}: attention received keys with {k_shape[1]} heads, but the model has "
                                 f"{cfg.n_kv_heads} KV heads (and {cfg.n_heads} query heads). Under GQA cache the KV heads "
                                 "as they come out of wk/wv; the attention function groups the query heads over them.")
    if len(rec.calls) != len(ref.calls):
        raise AssertionError(f"{what}: expected {len(ref.calls)} forward calls (one prefill, then one per new token "
                             f"except the last), your generator made {len(rec.calls)}")
    first = rec.calls[0]
    if first["tokens"][-1] != P:
        raise AssertionError(f"{what}: the first forward call (prefill) should process the whole prompt of {P} tokens "
                             f"at once, it got tokens of shape {first['tokens']}")
    for step, call in enumerate(rec.calls[1:], start=1):
        if call["tokens"] != (1, 1):
            raise AssertionError(f"{what}: decode step {step} fed tokens of shape {call['tokens']} to the model; with a "
                                 "KV cache each decode step feeds only the newest token, shape (1, 1)")
    n_layers = cfg.n_layers
    # Attention key counts per call: the prefill sees P keys; decode step s sees P + s keys.
    for call_index in range(len(rec.calls)):
        for layer in range(n_layers):
            j = call_index * n_layers + layer
            if j >= len(rec.attn_shapes):
                break
            q_shape, k_shape = rec.attn_shapes[j]
            want_tk = P + call_index
            if k_shape[2] != want_tk:
                where = "prefill" if call_index == 0 else f"decode step {call_index}"
                hint = (" The cache length did not advance after the write?" if k_shape[2] < want_tk else
                        " Return only the stored positions [0, length + T), not the whole buffer.")
                raise AssertionError(f"{what}: at {where}, layer {layer}, attention received {k_shape[2]} keys, expected "
                                     f"{want_tk} (all positions so far).{hint}")
    _check_preallocated(rec, n_layers, what)
    for step, call in enumerate(rec.calls):
        want = list(range(P)) if step == 0 else [P + step - 1]
        if call["positions"] != want:
            got = call["positions"]
            raise AssertionError(f"{what}: {'prefill' if step == 0 else f'decode step {step}'} passed positions "
                                 f"{got if got is None or len(got) < 6 else got[:3] + ['...']} but the tokens sit at "
                                 f"{want if len(want) < 6 else want[:3] + ['...']}. RoPE must be offset by the cache length: "
                                 "positions = arange(length, length + T).")
    for step, (a, b) in enumerate(zip(rec.calls, ref.calls)):
        err = (a["logits"] - b["logits"]).abs().max().item()
        if not err <= ATOL:
            where = "prefill" if step == 0 else f"decode step {step} (position {P + step - 1})"
            hint = ("the prefill itself is wrong (mask? positions?)" if step == 0 else
                    "the prefill matched, so look at the decode path: keys/values written at the wrong index, "
                    "a causal mask aligned top-left instead of bottom-right, or a cache that was not advanced")
            raise AssertionError(f"{what}: logits at {where} differ from recomputing the whole sequence by up to "
                                 f"{err:.3g} (allowed {ATOL}); {hint}.")


def _check_preallocated(rec: _Recorder, n_layers: int, what: str) -> None:
    """Every decode step's keys must live in the same memory, layer by layer: a cache preallocated once and
    written in place, not one grown (torch.cat, a new tensor per step) and copied again at every token."""
    for step, call in enumerate(rec.calls[1:], start=1):
        if call["tokens"] != (1, 1):
            raise AssertionError(f"{what}: decode step {step} fed tokens of shape {call['tokens']} to the model; with a "
                                 "KV cache each decode step feeds only the newest token, shape (1, 1)")
    decode = [rec.key_buffers[c * n_layers:(c + 1) * n_layers] for c in range(1, len(rec.calls))]
    for step, buffers in enumerate(decode[1:], start=2):
        for layer, (first, now) in enumerate(zip(decode[0], buffers)):
            if now != first:
                raise AssertionError(f"{what}: at decode step {step}, layer {layer}, attention read the keys from new "
                                     "memory (not the buffer of decode step 1): the cache was grown or copied "
                                     "(torch.cat?) instead of preallocated once and written in place, which makes "
                                     "every step copy the whole cache (quadratic time). Allocate max length up front.")


def check_generate_kv_cache(generate_fn: Callable, attention: Callable | None = None) -> None:
    """generate_fn(model, prompt, max_new_tokens, sampling, *, stop_token_ids, ...) -> Generation must give the
    same tokens as minigpt.generate.generate_naive (greedy and seeded sampling), with logits close at every step,
    one prefill call and one token per decode step. `attention`: the learner's attention function, plugged into
    the model for the whole check (default: the package's SDPA)."""
    own_work(generate_fn, (generate_kv_cache, generate_naive), what=GENERATE_WHAT)
    with fixed_threads(1):                  # tiny models: one thread is fastest and immune to a busy machine
        _check_generate(generate_fn, attention)


def _check_generate(generate_fn: Callable, attention: Callable | None) -> None:
    for name, cfg in SMALL_CONFIGS.items():
        model = _small_model(name)
        S = cfg.max_seq_len
        cases = [(1, 12), (7, 20), (S - 9, 9), (S - 1, 1)]          # (prompt length, new tokens); two end at S
        for i, (P, N) in enumerate(cases):
            prompt = _prompt(P, cfg.vocab_size, seed=10 * i + 1)
            what = f"model {name} (max_seq_len={S}), prompt of {P} tokens, {N} new tokens, greedy"
            ref, ref_rec = _run(generate_naive, model, prompt, N, SamplingParams(), None, "naive", learner=False, stop_token_ids=())
            out, rec = _run(generate_fn, model, prompt, N, SamplingParams(), attention, what, stop_token_ids=())
            _diagnose(rec, ref_rec, cfg, prompt, what)
            if out.tokens != ref.tokens:
                step = next((j for j, (a, b) in enumerate(zip(out.tokens, ref.tokens)) if a != b), min(len(out.tokens), len(ref.tokens)))
                raise AssertionError(f"{what}: tokens differ from generate_naive at new token {step}: expected "
                                     f"{ref.tokens[step:step + 3]}..., got {out.tokens[step:step + 3]}...")
            if (out.finish_reason, out.prompt_tokens) != (ref.finish_reason, ref.prompt_tokens):
                raise AssertionError(f"{what}: expected finish_reason={ref.finish_reason!r}, prompt_tokens={ref.prompt_tokens}, "
                                     f"got {out.finish_reason!r}, {out.prompt_tokens}")
        # Seeded sampling, and a stop token met along the way.
        prompt = _prompt(5, cfg.vocab_size, seed=99)
        params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
        what = f"model {name}, prompt of 5 tokens, sampling {params}"
        ref, _ = _run(generate_naive, model, prompt, 24, params, None, "naive", learner=False, stop_token_ids=())
        out, _ = _run(generate_fn, model, prompt, 24, params, attention, what, stop_token_ids=())
        if out.tokens != ref.tokens:
            raise AssertionError(f"{what}: seeded sampling should give the same tokens as generate_naive: expected "
                                 f"{ref.tokens}, got {out.tokens}. Use minigpt.sampling.make_generator(sampling, device) "
                                 "once and sample_next(logits, sampling, generator) for every token.")
        stop = ref.tokens[5]
        ref, _ = _run(generate_naive, model, prompt, 24, params, None, "naive", learner=False, stop_token_ids=(stop,))
        out, _ = _run(generate_fn, model, prompt, 24, params, attention, what, stop_token_ids=(stop,))
        if (out.tokens, out.finish_reason) != (ref.tokens, ref.finish_reason):
            raise AssertionError(f"{what}, stop_token_ids=({stop},): expected {ref.tokens} ({ref.finish_reason!r}), got "
                                 f"{out.tokens} ({out.finish_reason!r}); use minigpt.generate.StopRule")
    # A request that does not fit must be refused like the naive generator does (check_request).
    model = _small_model("GQA 4q/2kv")
    try:
        with quiet(), no_calls_into(generate_kv_cache, *REFERENCE_CACHES, what=GENERATE_WHAT):
            generate_fn(model, [1] * 60, 5, SamplingParams())
    except ValueError:
        pass
    except Exception as err:
        raise AssertionError(f"a prompt of 60 tokens + 5 new ones in a context of 64 should raise ValueError "
                             f"(use minigpt.generate.check_request), got {type(err).__name__}: {err}") from None
    else:
        raise AssertionError("a prompt of 60 tokens + 5 new ones in a context of 64 should raise ValueError "
                             "(use minigpt.generate.check_request), nothing was raised")


# ---------------------------------------------------------------------------------------------------
# Speed (CPU tier): ratio to the naive loop, relative to the reference measured in the same run
# ---------------------------------------------------------------------------------------------------

def check_cached_speedup(generate_fn: Callable, *, prompt_len: int = 128, new_tokens: int = 32,
                         repeats: int = 3) -> dict[str, float]:
    """The learner's cached generator must beat generate_naive by at least the calibrated fraction
    (CACHED_SPEED_CHECK) of the reference generator's speedup, on the target model's shape (random weights),
    timed in this process."""
    own_work(generate_fn, (generate_kv_cache, generate_naive), what=GENERATE_WHAT)
    return _cached_speedup(generate_fn, prompt_len, new_tokens, repeats, graded=True)


def time_cached_speedup(generate_fn: Callable, *, prompt_len: int = 128, new_tokens: int = 32,
                        repeats: int = 3) -> dict[str, float]:
    """check_cached_speedup's measurement alone, for calibration on trusted implementations (the reference and its
    slow twin generate_naive, which the graded check refuses as answers)."""
    return _cached_speedup(generate_fn, prompt_len, new_tokens, repeats, graded=False)


def _cached_speedup(generate_fn: Callable, prompt_len: int, new_tokens: int, repeats: int, *,
                    graded: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model = GPT(TARGET_CONFIG).eval()
    prompt = _prompt(prompt_len, TARGET_CONFIG.vocab_size, seed=3)
    kw = {"stop_token_ids": ()}
    what = f"target-shaped model, prompt of {prompt_len} tokens, {new_tokens} new tokens"
    want, _ = _run(generate_naive, model, prompt, new_tokens, SamplingParams(), None, "naive", learner=False, **kw)
    got, rec = _run(generate_fn, model, prompt, new_tokens, SamplingParams(), None, what, learner=graded, **kw)
    if graded:
        _check_preallocated(rec, TARGET_CONFIG.n_layers, what)
    if got.tokens != want.tokens:
        raise AssertionError(f"{what}: your generator's tokens differ from generate_naive's, so its speed does not "
                             "count; pass check_generate_kv_cache first")
    with quiet():
        return check_speedup(lambda: generate_fn(model, prompt, new_tokens, SamplingParams(), **kw),
                             lambda: generate_naive(model, prompt, new_tokens, SamplingParams(), **kw),
                             lambda: generate_kv_cache(model, prompt, new_tokens, SamplingParams(), **kw),
                             what=f"cached generation of {new_tokens} tokens after a {prompt_len}-token prompt",
                             check=CACHED_SPEED_CHECK, repeats=repeats, warmup=1, device="cpu")


# ---------------------------------------------------------------------------------------------------
# GPU tier: the decode step replayed from a CUDA graph
# ---------------------------------------------------------------------------------------------------

def check_graphed_decode(make_step: Callable, *, prompt_len: int = 32, steps: int = 64) -> dict[str, float]:
    """make_step(model, cache) -> step(tokens (1, 1), position) -> logits (1, V) on a GPU: logits match the eager
    cached decode step, and `steps` graphed steps beat `steps` eager ones by the calibrated fraction
    (GRAPH_SPEED_CHECK) of the reference (minigpt.engine.cuda_graph.GraphedDecodeStep)."""
    if not torch.cuda.is_available():
        raise AssertionError("check_graphed_decode needs a CUDA GPU; gate it with autograder.harness.require_gpu")
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = GPT(TARGET_CONFIG).to(device).eval()
    prompt = torch.tensor([_prompt(prompt_len, TARGET_CONFIG.vocab_size, seed=4)], device=device)
    size = prompt_len + steps + 1

    @torch.inference_mode()
    def prefilled() -> KVCache:
        cache = KVCache.for_model(model, 1, max_seq_len=size)
        model(prompt, positions=cache.next_positions(prompt_len), kv_caches=cache)
        return cache

    with quiet(), torch.inference_mode():
        learner_cache, eager_cache, ref_cache = prefilled(), prefilled(), prefilled()
        try:
            step = make_step(model, learner_cache)
        except NotImplementedError:
            raise AssertionError("make_graphed_decode_step is not implemented yet (NotImplementedError)") from None
        except Exception as err:
            raise AssertionError(f"make_step(model, cache) raised {type(err).__name__}: {err}") from None
        reference = GraphedDecodeStep(model, ref_cache)
        token = prompt[:, -1:].clone()
        for i in range(8):
            position = prompt_len + i
            want = model(token, positions=eager_cache.next_positions(1), kv_caches=eager_cache)[:, -1].float()
            got = step(token, position)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                raise AssertionError(f"decode step {i}: expected logits of shape {tuple(want.shape)}, got "
                                     f"{getattr(got, 'shape', type(got).__name__)}")
            err = (got.float() - want).abs().max().item()
            if not err <= 1e-3:
                raise AssertionError(f"decode step {i} (position {position}): graphed logits differ from the eager cached "
                                     f"step by up to {err:.3g}. Copy new inputs INTO the static buffers (copy_, fill_) "
                                     "before replay(), and make the captured step read/write the cache at the position "
                                     "held in a device tensor.")
            token = want.argmax(-1, keepdim=True)

        def run(decode: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[[], None]:
            def go() -> None:
                for i in range(steps):
                    decode(token, prompt_len + i)
            return go

        def eager(tok: torch.Tensor, position: int) -> torch.Tensor:
            for layer in eager_cache:
                layer.length = position
            return model(tok, positions=eager_cache.next_positions(1), kv_caches=eager_cache)[:, -1]

        return check_speedup(run(step), run(eager), run(reference),
                             what=f"{steps} decode steps replayed from a CUDA graph vs eager",
                             check=GRAPH_SPEED_CHECK, repeats=5, warmup=1, device="cuda")


# ---------------------------------------------------------------------------------------------------
# Interview questions (numeric answers)
# ---------------------------------------------------------------------------------------------------

def check_q1_kv_bytes_per_token(answer: Any) -> None:
    """32 layers, 8 KV heads, head_dim 128, bf16: KV-cache bytes per token."""
    per_token = 2 * 32 * 8 * 128 * 2
    check_answer(answer, per_token, "Q1 (KV bytes per token)",
                 {per_token // 2: "forgot the factor 2 for K and V.",
                  per_token * 4: "used the 32 query heads instead of the 8 KV heads."},
                 unit="bytes", hint="Bytes per token = 2 (K and V) * layers * kv_heads * head_dim * bytes_per_element.")


def check_q2_max_batch(answer: Any) -> None:
    """40 GiB for the cache of the Q1 model, sequences of 4096 tokens: how many fit at once?"""
    per_seq = 2 * 32 * 8 * 128 * 2 * 4096
    check_answer(answer, (40 * 2**30) // per_seq, "Q2 (sequences that fit)",
                 {(40 * 10**9) // per_seq: "40 GiB is 40 * 2**30 bytes, not 40e9."}, unit="sequences",
                 hint="Divide the memory (1 GiB = 2**30 bytes) by the bytes of one full sequence "
                      "(Q1's bytes per token * 4096), and round down.")


def check_q3_naive_tokens(answer: Any) -> None:
    """Prompt of 100 tokens, 50 new tokens: token positions the naive loop pushes through the model."""
    check_answer(answer, sum(100 + i for i in range(50)), "Q3 (positions processed by the naive loop)",
                 {100 * 50: "the loop re-runs the tokens generated so far too, not only the prompt.",
                  sum(100 + i for i in range(1, 51)): "off by one: the first step runs the prompt alone."},
                 unit="token positions",
                 hint="Step i (i = 0..49) re-runs the prompt plus the i tokens generated so far: sum over i of (100 + i).")


def check_q4_compute_bound_batch(answer: Any) -> None:
    """989 TFLOP/s, 3.35 TB/s, bf16 weights: the batch size at which a decode step's weight matmuls become
    compute-bound (2 FLOPs per weight per sequence, 2 bytes per weight read once per step)."""
    check_answer(answer, 989e12 / 3.35e12, "Q4 (batch size at the ridge point)", unit="sequences", rel=0.005,
                 hint="Arithmetic intensity of the weight matmuls = 2*B FLOPs / 2 bytes per weight = B FLOP/byte; "
                      "it reaches the machine balance (peak FLOP/s / bandwidth) at B = balance.")
