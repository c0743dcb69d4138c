"""Checks for Lab 09, long context: RoPE scaling, a ring-buffer KV cache with sinks, KV compression, eviction,
and ring attention on ranks.

Each check takes the learner's function or class, runs it on seeded inputs or a tiny seeded model, compares
with the package's reference (`minigpt.longctx`) and raises AssertionError saying what is wrong. Every check first
refuses the package's reference handed in as the answer, and a call into it while the learner's code runs (a thin
wrapper): autograder.checking.reference_guard.

CPU tier (correctness):
    check_scaled_inv_freq(fn)        frequencies of none/pi/ntk/yarn for three shapes, and the perplexity they give
                                     (YaRN's blend by the paper's ramp over turns or Transformers' over pair index)
    check_ring_cache(cls)            window only: fixed memory, absolute positions after wrap-around, logits equal
                                     to masked sliding-window attention, bad input refused with the cache unchanged
    check_sink_cache(cls)            sinks kept for ever and rotated next to the window: equal to the masked form
    check_kv_bytes(fn)               MHA/GQA/MQA/MLA bytes per token for published layouts; unknown kinds refused
    check_mla_absorbed_decode(fn)    one MLA decode step over the latent cache equal to the materialised path, on
                                     weights and inputs drawn from a secret seed; wrong folds diagnosed
    check_snapkv_keep(fn)            the kept positions per KV head, on random attention scores
    check_ring_attention(fn)         causal attention split over 1, 2, 3 and 4 ranks that the judge plays one after
                                     another (autograder/checking/replayed_ranks.py), every ring pass a request it
                                     answers and counts: equal to one process, K and V passed n - 1 times a rank, and
                                     in every round the attention over the blocks ring_pass handed the rank
    check_ring_bytes(fn)             the bytes-per-rank formula, exact against the ring passes counted on such ranks
Interview questions: check_q1_yarn_turns ... check_q4_ring_overlap (the numbers are in the notebook's cells).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from autograder.harness import assert_finite, call_learner, check_answer, expect_value_error, quiet, within
from autograder.checking.reference_guard import no_calls_into, own_work, watched
from autograder.checking.replayed_ranks import replay_comms, replayed_ranks
from minigpt.attention import naive_attention
from minigpt.config import ModelConfig
from minigpt.kernels.paged_decode import merge_partials
from minigpt.longctx import kv_compression as kvc
from minigpt.longctx import mla
from minigpt.longctx.eviction import snapkv_keep
from minigpt.longctx.long_forward import long_logits, position_nll
from minigpt.longctx.ring_attention import block_attention, ring_attention, ring_bytes_per_rank, split_blocks
from minigpt.longctx.rope_scaling import METHODS, base_inv_freq, rotations_in_context, scaled_inv_freq
from minigpt.longctx.sliding_window import RingKVCache, cached_logits, streaming_attention
from minigpt.model import GPT
from minigpt.parallel.comm import CountingComm
from minigpt.costmodel.hardware import ACCELERATORS

__all__ = ["check_scaled_inv_freq", "check_ring_cache", "check_sink_cache", "check_kv_bytes",
           "check_mla_absorbed_decode", "check_snapkv_keep",
           "check_ring_attention", "check_ring_bytes", "check_q1_yarn_turns", "check_q2_window_streams",
           "check_q3_mla_requests", "check_q4_ring_overlap", "TINY"]

TINY = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)
ATOL = 1e-4

EX1 = "Exercise 1 (scaled_inv_freq)"
EX2 = "Exercise 2 (RingKVCache, the window)"
EX3 = "Exercise 3 (RingKVCache with sinks)"
EX4 = "Exercise 4 (kv_bytes_per_token)"
EX5 = "Exercise 5 (absorbed_decode, MLA)"
EX6 = "Exercise 6 (snapkv_keep)"
EX7 = "Exercise 7 (ring_attention)"
EX8 = "Exercise 8 (ring_bytes_per_rank)"

# Each exercise's reference in the package: handed in, or entered while the learner's code runs, it is refused. The
# helpers the notebook imports (base_inv_freq, kept_positions, rotate_keys, block_attention, ring_pass,
# merge_partials...) are not references: calling them is expected.
FREQ_REFERENCES = (scaled_inv_freq,)
CACHE_REFERENCES = (RingKVCache,)
CACHE_METHODS = ("next_positions", "slot", "update", "read")
KV_BYTES_REFERENCES = (kvc.kv_bytes_per_token, kvc.kv_elements_per_token_layer)
MLA_REFERENCES = (mla.absorbed_decode, mla.naive_decode, mla.materialised_attention)
SNAPKV_REFERENCES = (snapkv_keep,)
RING_REFERENCES = (ring_attention,)
RING_BYTES_REFERENCES = (ring_bytes_per_rank,)


def _tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY).eval()


def _tokens(T: int, seed: int = 1, vocab: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab, (1, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------
# 1. RoPE scaling
# ---------------------------------------------------------------------------------------------------

def check_scaled_inv_freq(fn: Callable) -> None:
    """fn(head_dim, theta, factor, method, original_max_len) -> (head_dim/2,) frequencies, for every method."""
    own_work(fn, FREQ_REFERENCES, what=EX1)
    fn = watched(fn, FREQ_REFERENCES, EX1)
    cases = [(64, 10_000.0, 8.0, 512), (64, 10_000.0, 2.0, 512), (128, 500_000.0, 16.0, 8192)]
    for head_dim, theta, factor, L in cases:
        base = base_inv_freq(head_dim, theta)
        for method in METHODS:
            what = (f"{EX1}, head_dim={head_dim}, theta={theta:g}, factor={factor:g}, method={method!r}, "
                    f"trained length {L}")
            got = call_learner(EX1, fn, head_dim, theta, factor, method, L, context=what)
            want = scaled_inv_freq(head_dim, theta, factor, method, L)
            wants = [want] + ([scaled_inv_freq(head_dim, theta, factor, method, L, ramp="index")] if method == "yarn" else [])
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise AssertionError(f"{what}: expected a tensor of shape {tuple(want.shape)} (one frequency per "
                                     f"pair), got {shape}")
            assert_finite(got, what, want)
            if got.dtype != torch.float64:
                raise AssertionError(f"{what}: the frequencies must be float64 (as the base is), got {got.dtype}: "
                                     "a float32 arange or theta' ** (...) of float32 loses digits a long context needs")
            got = got.double()
            if any(torch.allclose(got, w, rtol=1e-5, atol=0) for w in wants):     # YaRN: the paper's ramp or HF's
                continue
            raise AssertionError(f"{what}: frequencies differ from the reference by up to "
                                 f"{((got - want).abs() / want).max().item():.3g} (relative). "
                                 + _freq_hint(got, base, want, factor, method, L))
    expect_value_error(f"{EX1}: method 'rope2'", fn, 64, 10_000.0, 2.0, "rope2", 512, naming=("rope2",))
    _check_freq_perplexity(fn)


def _freq_hint(got: torch.Tensor, base: torch.Tensor, want: torch.Tensor, s: float, method: str, L: int) -> str:
    fast_kept, slow_divided = math.isclose(got[0], base[0], rel_tol=1e-6), math.isclose(got[-1], base[-1] / s, rel_tol=1e-6)
    if method == "none":
        return "method 'none' returns theta^(-2i/D) unchanged."
    if method == "pi":
        return "position interpolation divides EVERY frequency by the factor."
    if not fast_kept and math.isclose(got[0], base[0] / s, rel_tol=1e-6):
        return ("pair 0 (the fastest, i = 0) must stay unchanged and the slowest pairs be divided by the factor: "
                "the transform is applied to the wrong half of the dimensions.")
    if method == "ntk":
        return "NTK-aware scaling raises the base: theta' = theta * s^(D/(D-2)), then theta'^(-2i/D)."
    turns = rotations_in_context(base, L)
    n_kept = int((turns >= 32).sum())
    return (f"YaRN keeps pairs that turn >= beta=32 times in the trained {L} tokens ({n_kept} here) and divides those "
            "that turn <= alpha=1 times by s, a linear ramp between: the paper's g = clamp((turns - 1) / 31, 0, 1), "
            "f' = (1 - g) f / s + g f (Transformers' ramp, linear in the pair index between the two correction "
            f"dimensions, is accepted too). Fastest pair kept: {fast_kept}; slowest divided by s: {slow_divided}.")


def _check_freq_perplexity(fn: Callable) -> None:
    """The learner's yarn frequencies give the reference's perplexity on a tiny model at 4x its length."""
    model, tokens = _tiny_model(), _tokens(128)
    for method in ("ntk", "yarn"):
        with quiet():
            mine = fn(TINY.head_dim, TINY.rope_theta, 4.0, method, TINY.max_seq_len)
        got = float(position_nll(model, tokens, mine.double()).mean().exp())
        wants = [float(position_nll(model, tokens, scaled_inv_freq(TINY.head_dim, TINY.rope_theta, 4.0, method,
                                                                   TINY.max_seq_len, ramp=ramp)).mean().exp())
                 for ramp in (("turns", "index") if method == "yarn" else ("turns",))]
        want = min(wants, key=lambda w: abs(w - got))
        if not math.isclose(got, want, rel_tol=1e-4):
            raise AssertionError(f"{EX1}, {method}: perplexity at 4x the trained length is {got:.4f} with your "
                                 f"frequencies, {want:.4f} with the reference's")


# ---------------------------------------------------------------------------------------------------
# 2-3. The ring-buffer cache, without and with sinks
# ---------------------------------------------------------------------------------------------------

def _sharp_model() -> GPT:
    """The tiny model with its query weights scaled by 16: attention concentrated on a few keys, so a key kept in the
    wrong slot or rotated to the wrong position moves the logits well past ATOL (sinks rotated one position too far:
    1.4e-3 to 4.7e-3 on the sink cases, 7.9e-5 to 2.8e-4 on the unscaled model), while a right cache stays within
    2e-7."""
    model = _tiny_model()
    with torch.no_grad():
        for block in model.layers:
            block.attn.wq.weight.mul_(16.0)
    return model


def _stream_check(cls: type, window: int, n_sinks: int, T: int, prefill: int, what: str, exercise: str) -> list:
    model, tokens = _sharp_model(), _tokens(T, seed=window + n_sinks)
    f = base_inv_freq(TINY.head_dim, TINY.rope_theta)
    want = long_logits(model, tokens, f, attention=streaming_attention(window, n_sinks, f, block=16))
    with no_calls_into(*CACHE_REFERENCES, what=exercise):
        caches = [call_learner(f"{exercise}: {cls.__name__}(...)", cls, 1, TINY.n_kv_heads, TINY.head_dim, window,
                               n_sinks, f, context=what) for _ in range(TINY.n_layers)]
        nbytes0 = caches[0].nbytes
        got = call_learner(f"{exercise}: streaming through your cache", cached_logits, model, tokens, caches, f,
                           prefill=prefill, context=what)
    assert_finite(got, f"{what}: the logits through your cache", want)
    err = (got - want).abs().amax(-1)[0]
    bad = [p for p, e in enumerate(err.tolist()) if not within(e, ATOL)]
    if bad:
        p = bad[0]
        seen = caches[0].length if hasattr(caches[0], "length") else "?"
        raise AssertionError(f"{what}: logits differ from masked sliding-window attention from position {p} on "
                             f"(by up to {err.max().item():.3g}; {seen} tokens seen). " + _stream_hint(p, window, n_sinks))
    expected_bytes = 2 * (n_sinks + window) * TINY.n_kv_heads * TINY.head_dim * 4
    if nbytes0 != expected_bytes or caches[0].nbytes != expected_bytes:
        raise AssertionError(f"{what}: the cache holds {nbytes0} bytes before and {caches[0].nbytes} after {T} tokens; "
                             f"a ring of {n_sinks} + {window} slots (float32, K and V) is {expected_bytes} bytes, fixed")
    return caches


def _stream_hint(p: int, window: int, n_sinks: int) -> str:
    if p < n_sinks + window:
        return "Nothing is evicted yet: the cache must return every token so far, oldest first."
    if p == n_sinks + window:
        return ("This is the first token after the ring is full (the first wrap-around). Positions keep counting "
                "(next_positions gives length..length+n-1, never a slot number); the new token overwrites the "
                "OLDEST window slot" + (", never a sink" if n_sinks else "") + "; read() returns oldest first"
                + ("; from here on the sinks are rotated on by shift = length - window - n_sinks." if n_sinks else "."))
    return ("Check the positions after wrap-around and the order read() returns"
            + (", and that the sinks are rotated on by shift = length - window - n_sinks." if n_sinks else "."))


def _refuses_big_update(cls: type, what: str) -> None:
    f = base_inv_freq(TINY.head_dim, TINY.rope_theta)
    g = torch.Generator().manual_seed(5)
    k = torch.randn(1, 3, TINY.n_kv_heads, TINY.head_dim, generator=g)
    with no_calls_into(*CACHE_REFERENCES, what=EX2):
        cache = call_learner(f"{EX2}: {cls.__name__}(...)", cls, 1, TINY.n_kv_heads, TINY.head_dim, 4, 0, f,
                             context=what)
        with quiet():
            cache.update(k, k.clone())
            before = cache.read()[0].clone()
        refused = _update_refused(cache, torch.cat([k, k], 1))
        with quiet():
            after = cache.read()[0]
    if not refused:
        raise AssertionError(f"{what}: 6 tokens at once into a window of 4 holding 3 would evict tokens that earlier "
                             "queries of the same chunk still need; update must raise ValueError")
    if cache.length != 3 or not torch.equal(before, after):
        raise AssertionError(f"{what}: after refusing the update the cache changed (length {cache.length}, "
                             "expected 3): check before writing anything")
    with no_calls_into(*CACHE_REFERENCES, what=EX2):
        pair = call_learner(f"{EX2}: {cls.__name__}(...)", cls, 1, TINY.n_kv_heads, TINY.head_dim, 4, 0, f,
                            context=what)
        with quiet():
            pair.update(k, k.clone())
        if not _update_refused(pair, k[:, :2]):
            raise AssertionError(f"{what}: 2 tokens at once into a window of 4 holding 3 were accepted; the first "
                                 "of them would see a key the second evicted: refuse any chunk of more than one "
                                 "token that does not fit the room left")
        pair = call_learner(f"{EX2}: {cls.__name__}(...)", cls, 1, TINY.n_kv_heads, TINY.head_dim, 4, 0, f,
                            context=what)
        with quiet():
            pair.update(k[:, :2], k[:, :2].clone())
        if _update_refused(pair, k[:, :2]):
            raise AssertionError(f"{what}: 2 tokens into a window of 4 holding 2 fill it exactly and evict nothing: "
                                 "they must be accepted")
        empty = call_learner(f"{EX2}: {cls.__name__}(...)", cls, 1, TINY.n_kv_heads, TINY.head_dim, 4, 0, f,
                             context=what)
        if not _update_refused(empty, torch.cat([k, k], 1)):
            raise AssertionError(f"{what}: a prefill of 6 tokens into an EMPTY window of 4 was accepted; the first "
                                 "queries of that chunk would then attend to keys the ring no longer holds: refuse "
                                 "any chunk longer than the room left, from an empty cache too")
        if empty.length != 0:
            raise AssertionError(f"{what}: after refusing a prefill of 6 into an empty window of 4 the cache holds "
                                 f"{empty.length} tokens: check before writing anything")


def _update_refused(cache: Any, chunk: torch.Tensor) -> bool:
    """True when cache.update(chunk, chunk) raises ValueError (False when it accepts the chunk)."""
    try:
        with quiet():
            cache.update(chunk, chunk.clone())
    except ValueError as err:
        if str(err) in ("", "None"):
            raise AssertionError(f"{EX2}: update refused a chunk of {chunk.shape[1]} tokens with a ValueError that "
                                 "says nothing: say why (it would evict tokens the chunk's queries need)") from None
        return True
    except NotImplementedError:
        raise AssertionError(f"{EX2}: update is not implemented yet (NotImplementedError)") from None
    return False


def _slot_check(cache: Any, window: int, n_sinks: int, what: str, exercise: str) -> None:
    """slot(p) as the exercise fixes it: p for a sink, n_sinks + (p - n_sinks) mod window after (a ring turned the
    other way streams the same logits, but another slot than the one the text gives)."""
    for position in range(3 * (n_sinks + window)):
        want = position if position < n_sinks else n_sinks + (position - n_sinks) % window
        got = call_learner(exercise, cache.slot, position, context=f"{what}, slot({position})")
        if got != want:
            raise AssertionError(f"{what}: slot({position}) is {got!r}, expected {want}: the sinks sit in slots "
                                 f"0..n_sinks-1, and token p >= n_sinks in slot n_sinks + (p - n_sinks) mod window")


def check_ring_cache(cls: type) -> None:
    """cls(batch, n_kv_heads, head_dim, window, n_sinks, inv_freq) with n_sinks=0: a sliding-window cache."""
    own_work(cls, CACHE_REFERENCES, what=EX2, methods=CACHE_METHODS)
    for window, T, prefill in ((8, 40, 5), (5, 23, 1), (16, 16, 16)):
        what = f"{EX2}, window={window}, no sinks, {T} tokens, prefill {prefill}"
        caches = _stream_check(cls, window, 0, T, prefill, what, EX2)
        _slot_check(caches[0], window, 0, what, EX2)
    _refuses_big_update(cls, f"{EX2}, window=4")


def check_sink_cache(cls: type) -> None:
    """The same class with n_sinks > 0: sinks never evicted, rotated to sit just before the window."""
    own_work(cls, CACHE_REFERENCES, what=EX3, methods=CACHE_METHODS)
    for window, sinks, T, prefill in ((8, 2, 40, 6), (5, 4, 30, 1), (6, 1, 25, 7)):
        what = f"{EX3}, window={window}, n_sinks={sinks}, {T} tokens, prefill {prefill}"
        caches = _stream_check(cls, window, sinks, T, prefill, what, EX3)
        _slot_check(caches[0], window, sinks, what, EX3)


# ---------------------------------------------------------------------------------------------------
# 4. KV bytes per token
# ---------------------------------------------------------------------------------------------------

def check_kv_bytes(fn: Callable) -> None:
    """fn(kind, n_layers, n_heads, n_kv_heads, head_dim, bytes_per_element, kv_lora_rank, rope_dim) -> int bytes."""
    own_work(fn, KV_BYTES_REFERENCES, what=EX4)
    fn = watched(fn, KV_BYTES_REFERENCES, EX4)
    for layout in kvc.LAYOUTS.values():
        for bpe in (2, 1):
            what = f"{EX4}, {layout.name}, {bpe} byte(s) per element"
            got = call_learner(EX4, fn, layout.kind, layout.n_layers, layout.n_heads,
                               layout.n_kv_heads, layout.head_dim, bpe, layout.kv_lora_rank, layout.rope_dim,
                               context=what)
            want = layout.bytes_per_token(bpe)
            L, per = layout.n_layers * bpe, layout.head_dim
            mistakes = [(want // 2, "K and V are both cached: twice the elements."),
                        (L * 2 * layout.n_heads * per, "GQA/MQA cache n_kv_heads heads, not one per query head.")]
            if layout.kind == "MLA":
                mistakes += [(L * layout.kv_lora_rank, "MLA also caches the decoupled RoPE key (rope_dim per token)."),
                             (L * 2 * (layout.kv_lora_rank + layout.rope_dim),
                              "MLA caches ONE latent c_KV (keys and values are both projected up from it), not two.")]
            check_answer(got, want, what, mistakes, unit="bytes", reveal=True)
    expect_value_error(f"{EX4}: an unknown kind 'XYZ'", fn, "XYZ", 1, 1, 1, 1, 2, 0, 0, naming=("XYZ",))


# ---------------------------------------------------------------------------------------------------
# 5. MLA: the absorbed decode step
# ---------------------------------------------------------------------------------------------------

# (B, H, kv_lora_rank, rope_dim, nope_dim, v_dim, cached tokens, d_model). The first has nope_dim == kv_lora_rank, so
# W_UK folded without its transpose gives wrong numbers instead of a shape error; the last is a single cached token.
MLA_CASES = ((2, 4, 16, 8, 16, 12, 37, 24), (1, 3, 24, 4, 8, 8, 65, 16), (3, 2, 8, 6, 12, 10, 9, 20),
             (1, 5, 12, 2, 6, 4, 1, 8))
MLA_ATOL = 1e-5


def _mla_inputs(case: tuple[int, ...], seed: int) -> tuple[torch.Tensor, ...]:
    """The judge's draw: weights of an MLA layer, a decode query at the position after the cache, and a cache made
    by projecting drawn hidden states (RoPE applied to the rope parts), all float32."""
    B, H, r, e, n, v, T, d = case
    g = torch.Generator().manual_seed(seed)
    w = mla.MLAWeights.draw(mla.MLAShape(d, H, r, e, n, v), g)
    x = torch.randn(B, T + 1, d, generator=g)
    q_nope, q_rope, c_kv, k_rope = mla.project(w, x, torch.arange(T + 1))
    return q_nope[:, -1], q_rope[:, -1], c_kv[:, :T], k_rope[:, :T], w.w_uk, w.w_uv, w.w_o


def check_mla_absorbed_decode(fn: Callable) -> None:
    """fn(q_nope (B, H, nope), q_rope (B, H, rope), c_kv (B, T, r), k_rope (B, T, rope), w_uk (H, r, nope),
    w_uv (H, r, v), w_o (H v, d_model)) -> (B, d_model): equal to the materialised path within MLA_ATOL on weights and
    inputs the judge draws from a secret seed.

    What it cannot observe: whether fn forms a (T, H, nope) key tensor of its own on the way (the package's
    materialised path is refused as a reference; a hand-written one passes on outputs alone). The notebook's cost
    cell and its text carry that part."""
    import secrets

    own_work(fn, MLA_REFERENCES, what=EX5)
    fn = watched(fn, MLA_REFERENCES, EX5)
    seed = secrets.randbelow(2**31)
    for i, case in enumerate(MLA_CASES):
        B, H, r, e, n, v, T, d = case
        inputs = _mla_inputs(case, seed + i)
        what = (f"{EX5}, batch {B}, {H} heads, kv_lora_rank {r}, rope_dim {e}, nope_dim {n}, v_dim {v}, "
                f"{T} cached token{'s' * (T > 1)}, d_model {d}")
        got = call_learner(EX5, fn, *(x.clone() for x in inputs), context=what)
        want = mla.naive_decode(*inputs)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{what}: expected the layer's output of shape {tuple(want.shape)} (batch, d_model: "
                                 f"after W_UV and W_O), got {shape}")
        assert_finite(got, what, want)
        err = (got.double() - want.double()).abs().max().item()
        if not within(err, MLA_ATOL):
            raise AssertionError(f"{what}: differs from the materialised path (K and V projected up for every cached "
                                 f"token) by up to {err:.3g}. " + _mla_hint(got, inputs))


def _mla_hint(got: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> str:
    """Which plausible mistake the output matches, computed on the same inputs."""
    q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o = (x.double() for x in inputs)
    n, e = q_nope.shape[-1], q_rope.shape[-1]

    def attend(q_latent, rope_scores, scale):
        s = (torch.einsum("bhr,btr->bht", q_latent, c_kv) + rope_scores) * scale
        o = torch.einsum("bhr,hrv->bhv", torch.einsum("bht,btr->bhr", s.softmax(-1), c_kv), w_uv)
        return o.reshape(o.shape[0], -1) @ w_o
    q_latent = torch.einsum("bhd,hrd->bhr", q_nope, w_uk)
    rope = torch.einsum("bhe,bte->bht", q_rope, k_rope)
    mistakes = [(lambda: attend(q_latent, 0.0, 1 / math.sqrt(n + e)),
                 "the scores leave out the decoupled RoPE part: add q_rope . k_rope (the shared rope key "
                 "of every cached token) to each head's scores before the softmax."),
                (lambda: attend(q_latent, rope, 1 / math.sqrt(n)),
                 "the softmax scale is 1/sqrt(nope_dim + rope_dim), the width of the whole query-key dot product, "
                 "not 1/sqrt(nope_dim)."),
                (lambda: attend(q_latent, rope, 1 / math.sqrt(c_kv.shape[-1])),
                 "the softmax scale is 1/sqrt(nope_dim + rope_dim), the width of the dot product the scores stand "
                 "for, not 1/sqrt(kv_lora_rank)."),
                (lambda: attend(q_latent, rope, 1.0), "the scores must be scaled by 1/sqrt(nope_dim + rope_dim)."),
                (lambda: attend(torch.einsum("bhd,hdr->bhr", q_nope, w_uk), rope, 1 / math.sqrt(n + e)),
                 "W_UK is folded without its transpose: head h's key is c_KV W_UK[h] (w_uk[h] is (r, nope)), so "
                 "q_nope . (c_KV W_UK[h]) = (q_nope W_UK[h]^T) . c_KV: the latent query is w_uk[h] @ q_nope.")]
    for wrong, diagnosis in mistakes:
        try:
            if torch.allclose(got.double(), wrong(), atol=1e-4):
                return "Your output matches this mistake: " + diagnosis
        except RuntimeError:
            continue
    return ("Per head h: q_lat = w_uk[h] @ q_nope[h] (r wide); scores = (q_lat . c_kv[t] + q_rope[h] . k_rope[t]) / "
            "sqrt(nope_dim + rope_dim) over the T cached tokens; p = softmax; o_h = (sum_t p[t] c_kv[t]) @ w_uv[h]; "
            "output = concat(o_h) @ w_o.")


# ---------------------------------------------------------------------------------------------------
# 6. SnapKV selection
# ---------------------------------------------------------------------------------------------------

def check_snapkv_keep(fn: Callable) -> None:
    """fn(obs_scores (Hkv, w, N), budget, obs_window) -> (Hkv, budget) ascending kept positions."""
    own_work(fn, SNAPKV_REFERENCES, what=EX6)
    fn = watched(fn, SNAPKV_REFERENCES, EX6)
    g = torch.Generator().manual_seed(9)
    for H, w, N, budget in ((2, 4, 40, 12), (3, 8, 100, 8), (1, 2, 10, 10)):
        scores = torch.rand(H, w, N, generator=g).softmax(-1)
        what = f"{EX6}, obs_scores {(H, w, N)}, budget={budget}, obs_window={w}"
        got = call_learner(EX6, fn, scores.clone(), budget, w, context=what)
        want = snapkv_keep(scores, budget, w)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{what}: expected kept positions of shape {tuple(want.shape)}, got {shape}")
        if torch.equal(got.long(), want):
            continue
        if torch.equal(got.long().sort(-1).values, want):
            raise AssertionError(f"{what}: the right positions, not in ascending order (sort them: the kept keys keep "
                                 "their order in the cache)")
        missing = sorted(set(range(N - w, N)) - set(got[0].tolist()))
        hint = (f"the observation window itself ({missing[:4]}...) must always be kept" if missing else
                "the others are the top budget - w positions of 0..N-w-1 by attention summed over the w queries")
        raise AssertionError(f"{what}: kept {got[0].tolist()[:12]} for head 0, expected {want[0].tolist()[:12]}; {hint}")


# ---------------------------------------------------------------------------------------------------
# 7-8. Ring attention on ranks the judge plays
# ---------------------------------------------------------------------------------------------------

RING_CASES = ((2, 12), (4, 16), (3, 12), (1, 6))          # (ranks, sequence length) of Exercise 7


@dataclasses.dataclass(frozen=True)
class _RankRound:
    """One rank's call in one round the judge played: its output, and the judge's records of what it passed on and
    what each ring pass handed it."""

    output: Any
    given: list[tuple[str, torch.Tensor]]
    answered: list[Any]


def _rank_blocks(n: int, *tensors: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Each rank's block of every tensor (B, H, T, D), split along the sequence."""
    return [tuple(split_blocks(x, n, rank) for x in tensors) for rank in range(n)]


