"""Lab 01 checks: the reference passes, the stub and each plausible wrong implementation fail."""

from __future__ import annotations

import math

import pytest
import torch

from autograder import lab01
from minigpt.attention import naive_attention, sdpa_attention
from minigpt.generate import Generation, StopRule, check_request, generate_naive
from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubCache:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError()


# --- wrong attention functions ------------------------------------------------------------------

def top_left_attention(q, k, v):
    """torch.tril(ones(Tq, Tk)): right only when Tq == Tk."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v


def sdpa_is_causal_attention(q, k, v):
    """SDPA's is_causal=True for every shape (top-left aligned)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def no_gqa_attention(q, k, v):
    """Forgets to repeat the KV heads for the query heads."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ v


# --- wrong layer caches -------------------------------------------------------------------------

class WrongIndexCache(LayerKVCache):
    """Writes one slot too far: [length + 1, length + 1 + T)."""

    def update(self, k, v):
        start, end = self.length + 1, self.length + 1 + k.shape[1]
        if end > self.max_seq_len:
            raise ValueError(f"overflow past max_seq_len={self.max_seq_len}")
        self.k[:, start:end], self.v[:, start:end] = k, v
        self.length += k.shape[1]
        return self.k[:, :self.length], self.v[:, :self.length]


class NoAdvanceCache(LayerKVCache):
    """Forgets to advance length."""

    def update(self, k, v):
        end = self.length + k.shape[1]
        self.k[:, self.length:end], self.v[:, self.length:end] = k, v
        return self.k[:, :end], self.v[:, :end]


class QueryHeadCache(LayerKVCache):
    """Stores the KV heads repeated for the query heads (here a group of 2): GQA's memory saving lost."""

    group = 2

    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, **kw):
        super().__init__(batch_size, max_seq_len, n_kv_heads * self.group, head_dim, **kw)

    def update(self, k, v):
        return super().update(k.repeat_interleave(self.group, 2), v.repeat_interleave(self.group, 2))


class WholeBufferCache(LayerKVCache):
    """Returns the whole preallocated buffer instead of [0, length)."""

    def update(self, k, v):
        super().update(k, v)
        return self.k, self.v


class NoBoundsCache(LayerKVCache):
    """No overflow check: slicing past the end fails with a shape error, not a clear ValueError."""

    def update(self, k, v):
        end = self.length + k.shape[1]
        self.k[:, self.length:end], self.v[:, self.length:end] = k, v
        self.length = end
        return self.k[:, :end], self.v[:, :end]


class SilentTruncateCache(LayerKVCache):
    """Overflow not raised: keeps what fits and drops the rest."""

    def update(self, k, v):
        room = self.max_seq_len - self.length
        return super().update(k[:, :room], v[:, :room])


class AdvanceFirstCache(LayerKVCache):
    """Advances length before checking the bounds: a rejected write corrupts the state."""

    def update(self, k, v):
        start = self.length
        self.length += k.shape[1]
        if self.length > self.max_seq_len:
            raise ValueError(f"overflow: {self.length} > max_seq_len={self.max_seq_len}")
        self.k[:, start:self.length], self.v[:, start:self.length] = k, v
        return self.k[:, :self.length], self.v[:, :self.length]


class WriteFirstCache(LayerKVCache):
    """Writes what fits before raising: a rejected write corrupts the stored values."""

    def update(self, k, v):
        end = self.length + k.shape[1]
        stop = min(end, self.max_seq_len)
        self.k[:, self.length:stop], self.v[:, self.length:stop] = k[:, :stop - self.length], v[:, :stop - self.length]
        if end > self.max_seq_len:
            raise ValueError(f"overflow: {end} > max_seq_len={self.max_seq_len}")
        self.length = end
        return self.k[:, :end], self.v[:, :end]


class OffByOneBoundCache(LayerKVCache):
    """Refuses to fill the cache exactly (>= instead of >)."""

    def update(self, k, v):
        if self.length + k.shape[1] >= self.max_seq_len:
            raise ValueError(f"overflow past max_seq_len={self.max_seq_len}")
        return super().update(k, v)


class VagueErrorCache(LayerKVCache):
    """Raises ValueError without naming the numbers."""

    def update(self, k, v):
        if self.length + k.shape[1] > self.max_seq_len:
            raise ValueError("cache full")
        return super().update(k, v)


def with_layer_cache(layer_cls):
    """The reference generator, running on caches built from layer_cls."""
    def generate(model, prompt, max_new_tokens, sampling=SamplingParams(), **kw):
        cfg = model.config
        cache = KVCache([layer_cls(1, cfg.max_seq_len, cfg.n_kv_heads, cfg.head_dim) for _ in range(cfg.n_layers)])
        return generate_kv_cache(model, prompt, max_new_tokens, sampling, cache=cache, **kw)
    return generate


# --- wrong generators ---------------------------------------------------------------------------

@torch.inference_mode()
def generate_rope_not_offset(model, prompt, max_new_tokens, sampling=SamplingParams(), *,
                             stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None):
    """Passes positions arange(T) at every step: RoPE not offset by the cache length."""
    ids = check_request(model, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, model.device)
    cache = KVCache.for_model(model)
    tokens, reason = torch.tensor([ids]), None
    while reason is None:
        logits = model(tokens, positions=torch.arange(tokens.shape[1]), kv_caches=cache)[:, -1]
        token = int(sample_next(logits, sampling, generator))
        reason = stop.add(token)
        tokens = torch.tensor([[token]])
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))


