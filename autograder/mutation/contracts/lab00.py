"""Lab 00's contracts (the token factory): what each exercise's markdown and check (autograder/lab00.py) allow.

* ex1 greedy_generate(model, prompt_ids, max_new_tokens): any minigpt GPT (1 or more layers, MHA/GQA/MQA, tied or
  not, float32/bfloat16, on the CPU or on a device that is not the CPU: meta), a prompt of 1 or more ids in the
  vocabulary, 0 or more new tokens within the context; logits with ties (a zero head). The run records the device
  of every token tensor the model is fed (a model off the CPU needs its tokens on its own device: minigpt refuses
  others, as a GPU would), with the result.
* ex5 prefill_bytes and decode_bytes (one cell, both compared): any shape, lengths and batches from 0, weight bytes 0.5
  to 4, KV bytes 1 to 4.
* ex6 attainable_flops(intensity, peak, bandwidth): intensities, peaks and bandwidths from 0 to 1e16, finite, and
  the ridge itself (intensity * bandwidth == peak).
* ex7 max_concurrent_requests: any Llama-style shape, contexts of 1 token or more (a request of 0 tokens has no
  cache: the solution itself divides by 0), weight bytes per element 0.5 to 4, KV bytes 1 to 4, utilisations in
  (0, 1]; the boundary where the memory left after the weights is -1, 0, 1 or 2 bytes, or exactly some requests'
  caches.
* ex8 decode_step_time: any shape, contexts and batches from 0 (batch 1 or more), peaks and bandwidths from 1e9 to
  1e16, and the ridge of each kernel (its FLOPs / peak == its bytes / bandwidth).
* ex9 critical_batch_size: any shape, contexts from 0, ridges from 0.1 to ~3e4 FLOP/byte (every accelerator of the
  course and beyond), and the boundaries: a batch B exactly on the ridge (peak = B f, bandwidth = W + B k, scaled),
  the same a few ulps either side, and f == ridge * k (None); near that edge the smallest batch is astronomically
  large (1e15), which the solution computes at once: each call gets 5 s (a mutant that climbs to it one batch at a
  time does not answer, as a graded cell would hang).
"""

from __future__ import annotations

import math
import signal

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, call_with

# ---------------------------------------------------------------- shapes (exercises 2 to 9)


def _shape(n_layers, d_model, n_kv, group, head_dim, d_ff, vocab, tied):
    from minigpt.costmodel.calculators import ModelShape

    return ModelShape("drawn", n_layers=n_layers, d_model=d_model, n_heads=n_kv * group, n_kv_heads=n_kv,
                      head_dim=head_dim, d_ff=d_ff, vocab_size=vocab, tie_embeddings=tied)


SHAPES = st.builds(_shape, st.integers(1, 96), st.sampled_from([1, 8, 256, 1024, 4096, 8192]),
                   st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 64, 80, 128]),
                   st.sampled_from([1, 688, 2816, 14336, 28672]), st.sampled_from([1, 4096, 32000, 128256]),
                   st.booleans())
WEIGHT_BPE = st.sampled_from([0.5, 1, 2, 4, 1.0, 2.0])
KV_BPE = st.sampled_from([1, 2, 4])


def _presets() -> list:
    from minigpt.costmodel.calculators import PRESETS

    return list(PRESETS.values())


# ---------------------------------------------------------------- exercise 1: the autoregressive loop


def _model(vocab, n_layers, n_kv, group, tied, dtype, device, scale, seed, zero_head):
    from minigpt.config import ModelConfig
    from minigpt.model import GPT

    cfg = ModelConfig(vocab_size=vocab, max_seq_len=24, d_model=8 * n_kv * group, n_layers=n_layers,
                      n_heads=n_kv * group, n_kv_heads=n_kv, d_ff=32, tie_embeddings=tied)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
            if zero_head:                                # every logit equal: argmax's ties (the first index)
                model.lm_head.weight.zero_()
    return model.to(dtype=dtype, device=device)


MODELS = st.builds(_model, st.sampled_from([2, 7, 64]), st.integers(1, 2), st.sampled_from([1, 2]),
                   st.sampled_from([1, 2]), st.booleans(), st.sampled_from([torch.float32, torch.bfloat16]),
                   st.sampled_from(["cpu", "cpu", "meta"]), st.sampled_from([1.0, 5.0]), st.integers(0, 3),
                   st.booleans())


@st.composite
def _generate_inputs(draw):
    model = draw(MODELS)
    vocab, ctx = model.config.vocab_size, model.config.max_seq_len
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=ctx - 1))
    return (model, prompt, draw(st.integers(0, ctx - len(prompt))))