def _ring_over(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """Causal ring attention of rank `rank`'s queries over the K/V blocks it held at each step (ks[s], vs[s]), computed
    here: the blocks of steps s with src = (rank - s) mod n <= rank, the first (its own) masked inside."""
    n = len(ks)
    parts = [block_attention(q, ks[s], vs[s], causal=s == 0) for s in range(n) if (rank - s) % n <= rank]
    return merge_partials(torch.stack([o for o, _ in parts], dim=-2), torch.stack([lse for _, lse in parts], dim=-1))


def check_ring_attention(fn: Callable) -> None:
    """fn(comm, q, k, v) -> this rank's block of causal attention (float32), using ring_pass and merge_partials.

    The judge plays the ranks itself, one after another in rounds (autograder/checking/replayed_ranks.py): each rank's
    call is a call the judge makes (over the wire when judged) with its own communicator, every ring pass a request it
    answers with the block rank r - 1 gave it and counts. The last round's outputs must equal one process's causal
    attention, with exactly 2 (n - 1) ring passes a rank; every round's output must be the ring attention of the blocks
    ring_pass handed it (the first rounds hand wrong blocks on purpose), each pass handing on the block last
    received."""
    own_work(fn, RING_REFERENCES, what=EX7)
    with no_calls_into(*RING_REFERENCES, what=EX7):
        _check_ring_attention(fn)


def _check_ring_attention(fn: Callable) -> None:
    g = torch.Generator().manual_seed(11)
    for n, T in RING_CASES:
        q = torch.randn(1, 4, T, 8, generator=g) * 2
        k, v = torch.randn(1, 2, T, 8, generator=g) * 2, torch.randn(1, 2, T, 8, generator=g)
        want = naive_attention(q, k, v)
        what = f"{EX7}, {n} ranks, q {tuple(q.shape)}, k/v {tuple(k.shape)} (GQA)"
        blocks = _rank_blocks(n, q, k, v)
        outs, played = _play_ring(fn, blocks, what)
        for rank, (out, calls, _) in enumerate(outs):
            _check_rank_output(out, want.chunk(n, dim=2)[rank], calls, rank, n, q, k, v, what)
        for rank, rounds in enumerate(played):
            for played_round in rounds:
                _check_follows_the_ring(played_round, blocks[rank], rank, n, what)


def _play_ring(fn: Callable, blocks: list[tuple[torch.Tensor, ...]],
               what: str) -> tuple[list[tuple[Any, dict, dict]], list[list[_RankRound]]]:
    """fn(comm, q_r, k_r, v_r) on every rank r, played by the judge in rounds: the last round's (output, calls,
    bytes) of every rank, and each rank's calls of every round."""
    n = len(blocks)
    played: list[list[_RankRound]] = [[] for _ in range(n)]

    def run_rank(rank: int, comm: CountingComm) -> Any:
        out = call_learner(EX7, fn, comm, *(x.clone() for x in blocks[rank]), context=f"rank {rank} of {n}")
        played[rank].append(_RankRound(out, comm.backend.given, comm.backend.answered))
        return out
    outs, _ = replayed_ranks(run_rank, replay_comms(n), what, world="world_size")
    return outs, played


def _check_rank_output(out: Any, block: torch.Tensor, calls: dict, rank: int, n: int, q: torch.Tensor,
                       k: torch.Tensor, v: torch.Tensor, what: str) -> None:
    """One rank's output of the last round (its ring passes answered right) against one process, and its
    collectives as the judge counted them."""
    if not isinstance(out, torch.Tensor) or out.shape != block.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise AssertionError(f"{what}: rank {rank} returned {shape}, expected its query block {tuple(block.shape)}")
    assert_finite(out, f"{what}: rank {rank}'s output", block)
    err = (out.float() - block).abs().max().item()
    if not within(err, 1e-4):
        raise AssertionError(f"{what}: rank {rank}'s output differs from full causal attention by {err:.3g}. "
                             + _ring_hint(rank, n, out.float(), q, k, v))
    if set(calls) - {"ring_send"}:
        raise AssertionError(f"{what}: rank {rank} called {calls}; ring attention moves K and V with ring_pass only "
                             "(each rank holds one block at a time, never all of them)")
    if calls.get("ring_send", 0) != 2 * (n - 1):
        raise AssertionError(f"{what}: rank {rank} called ring_pass {calls.get('ring_send', 0)} times; the K "
                             f"and V blocks go around once: 2 (n - 1) = {2 * (n - 1)} passes")


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same shape and values, whatever the dtype each is held in."""
    return a.shape == b.shape and torch.equal(a.double(), b.double())


def _check_follows_the_ring(played: _RankRound, own: tuple[torch.Tensor, ...], rank: int, n: int,
                            what: str) -> None:
    """A rank's call in one round: each ring pass hands on the K or V block it holds (its own, then the one it
    received last), and its output is the ring attention, computed here, of the blocks ring_pass handed it."""
    q, k, v = own
    held = {"K": [k], "V": [v]}
    for (_, sent), received in zip(played.given, played.answered):
        chain = next((name for name in ("K", "V") if _same_values(sent, held[name][-1])), None)
        if chain is None:
            raise AssertionError(f"{what}: rank {rank} passed on a tensor that is neither the K block nor the V block "
                                 "it holds (its own, then the one ring_pass returned last): pass each block on as "
                                 "it is, ring_pass(comm, k), and attend over what ring_pass returns")
        held[chain].append(received)
    if len(held["K"]) != n or len(held["V"]) != n:
        raise AssertionError(f"{what}: rank {rank} passed its K block {len(held['K']) - 1} times and its V block "
                             f"{len(held['V']) - 1} times; each goes around the ring once: n - 1 = {n - 1} passes each")
    output = played.output
    expected = _ring_over(q, held["K"], held["V"], rank)
    err = ((output.float() - expected).abs().max().item() if isinstance(output, torch.Tensor)
           and output.shape == expected.shape else math.inf)
    if not within(err, 1e-4):
        raise AssertionError(f"{what}: rank {rank}'s output is not the attention over the K/V blocks ring_pass handed "
                             f"it (off by {err:.3g} in a round where the grader handed it other blocks on purpose): "
                             "each step must attend over the block ring_pass returned, never one kept from another "
                             "rank's call or computed some other way")


def _ring_hint(rank: int, n: int, out, q, k, v) -> str:
    qs, ks, vs = (split_blocks(x, n, rank) for x in (q, k, v))
    parts = [block_attention(qs, split_blocks(k, n, s), split_blocks(v, n, s), causal=s == rank) for s in range(rank + 1)]
    if torch.allclose(out, torch.stack([o for o, _ in parts]).mean(0), atol=1e-4):
        return "The partials were averaged: weight each by exp(lse_s - logsumexp(lse)) (merge_partials)."
    return ("Rank r sees K/V blocks src = (r - step) mod n: src < r fully, src == r with the causal mask inside, "
            "src > r not at all (the future); check which blocks are skipped and which one is masked.")


def _counted_ring_bytes(n: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Bytes rank 0 sends in the package's ring attention on n ranks the judge plays, as its communicator counted."""
    blocks = _rank_blocks(n, q, k, v)
    outs, _ = replayed_ranks(lambda rank, comm: ring_attention(comm, *blocks[rank]), replay_comms(n), EX8,
                             world="world_size")
    return outs[0][2]["ring_send"]