@torch.inference_mode()
def generate_new_generator_each_step(model, prompt, max_new_tokens, sampling=SamplingParams(), *,
                                     stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None):
    """Re-seeds the sampler at every step: greedy is right, seeded sampling is not."""
    ids = check_request(model, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    cache = KVCache.for_model(model)
    tokens, reason = torch.tensor([ids]), None
    while reason is None:
        logits = model(tokens, positions=cache.next_positions(tokens.shape[1]), kv_caches=cache)[:, -1]
        token = int(sample_next(logits, sampling, make_generator(sampling)))
        reason = stop.add(token)
        tokens = torch.tensor([[token]])
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))


# --- attention ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [naive_attention, sdpa_attention])
def test_attention_reference_passes(fn):
    lab01.check_causal_attention(fn)


@pytest.mark.parametrize("fn", [_stub, top_left_attention, sdpa_is_causal_attention, no_gqa_attention])
def test_attention_wrong_fails(fn):
    with pytest.raises(AssertionError):
        lab01.check_causal_attention(fn)


def test_attention_top_left_message_names_the_bug():
    with pytest.raises(AssertionError, match="top-left"):
        lab01.check_causal_attention(top_left_attention)


# --- layer cache --------------------------------------------------------------------------------

def test_layer_cache_reference_passes():
    lab01.check_layer_cache(LayerKVCache)
    lab01.check_cache_overflow(LayerKVCache)


@pytest.mark.parametrize("cls,match", [(StubCache, "not implemented"), (WrongIndexCache, "wrong at positions"),
                                       (NoAdvanceCache, "advance"), (QueryHeadCache, "KV heads"),
                                       (WholeBufferCache, "shape")])
def test_layer_cache_wrong_fails(cls, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_layer_cache(cls)


@pytest.mark.parametrize("cls,match", [(StubCache, "not implemented"), (NoBoundsCache, "should raise ValueError"),
                                       (SilentTruncateCache, "nothing was raised"), (AdvanceFirstCache, "length"),
                                       (WriteFirstCache, "stored keys"), (OffByOneBoundCache, "exactly"),
                                       (VagueErrorCache, "name the numbers")])
def test_cache_overflow_wrong_fails(cls, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_cache_overflow(cls)


# --- generation ---------------------------------------------------------------------------------

def test_generate_reference_passes():
    lab01.check_generate_kv_cache(generate_kv_cache)


def test_generate_reference_passes_with_naive_attention():
    lab01.check_generate_kv_cache(generate_kv_cache, attention=naive_attention)


@pytest.mark.parametrize("fn,attention,match", [
    (_stub, None, "not implemented"),
    (generate_naive, None, "only the newest token"),                     # no cache at all
    (generate_rope_not_offset, None, "RoPE"),
    (with_layer_cache(WrongIndexCache), None, "logits"),
    (with_layer_cache(NoAdvanceCache), None, "advance"),
    (with_layer_cache(QueryHeadCache), None, "KV heads"),
    (with_layer_cache(WholeBufferCache), None, "whole buffer"),
    (generate_kv_cache, top_left_attention, "logits"),
    (generate_new_generator_each_step, None, "seeded sampling"),
], ids=["stub", "naive", "rope", "index", "advance", "query-heads", "whole-buffer", "top-left", "reseed"])
def test_generate_wrong_fails(fn, attention, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_generate_kv_cache(fn, attention=attention)


# --- speed (CPU tier) ---------------------------------------------------------------------------

@pytest.mark.slow
def test_speed_reference_passes():
    result = lab01.check_cached_speedup(generate_kv_cache)
    assert result["reference_speedup"] > 1.5


@pytest.mark.slow
def test_speed_naive_fails():
    with pytest.raises(AssertionError, match="speedup"):
        lab01.check_cached_speedup(generate_naive)


# --- GPU tier -----------------------------------------------------------------------------------

def test_graphed_decode_refuses_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(AssertionError, match="needs a CUDA GPU"):
        lab01.check_graphed_decode(lambda model, cache: None)


@pytest.mark.gpu
@pytest.mark.calibrated(lab01.GRAPH_SPEED_CHECK)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_decode_reference_passes():
    from minigpt.engine.cuda_graph import GraphedDecodeStep
    lab01.check_graphed_decode(GraphedDecodeStep)


@pytest.mark.gpu
@pytest.mark.calibrated(lab01.GRAPH_SPEED_CHECK)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_decode_eager_fails():
    """The fixed-shape step run eagerly (no graph) is correct but not faster."""
    from minigpt.engine.cuda_graph import GraphedDecodeStep
    with pytest.raises(AssertionError, match="speedup"):
        lab01.check_graphed_decode(lambda model, cache: GraphedDecodeStep(model, cache, use_graph=False))


# --- interview questions ------------------------------------------------------------------------

def test_interview_answers():
    lab01.check_q1_kv_bytes_per_token(2 * 32 * 8 * 128 * 2)
    lab01.check_q2_max_batch(80)
    lab01.check_q3_naive_tokens(6225)
    lab01.check_q4_compute_bound_batch(989 / 3.35)


@pytest.mark.parametrize("check,wrong", [
    (lab01.check_q1_kv_bytes_per_token, 32 * 8 * 128 * 2),          # forgot K and V
    (lab01.check_q1_kv_bytes_per_token, 2 * 32 * 32 * 128 * 2),     # query heads
    (lab01.check_q2_max_batch, 40),                                 # GB vs GiB / factor 2
    (lab01.check_q2_max_batch, "80"),
    (lab01.check_q3_naive_tokens, 150),                             # the cached count
    (lab01.check_q4_compute_bound_batch, 2 * 989 / 3.35),
    (lab01.check_q1_kv_bytes_per_token, _stub),
])
def test_interview_wrong_fails(check, wrong):
    with pytest.raises(AssertionError):
        check(wrong)