def _generate_corners(ns):
    return [(_model(7, 1, 1, 1, True, torch.float32, "meta", 1.0, 0, False), [1, 2], 2),     # off the CPU
            (_model(7, 1, 2, 1, False, torch.float32, "cpu", 5.0, 1, True), [3], 3),       # ties everywhere
            (_model(64, 2, 1, 2, False, torch.bfloat16, "cpu", 5.0, 2, False), [5, 9], 22),  # to the context's end
            (_model(2, 1, 1, 1, True, torch.float32, "cpu", 5.0, 3, False), [0], 0)]         # nothing to generate


def _run_generate(greedy_generate, value):
    """The new ids (or what was raised), and the device of every token tensor the model was fed."""
    model = value[0]
    fed = []
    handle = model.register_forward_pre_hook(lambda module, args: fed.append(str(args[0].device)))
    try:
        return {"result": call_with(greedy_generate, value), "tokens_fed_on": fed}
    finally:
        handle.remove()


# ---------------------------------------------------------------- exercises 5, 6, 8: bytes, the roofline, a step


@st.composite
def _bytes_inputs(draw):
    shape = draw(st.one_of(SHAPES, st.sampled_from(_presets())))
    return (shape, draw(st.integers(0, 131072)), draw(st.integers(0, 4096)), draw(WEIGHT_BPE), draw(KV_BPE))


def _run_bytes(decode_bytes, value):
    """Both functions of the cell on one input: (prefill_bytes(...), decode_bytes(...))."""
    prefill_bytes = decode_bytes.__globals__["prefill_bytes"]
    return call_with(prefill_bytes, value), call_with(decode_bytes, value)


_MAGNITUDE = st.one_of(st.just(0.0), st.floats(1e-3, 1e16, allow_nan=False, allow_infinity=False),
                       st.integers(0, 10**6).map(float))


@st.composite
def _roofline_inputs(draw):
    peak, bandwidth = draw(_MAGNITUDE), draw(_MAGNITUDE)
    intensity = draw(st.one_of(_MAGNITUDE, st.just(peak / bandwidth if bandwidth else 0.0)))
    return (intensity, peak, bandwidth)


def _roofline_corners(ns):
    return [(0.0, 1e15, 1e12), (1e3, 1e15, 1e12), (999.0, 1e15, 1e12), (1001.0, 1e15, 1e12), (2.0, 4.0, 2.0),
            (1.0, 0.0, 0.0), (0.0, 0.0, 0.0)]


@st.composite
def _step_inputs(draw):
    shape = draw(st.one_of(SHAPES, st.sampled_from(_presets())))
    ctx, batch, wb, kb = draw(st.integers(0, 65536)), draw(st.integers(1, 4096)), draw(WEIGHT_BPE), draw(KV_BPE)
    bw = 10 ** draw(st.floats(9, 13))
    return (shape, ctx, batch, bw * 10 ** draw(st.floats(-1, 4.5)), bw, wb, kb)


def _step_corners(ns):
    """Each kernel exactly on its ridge: the weight matmuls (peak = FLOPs, bandwidth = bytes), then attention."""
    from minigpt.costmodel.calculators import PRESETS

    flops, dbytes, kv = ns["decode_flops"], ns["decode_bytes"], ns["kv_cache_bytes"]
    corners = []
    for name, ctx, batch in (("Llama-3-8B", 1024, 16), ("minigpt-target", 128, 1), ("Llama-2-7B (MHA)", 16, 1000)):
        shape = PRESETS[name]
        mf, mb = flops(shape, 0, batch), dbytes(shape, 0, batch, 2, 2)
        af, ab = flops(shape, ctx, batch) - mf, kv(shape, ctx, batch, 2)
        corners += [(shape, ctx, batch, float(mf), float(mb), 2, 2), (shape, ctx, batch, float(af), float(ab), 2, 2)]
    return corners


# ---------------------------------------------------------------- exercise 7: how many requests fit


@st.composite
def _requests_inputs(draw):
    shape = draw(st.one_of(SHAPES, st.sampled_from(_presets())))
    ctx, wb, kb = draw(st.integers(1, 131072)), draw(WEIGHT_BPE), draw(KV_BPE)
    util = draw(st.one_of(st.sampled_from([0.8, 0.9, 0.92, 0.95, 1.0]),
                          st.floats(0.01, 1.0, allow_nan=False, exclude_min=False)))
    memory = draw(st.one_of(st.sampled_from([16, 24, 40, 48, 80, 94, 141, 192]).map(lambda g: g * 10**9),
                            st.integers(0, 2 * 10**12)))
    return (shape, ctx, memory, wb, kb, util)