def check_ring_bytes(fn: Callable) -> None:
    """fn(seq_len, world_size, batch, n_kv_heads, head_dim, bytes_per_element) -> bytes each rank sends."""
    own_work(fn, RING_BYTES_REFERENCES, what=EX8)
    fn = watched(fn, RING_BYTES_REFERENCES, EX8)
    g = torch.Generator().manual_seed(12)
    for n, T, B, Hkv, D in ((4, 16, 1, 2, 8), (3, 12, 2, 1, 4)):
        q, k, v = torch.randn(B, 4, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g), \
            torch.randn(B, Hkv, T, D, generator=g)
        counted = _counted_ring_bytes(n, q, k, v)
        what = f"{EX8}, seq_len={T}, world_size={n}, batch={B}, n_kv_heads={Hkv}, head_dim={D}, float32"
        got = call_learner(EX8, fn, T, n, B, Hkv, D, 4, context=what)
        per_pass = B * Hkv * (T // n) * D * 4
        check_answer(got, counted, what,
                     [(counted // 2, "K AND V travel: two blocks per step."),
                      (counted * n // (n - 1), "n - 1 steps, not n: the last block is never passed on."),
                      (per_pass * 2 * (n - 1) * n, "the block is T/n tokens, not T.")],
                     unit="bytes", reveal=True)


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

# Q1: Llama-2-7B's pair 40 under YaRN (the paper's ramp over turns) at 8x: its full turns over the 32,768 tokens.
Q1 = dict(head_dim=128, theta=10_000.0, trained=4096, factor=8.0, pair=40)


def _q1_turns(ramp: str | None = "turns", over: int | None = None, radians: bool = False) -> float:
    """Pair 40's turns over `over` tokens (the extended context) with YaRN's `ramp` (None: no scaling)."""
    q = Q1
    base = base_inv_freq(q["head_dim"], q["theta"])
    freq = base if ramp is None else scaled_inv_freq(q["head_dim"], q["theta"], q["factor"], "yarn", q["trained"],
                                                     ramp=ramp)
    angle = float(freq[q["pair"]]) * (over or int(q["trained"] * q["factor"]))
    return angle if radians else angle / (2 * math.pi)


def check_q1_yarn_turns(answer: Any) -> None:
    """Llama-2-7B (head_dim 128, theta 10000, trained 4096) extended 8x with YaRN (alpha 1, beta 32, the paper's ramp
    over turns): the full turns pair 40 makes over 32,768 tokens. Its 2.06 turns in the trained context put it inside
    the ramp: neither kept nor fully interpolated."""
    q = Q1
    full = float(base_inv_freq(q["head_dim"], q["theta"])[q["pair"]]) * q["trained"] / (2 * math.pi)
    check_answer(answer, _q1_turns(), "Q1 (turns of pair 40 over the extended context)",
                 [(_q1_turns(None), "YaRN changes this pair: it turns only about 2 times in the trained 4,096 tokens, "
                                    "well under beta = 32."),
                  (full, "the pair is inside the ramp (between alpha = 1 and beta = 32 turns), so it keeps a share "
                         "gamma of its frequency: not divided by the whole factor."),
                  (_q1_turns(over=q["trained"]), "count the turns over the extended 32,768 tokens, not the trained "
                                                 "4,096."),
                  (_q1_turns("index"), "the question's ramp is the paper's, linear in the pair's turns (Transformers' "
                                       "and vLLM's ramp over the pair index gives this)."),
                  (_q1_turns(radians=True), "a turn is 2 pi radians.")],
                 unit="turns", rel=1e-3,
                 hint="r = 4096 * f_40 / (2 pi); gamma = clamp((r - 1) / 31, 0, 1); the new frequency is f_40 * "
                      "((1 - gamma) / 8 + gamma); turns = 32768 * new frequency / (2 pi).")


def check_q2_window_streams(answer: Any) -> None:
    """Mistral-7B-style: 32 layers, 8 KV heads of 128, bf16, window 4096 + 4 sinks: 128k streams in 40 GiB."""
    per_stream = 2 * 32 * 8 * 128 * 2 * (4096 + 4)
    want = 40 * 2**30 // per_stream
    full = 40 * 2**30 // (2 * 32 * 8 * 128 * 2 * 131072)
    check_answer(answer, want, "Q2 (128k-token streams in 40 GiB with a 4096-token window and 4 sinks)",
                 {full: "that is with full caches; the ring buffer holds only window + sinks tokens per stream.",
                  40 * 10**9 // per_stream: "40 GiB is 40 * 2**30 bytes, not 40e9.",
                  40 * 2**30 // (2 * 32 * 8 * 128 * 2 * 4096): "the 4 sinks take slots too."},
                 unit="streams", hint="Bytes per stream = 2 * layers * kv_heads * head_dim * 2 bytes * (window + sinks).")


# Q3: DeepSeek-V3 in FP8 on one 8-GPU H200 node: how many 32k-token requests' latent caches fit beside the weights.
Q3 = dict(gpus=8, gpu_bytes=141e9, params=671e9, param_bytes=1, layers=61, latent=512, rope=64, cache_bytes=1,
          tokens=32_768)


def _q3_requests(*, memory: float | None = None, weights: bool = True, rope: bool = True, cache_bytes: int | None = None,
                 per_layer: bool = False) -> int:
    """Whole requests whose caches fit; the keywords swap in the values the mistakes use."""
    q = Q3
    free = q["gpus"] * (q["gpu_bytes"] if memory is None else memory) - (q["params"] * q["param_bytes"] if weights
                                                                          else 0)
    per_token = (q["latent"] + (q["rope"] if rope else 0)) * (q["cache_bytes"] if cache_bytes is None else cache_bytes)
    return int(free // (per_token * (1 if per_layer else q["layers"]) * q["tokens"]))


def check_q3_mla_requests(answer: Any) -> None:
    """DeepSeek-V3 (671B parameters at 1 byte) on 8 H200s of 141 GB: 32,768-token requests whose latent caches (61
    layers x (512 + 64) elements, 1 byte each) fit in what the weights leave."""
    check_answer(answer, _q3_requests(), "Q3 (32k-token requests whose MLA caches fit beside DeepSeek-V3's weights)",
                 [(_q3_requests(weights=False), "the weights take their share of the node first: 671 GB at one byte "
                                                "a parameter."),
                  (_q3_requests(rope=False), "the decoupled RoPE key (64 a token and layer) is cached too."),
                  (_q3_requests(cache_bytes=2), "the cache is stored at 1 byte an element here, not bf16's 2."),
                  (_q3_requests(memory=141 * 2**30), "141 GB is 141e9 bytes (GB, not GiB)."),
                  (_q3_requests(per_layer=True), "every one of the 61 layers caches its own latent.")],
                 unit="requests",
                 hint="Free bytes = 8 x 141e9 - 671e9; a token's cache = 61 x (512 + 64) bytes; requests = free / "
                      "(per-token bytes x 32,768), rounded down.")


def check_q4_ring_overlap(answer: Any) -> None:
    """Llama-3-8B prefill with ring attention on H100s over NVLink (450 GB/s): the block size (tokens per GPU)
    above which passing one K/V block takes no longer than the attention over it (bf16 dense peak)."""
    h100 = ACCELERATORS["H100-SXM"]
    want = 2 * 8 * 2 * h100.peak("bf16") / (4 * 32 * 450e9)
    check_answer(answer, want, "Q4 (smallest block that hides the ring transfer)",
                 [(want / 2, "the block holds K AND V."),
                  (want / 2, "the link carries 450 GB/s one way (900 GB/s is both directions together)."),
                  (want * 2, "attention of c queries over c keys is 4 * n_heads * head_dim * c^2 FLOPs per layer "
                             "(QK^T and PV, 2 FLOPs per multiply-add).")],
                 unit="tokens", rel=0.01,
                 hint="Per layer: time to send 2 * Hkv * c * D * 2 bytes = time for 4 * Hq * D * c^2 FLOPs; solve for c.")