def _requests_corners(ns):
    """Memory that leaves -1, 0, 1, 2 bytes, or exactly 1 or 3 requests' caches, after the weights."""
    count, kv = ns["count_parameters"], ns["kv_cache_bytes"]
    corners = []
    for shape in _presets()[:3]:
        for wb, kb, ctx in ((2, 2, 1), (0.5, 1, 4096), (1, 4, 7)):
            weights = math.ceil(count(shape) * wb)
            per = kv(shape, ctx, 1, kb)
            for left in (-1, 0, 1, 2, per - 1, per, 3 * per):
                corners.append((shape, ctx, weights + left, wb, kb, 1.0))
    return corners


# ---------------------------------------------------------------- exercise 9: the compute-bound batch


def _lumped(ns, shape, ctx, wb, kb):
    f = ns["decode_flops"](shape, ctx, 1)
    w = ns["decode_bytes"](shape, ctx, 0, wb, kb)
    k = ns["decode_bytes"](shape, ctx, 1, wb, kb) - w
    return f, w, k


def _critical_inputs(ns):
    @st.composite
    def draw_one(draw):
        shape = draw(st.one_of(SHAPES, st.sampled_from(_presets())))
        ctx, wb, kb = draw(st.sampled_from([0, 1, 16, 128, 256, 1024, 8192]) | st.integers(0, 65536)), \
            draw(WEIGHT_BPE), draw(KV_BPE)
        kind = draw(st.sampled_from(["free", "free", "on the ridge", "on the ridge", "f == ridge * k"]))
        if kind == "free":
            bw = 10 ** draw(st.floats(9, 13))
            return (shape, ctx, bw * 10 ** draw(st.floats(-1, 4.5)), bw, wb, kb)
        f, w, k = _lumped(ns, shape, ctx, wb, kb)
        scale = 2.0 ** draw(st.integers(-40, 40)) * draw(st.sampled_from([1.0, 3.0, 10.0, 1e3, 0.1]))
        if kind == "f == ridge * k":
            peak, bw = float(f) * scale, float(k) * scale
        else:
            b = draw(st.integers(1, 4096))
            peak, bw = float(b * f) * scale, float(w + b * k) * scale
        steps = draw(st.integers(-3, 3))                 # a few ulps either side of the boundary
        peak = _ulps(peak, steps) if draw(st.booleans()) else peak
        bw = bw if steps == 0 or draw(st.booleans()) else _ulps(bw, -steps)
        return (shape, ctx, peak, bw, wb, kb)

    return draw_one()


def _ulps(x: float, n: int) -> float:
    for _ in range(abs(n)):
        x = math.nextafter(x, math.inf if n > 0 else -math.inf)
    return x


def _critical_corners(ns):
    from minigpt.costmodel.calculators import PRESETS

    corners = []
    for name, ctx in (("minigpt-target", 128), ("Llama-3-8B", 0), ("Llama-2-7B (MHA)", 16)):
        shape = PRESETS[name]
        for wb, kb in ((2, 2), (4, 4), (0.5, 1)):
            f, w, k = _lumped(ns, shape, ctx, wb, kb)
            corners.append((shape, ctx, float(f), float(k), wb, kb))                     # f == ridge * k: None
            for b in (1, 2, 3, 7, 64, 1000):
                for dp in (-1, 0, 1):
                    corners.append((shape, ctx, _ulps(float(b * f), dp), float(w + b * k), wb, kb))
    return corners


class _TooSlow(BaseException):           # not an Exception: call_with must not take it for the subject's own error
    pass


def _within(seconds: float):
    """A run that calls the subject and gives up on it after `seconds` (the solution answers in microseconds): an
    answer that takes minutes is no answer (a graded cell that runs that long is a hang), whatever it would be."""
    def run(subject, value):
        def give_up(signum, frame):
            raise _TooSlow

        before = signal.signal(signal.SIGALRM, give_up)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return call_with(subject, value)
        except _TooSlow:
            return f"no answer within {seconds:g} s"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)
    return run


CONTRACTS = {
    "ex1_code": Contract("greedy_generate", lambda ns: _generate_inputs(), run=_run_generate,
                         corners=_generate_corners, examples=40),
    "ex5_code": Contract("decode_bytes", lambda ns: _bytes_inputs(), run=_run_bytes, examples=300),
    "ex6_code": Contract("attainable_flops", lambda ns: _roofline_inputs(), corners=_roofline_corners, examples=300),
    "ex8_code": Contract("decode_step_time", lambda ns: _step_inputs(), corners=_step_corners, examples=300),
    "ex7_code": Contract("max_concurrent_requests", lambda ns: _requests_inputs(), corners=_requests_corners,
                         examples=300),
    "ex9_code": Contract("critical_batch_size", _critical_inputs, run=_within(5.0), corners=_critical_corners,
                         examples=400),
}
