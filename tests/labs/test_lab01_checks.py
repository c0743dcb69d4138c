"""Lab 01 checks: the reference passes, the stub and each plausible wrong implementation fail."""

from __future__ import annotations

import math
import time

import pytest
import torch

from autograder import lab01
from autograder.harness import SPEED_ROUNDS
from minigpt.attention import _check_shapes, causal_mask, naive_attention, sdpa_attention
from minigpt.generate import Generation, StopRule, check_request, generate_naive
from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID

from autograder.checking.reference_guard import ReferenceHandedIn
from tests.labs.learner_copy import as_learner

# The package's references re-typed as notebook code: the checks refuse the package's objects themselves.
LearnerLayerKVCache = as_learner(LayerKVCache)
_learner_helpers = {"_check_shapes": as_learner(_check_shapes), "causal_mask": as_learner(causal_mask)}
learner_naive_attention = as_learner(naive_attention, **_learner_helpers)
learner_sdpa_attention = as_learner(sdpa_attention, **_learner_helpers)
learner_generate_naive = as_learner(generate_naive)


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

class WrongIndexCache(LearnerLayerKVCache):
    """Writes one slot too far: [length + 1, length + 1 + T)."""

    def update(self, k, v):
        start, end = self.length + 1, self.length + 1 + k.shape[1]
        if end > self.max_seq_len:
            raise ValueError(f"overflow: {k.shape[1]} positions at {self.length} past max_seq_len={self.max_seq_len}")
        self.k[:, start:end], self.v[:, start:end] = k, v
        self.length += k.shape[1]
        return self.k[:, :self.length], self.v[:, :self.length]


class NoAdvanceCache(LearnerLayerKVCache):
    """Forgets to advance length."""

    def update(self, k, v):
        end = self.length + k.shape[1]
        self.k[:, self.length:end], self.v[:, self.length:end] = k, v
        return self.k[:, :end], self.v[:, :end]


class QueryHeadCache(LearnerLayerKVCache):
    """Stores the KV heads repeated for the query heads (here a group of 2): GQA's memory saving lost."""

    group = 2

    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, **kw):
        super().__init__(batch_size, max_seq_len, n_kv_heads * self.group, head_dim, **kw)

    def update(self, k, v):
        return super().update(k.repeat_interleave(self.group, 2), v.repeat_interleave(self.group, 2))


class WholeBufferCache(LearnerLayerKVCache):
    """Returns the whole preallocated buffer instead of [0, length)."""

    def update(self, k, v):
        super().update(k, v)
        return self.k, self.v


class NoBoundsCache(LearnerLayerKVCache):
    """No overflow check: slicing past the end fails with a shape error, not a clear ValueError."""

    def update(self, k, v):
        end = self.length + k.shape[1]
        self.k[:, self.length:end], self.v[:, self.length:end] = k, v
        self.length = end
        return self.k[:, :end], self.v[:, :end]


class SilentTruncateCache(LearnerLayerKVCache):
    """Overflow not raised: keeps what fits and drops the rest."""

    def update(self, k, v):
        room = self.max_seq_len - self.length
        return super().update(k[:, :room], v[:, :room])


class AdvanceFirstCache(LearnerLayerKVCache):
    """Advances length before checking the bounds: a rejected write corrupts the state."""

    def update(self, k, v):
        start = self.length
        self.length += k.shape[1]
        if self.length > self.max_seq_len:
            raise ValueError(f"overflow: {start} + {k.shape[1]} > max_seq_len={self.max_seq_len}")
        self.k[:, start:self.length], self.v[:, start:self.length] = k, v
        return self.k[:, :self.length], self.v[:, :self.length]


class WriteFirstCache(LearnerLayerKVCache):
    """Writes what fits before raising: a rejected write corrupts the stored values."""

    def update(self, k, v):
        end = self.length + k.shape[1]
        stop = min(end, self.max_seq_len)
        self.k[:, self.length:stop], self.v[:, self.length:stop] = k[:, :stop - self.length], v[:, :stop - self.length]
        if end > self.max_seq_len:
            raise ValueError(f"overflow: {self.length} + {k.shape[1]} > max_seq_len={self.max_seq_len}")
        self.length = end
        return self.k[:, :end], self.v[:, :end]


class OffByOneBoundCache(LearnerLayerKVCache):
    """Refuses to fill the cache exactly (>= instead of >)."""

    def update(self, k, v):
        if self.length + k.shape[1] >= self.max_seq_len:
            raise ValueError(f"overflow: {k.shape[1]} positions at {self.length} past max_seq_len={self.max_seq_len}")
        return super().update(k, v)


class VagueErrorCache(LearnerLayerKVCache):
    """Raises ValueError without naming the numbers."""

    def update(self, k, v):
        if self.length + k.shape[1] > self.max_seq_len:
            raise ValueError("cache full")
        return super().update(k, v)


def with_layer_cache(layer_cls):
    """The solution's generator (as in the notebook), running on caches built from layer_cls."""
    @torch.inference_mode()
    def generate(model, prompt, max_new_tokens, sampling=SamplingParams(), *, stop_token_ids=(EOT_ID,),
                 stop_strings=(), tokenizer=None):
        ids = check_request(model, prompt, max_new_tokens)
        stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
        generator = make_generator(sampling, model.device)
        c = model.config
        caches = [layer_cls(1, len(ids) + max_new_tokens, c.n_kv_heads, c.head_dim, dtype=model.dtype,
                            device=model.device) for _ in range(c.n_layers)]
        reason = "length" if max_new_tokens == 0 else None
        tokens = torch.tensor([ids], device=model.device)
        while reason is None:
            start = caches[0].length
            positions = torch.arange(start, start + tokens.shape[1], device=model.device)
            logits = model(tokens, positions=positions, kv_caches=caches)[:, -1]
            token = int(sample_next(logits, sampling, generator))
            reason = stop.add(token)
            tokens = torch.tensor([[token]], device=model.device)
        return Generation(stop.tokens, reason, prompt_tokens=len(ids))
    return generate


learner_generate = with_layer_cache(LearnerLayerKVCache)


class ConcatCache:
    """Grows with torch.cat at every write (the anti-pattern of the lab): right values, quadratic copying."""

    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k = torch.zeros(batch_size, 0, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.max_seq_len = max_seq_len
        self.length = 0

    def update(self, k, v):
        if self.length + k.shape[1] > self.max_seq_len:
            raise ValueError(f"overflow: {k.shape[1]} positions at {self.length} past max_seq_len={self.max_seq_len}")
        self.k, self.v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
        self.length += k.shape[1]
        return self.k, self.v

    def reset(self):
        self.length = 0
        self.k, self.v = self.k[:, :0], self.v[:, :0]


class IgnoresDtypeCache(LearnerLayerKVCache):
    """Always allocates float32 on the CPU, whatever dtype and device are asked for."""

    def __init__(self, batch_size, max_seq_len, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.k = torch.zeros(batch_size, max_seq_len, n_kv_heads, head_dim)
        self.v = torch.zeros(batch_size, max_seq_len, n_kv_heads, head_dim)
        self.length = 0

    def update(self, k, v):
        end = self.length + k.shape[1]
        if end > self.max_seq_len:
            raise ValueError(f"overflow: {k.shape[1]} positions at {self.length} past max_seq_len={self.max_seq_len}")
        self.k[:, self.length:end], self.v[:, self.length:end] = k, v
        self.length = end
        return self.k[:, :end].to(k.dtype), self.v[:, :end].to(v.dtype)


class CopyingCache(LearnerLayerKVCache):
    """Returns copies of the stored keys and values (a .clone() per layer per step)."""

    def update(self, k, v):
        end = self.length + k.shape[1]
        if end > self.max_seq_len:
            raise ValueError(f"overflow: {k.shape[1]} positions at {self.length} past max_seq_len={self.max_seq_len}")
        self.k[:, self.length:end], self.v[:, self.length:end] = k, v
        self.length = end
        return self.k[:, :end].clone(), self.v[:, :end].clone()


def plain_exp_attention(q, k, v):
    """Softmax written as exp / sum without subtracting the max: overflows for large scores."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    Tq, Tk = q.shape[2], k.shape[2]
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    e = scores.exp().masked_fill(~mask, 0)
    return (e / e.sum(-1, keepdim=True)) @ v


def large_negative_mask_attention(q, k, v):
    """Masks with -1e4 instead of -inf: right while every visible score is above about -1e4."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    Tq, Tk = q.shape[2], k.shape[2]
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
    return torch.softmax(scores.masked_fill(~mask, -1e4), -1) @ v


def float32_attention(q, k, v):
    """Right values, but always returns float32 (upcasts and never casts back)."""
    return learner_naive_attention(q.float(), k.float(), v.float())


# --- wrong generators ---------------------------------------------------------------------------

@torch.inference_mode()
def generate_rope_not_offset(model, prompt, max_new_tokens, sampling=SamplingParams(), *,
                             stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None):
    """Passes positions arange(T) at every step: RoPE not offset by the cache length."""
    ids = check_request(model, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, model.device)
    cache = [LearnerLayerKVCache(1, model.config.max_seq_len, model.config.n_kv_heads, model.config.head_dim)
             for _ in range(model.config.n_layers)]
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
    cache = [LearnerLayerKVCache(1, model.config.max_seq_len, model.config.n_kv_heads, model.config.head_dim)
             for _ in range(model.config.n_layers)]
    tokens, reason = torch.tensor([ids]), None
    while reason is None:
        start = cache[0].length
        logits = model(tokens, positions=torch.arange(start, start + tokens.shape[1]), kv_caches=cache)[:, -1]
        token = int(sample_next(logits, sampling, make_generator(sampling)))
        reason = stop.add(token)
        tokens = torch.tensor([[token]])
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))


def cached_generator(*, on_device=True, length_layer=0):
    """The cached loop written out flat, with one mistake switched on: on_device=False makes its caches, tokens,
    positions and generator without device= (right on a one-device machine; a model on a GPU meets CPU tensors);
    length_layer=1 reads the cache length from layer 1's cache (right on every model of two layers or more)."""
    @torch.inference_mode()
    def generate(model, prompt, max_new_tokens, sampling=SamplingParams(), *, stop_token_ids=(EOT_ID,),
                 stop_strings=(), tokenizer=None):
        dev = model.device if on_device else None
        ids = check_request(model, prompt, max_new_tokens)
        stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
        generator = make_generator(sampling, dev)
        cache = [LearnerLayerKVCache(1, len(ids) + max_new_tokens, model.config.n_kv_heads, model.config.head_dim,
                                     dtype=model.dtype, device=dev) for _ in range(model.config.n_layers)]
        tokens, reason = torch.tensor([ids], device=dev), "length" if max_new_tokens == 0 else None
        while reason is None:
            start = cache[length_layer].length
            positions = torch.arange(start, start + tokens.shape[1], device=dev)
            logits = model(tokens, positions=positions, kv_caches=cache)[:, -1]
            token = int(sample_next(logits, sampling, generator))
            reason = stop.add(token)
            tokens = torch.tensor([[token]], device=dev)
        return Generation(stop.tokens, reason, prompt_tokens=len(ids))
    return generate


generate_tokens_on_the_default_device = cached_generator(on_device=False)
generate_length_from_the_second_layer = cached_generator(length_layer=1)


def mask_on_the_default_device_attention(q, k, v):
    """Right on a one-device machine: the mask's indices are made without device=, beside q on a GPU."""
    Tq, Tk, group = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None, :]
    return torch.softmax(scores.masked_fill(j > i + (Tk - Tq), float("-inf")), -1) @ v


# --- attention ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [learner_naive_attention, learner_sdpa_attention])
def test_attention_learner_copy_passes(fn):
    lab01.check_causal_attention(fn)


@pytest.mark.parametrize("fn", [naive_attention, sdpa_attention])
def test_attention_package_reference_is_refused(fn):
    """The setup cell imports naive_attention: handing it in is refused."""
    with pytest.raises(ReferenceHandedIn, match="course's reference"):
        lab01.check_causal_attention(fn)


def test_attention_thin_wrapper_is_refused():
    with pytest.raises(ReferenceHandedIn, match=r"calls the course's reference \(naive_attention\)"):
        lab01.check_causal_attention(lambda q, k, v: naive_attention(q, k, v))


@pytest.mark.parametrize("fn,match", [(plain_exp_attention, "NaN/inf"), (float32_attention, "keep the inputs' dtype"),
                                     (large_negative_mask_attention, "far below -1e4"),
                                     (mask_on_the_default_device_attention, "default device")],
                         ids=["no-max-subtracted", "returns-float32", "mask-of-minus-1e4", "mask-on-the-default-device"])
def test_attention_edge_inputs(fn, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_causal_attention(fn)


@pytest.mark.parametrize("fn", [_stub, top_left_attention, sdpa_is_causal_attention, no_gqa_attention])
def test_attention_wrong_fails(fn):
    with pytest.raises(AssertionError):
        lab01.check_causal_attention(fn)


def scales_q_in_place(q, k, v):
    """The right output, but the caller's q is divided by sqrt(D) in place (div_ for div)."""
    (Tq, D), Tk = q.shape[2:], k.shape[2]
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = q.div_(math.sqrt(D)) @ k.transpose(-2, -1)
    future = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(Tk - Tq + 1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def test_attention_check_refuses_changing_an_input():
    with pytest.raises(AssertionError, match="changed its input q"):
        lab01.check_causal_attention(scales_q_in_place)


def test_attention_top_left_message_names_the_bug():
    with pytest.raises(AssertionError, match="top-left"):
        lab01.check_causal_attention(top_left_attention)


# --- layer cache --------------------------------------------------------------------------------

def test_layer_cache_learner_copy_passes():
    lab01.check_layer_cache(LearnerLayerKVCache)
    lab01.check_cache_overflow(LearnerLayerKVCache)


class InheritingCache(LayerKVCache):
    """Subclasses the package's cache without writing update (or anything else)."""


class DelegatingCache(LearnerLayerKVCache):
    """Its own class, but update() forwards to the package's LayerKVCache.update."""

    def update(self, k, v):
        return LayerKVCache.update(self, k, v)


@pytest.mark.parametrize("check", [lab01.check_layer_cache, lab01.check_cache_overflow])
@pytest.mark.parametrize("cls,match", [(LayerKVCache, "course's reference"), (InheritingCache, "inherits"),
                                       (DelegatingCache, r"calls the course's reference \(LayerKVCache.update\)")],
                         ids=["reference", "subclass", "wrapper"])
def test_layer_cache_reference_is_refused(check, cls, match):
    with pytest.raises(ReferenceHandedIn, match=match):
        check(cls)


@pytest.mark.parametrize("cls,match", [(IgnoresDtypeCache, "dtype asked for"), (CopyingCache, "new memory")],
                         ids=["ignores-dtype-device", "returns-copies"])
def test_layer_cache_dtype_device_and_views(cls, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_layer_cache(cls)


@pytest.mark.parametrize("cls,match", [(StubCache, "not implemented"), (WrongIndexCache, "wrong at positions"),
                                       (NoAdvanceCache, "advance"), (QueryHeadCache, "KV heads"),
                                       (WholeBufferCache, "shape")])
def test_layer_cache_wrong_fails(cls, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_layer_cache(cls)


@pytest.mark.parametrize("cls,match", [(StubCache, "not implemented"), (NoBoundsCache, "should raise ValueError"),
                                       (SilentTruncateCache, "nothing was raised"), (AdvanceFirstCache, "length"),
                                       (WriteFirstCache, "stored keys"), (OffByOneBoundCache, "exactly"),
                                       (VagueErrorCache, "should name 6, 3, 8")])
def test_cache_overflow_wrong_fails(cls, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_cache_overflow(cls)


# --- generation ---------------------------------------------------------------------------------

def test_generate_learner_solution_passes():
    lab01.check_generate_kv_cache(learner_generate)


def test_generate_learner_solution_passes_with_learner_attention():
    lab01.check_generate_kv_cache(learner_generate, attention=learner_naive_attention)


@pytest.mark.parametrize("fn,match", [
    (generate_kv_cache, "course's reference"),
    (lambda model, prompt, n, sampling=SamplingParams(), **kw: generate_kv_cache(model, prompt, n, sampling, **kw),
     r"calls the course's reference \(generate_kv_cache\)"),
], ids=["reference", "wrapper"])
def test_generate_reference_is_refused(fn, match):
    with pytest.raises(ReferenceHandedIn, match=match):
        lab01.check_generate_kv_cache(fn)


def test_generate_on_the_package_cache_passes():
    """Exercise 3 grades the generator alone: a learner whose Exercise 2 failed goes on with the package's cache."""
    lab01.check_generate_kv_cache(with_layer_cache(LayerKVCache))


def test_generate_on_a_torch_cat_cache_fails():
    """Same tokens and logits as the naive loop, but the cache grows with torch.cat: the method is wrong."""
    with pytest.raises(AssertionError, match="torch.cat"):
        lab01.check_generate_kv_cache(with_layer_cache(ConcatCache))


@pytest.mark.parametrize("fn,attention,match", [
    (_stub, None, "not implemented"),
    (learner_generate_naive, None, "only the newest token"),                     # no cache at all
    (generate_rope_not_offset, None, "RoPE"),
    (with_layer_cache(WrongIndexCache), None, "logits"),
    (with_layer_cache(NoAdvanceCache), None, "advance"),
    (with_layer_cache(QueryHeadCache), None, "KV heads"),
    (with_layer_cache(WholeBufferCache), None, "whole buffer"),
    (learner_generate, top_left_attention, "logits"),
    (generate_new_generator_each_step, None, "seeded sampling"),
    (generate_tokens_on_the_default_device, None, "default device"),
    (generate_length_from_the_second_layer, None, "1 layer"),
], ids=["stub", "naive", "rope", "index", "advance", "query-heads", "whole-buffer", "top-left", "reseed",
        "default-device", "second-layer-length"])
def test_generate_wrong_fails(fn, attention, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_generate_kv_cache(fn, attention=attention)


# --- speed (CPU tier) ---------------------------------------------------------------------------

@pytest.mark.slow
def test_speed_reference_passes():
    result = lab01.check_cached_speedup(learner_generate)
    assert result["reference_speedup"] > 1.5


def test_speed_check_refuses_a_torch_cat_cache():
    """Fails before timing: the method check runs on the correctness pass."""
    with pytest.raises(AssertionError, match="torch.cat"):
        lab01.check_cached_speedup(with_layer_cache(ConcatCache), prompt_len=16, new_tokens=4)


def test_speed_check_refuses_the_reference():
    with pytest.raises(ReferenceHandedIn):
        lab01.check_cached_speedup(generate_kv_cache, prompt_len=16, new_tokens=4)


def test_speed_check_gives_each_timed_call_a_prompt_of_its_own():
    """A generator that hands back the answer it computed first (fast, and right for the correctness pass) fails:
    every timed call has a new prompt, whose tokens are checked."""
    kept: list = []

    def answer_kept_from_the_first_call(model, prompt, max_new_tokens, sampling=None, **kw):
        if not kept:
            kept.append(learner_generate(model, prompt, max_new_tokens, sampling, **kw))
        return kept[0]

    with pytest.raises(AssertionError, match="timed call #0"):
        lab01.check_cached_speedup(answer_kept_from_the_first_call, prompt_len=16, new_tokens=4, repeats=2)


def slowed(generate, factor: float):
    """generate, then a wait `factor` times as long as the call took: the right tokens, too slow for the points."""
    def slow(*args, **kwargs):
        began = time.perf_counter()
        out = generate(*args, **kwargs)
        time.sleep(factor * (time.perf_counter() - began))
        return out
    return slow


def remembering(generate):
    """generate, answering a prompt it has answered before from memory, at once (`.answers` holds them)."""
    answers: dict = {}

    def remembered(model, prompt, max_new_tokens, *args, **kwargs):
        key = (tuple(prompt), max_new_tokens)
        if key not in answers:
            answers[key] = generate(model, prompt, max_new_tokens, *args, **kwargs)
        return answers[key]
    remembered.answers = answers
    return remembered


def clockless_speedup(candidate, baseline, reference, *, repeats, warmup, rounds=SPEED_ROUNDS, **_):
    """check_speedup's calls when every round falls short and is measured again, without a clock."""
    for _ in range(rounds * (warmup + repeats)):
        for contender in (baseline, candidate, reference):
            contender()
    return {"speedup": 1.0, "reference_speedup": 1.0, "threshold": 1.0, "rounds": rounds}


def test_speed_check_a_memo_earns_no_speed():
    """A generator too slow for the points that answers a prompt it has seen from memory: the timed prompts once came
    round again in the second round of measurements, where the memo answered them at once (2 points); now every
    timed call gets a prompt never given before, so the generator is timed at its own pace."""
    with pytest.raises(AssertionError, match="speedup"):
        lab01.check_cached_speedup(remembering(slowed(learner_generate, 6)), prompt_len=16, new_tokens=4, repeats=2)


def test_speed_check_gives_every_timed_call_a_prompt_never_given_before(monkeypatch):
    """Every call of every round (three, as when each falls short) gets a new prompt, and two runs of the check share
    none: the prompts are drawn from a seed drawn per run, so none can be answered ahead."""
    monkeypatch.setattr("autograder.lab01.speed.check_speedup", clockless_speedup)
    runs = []
    for _ in range(2):
        memo = remembering(learner_generate)
        lab01.check_cached_speedup(memo, prompt_len=16, new_tokens=4, repeats=2)
        runs.append(set(memo.answers))
    # the correctness pass's prompt (asked again on the timed copy of the model), then 3 rounds of 1 + 2 timed calls
    assert [len(prompts) for prompts in runs] == [1 + 3 * 3] * 2
    assert len(runs[0] & runs[1]) == 1


def test_speed_check_judged_runs_none_of_the_course_in_the_kernel_on_the_timed_path(monkeypatch):
    """Judged, the kernel runs two course functions, before any timing: the reference guard and target_model (the copy
    of the model its generator is timed on, checked through the tokens). Each timed call is the learner's own function
    called through its handle: a memo put in a course helper's place in the kernel is never asked."""
    from autograder.checking import wire
    from tests.labs.judged_pair import judged

    asked = []
    perform = wire.Endpoint._perform

    def recording(self, op, a, opts):
        if op == "package":
            asked.append(a["path"])
        return perform(self, op, a, opts)

    monkeypatch.setattr(wire.Endpoint, "_perform", recording)
    monkeypatch.setattr("autograder.lab01.speed.check_speedup", clockless_speedup)
    memo = remembering(learner_generate)
    with judged(generate=memo) as learner:
        lab01.check_cached_speedup(learner.generate, prompt_len=16, new_tokens=4, repeats=2)
    assert asked == ["autograder.checking.reference_guard:own_work", "autograder.lab01.speed:target_model"]
    assert len(memo.answers) == 1 + 3 * 3


@pytest.mark.slow
def test_speed_naive_fails():
    """No cache at all: refused on the method (decode steps re-run the whole sequence) before any timing."""
    with pytest.raises(AssertionError, match="only the newest token"):
        lab01.check_cached_speedup(learner_generate_naive)


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
    lab01.check_q1_kv_bytes_per_token(2 * 28 * 4 * 128 * 1)
    lab01.check_q2_max_batch(80)
    lab01.check_q3_attention_pairs(100 * 101 // 2 + sum(100 + j for j in range(1, 50)))
    lab01.check_q4_kv_crossover_context(3577)


@pytest.mark.parametrize("check,wrong,diagnosis", [
    (lab01.check_q1_kv_bytes_per_token, 28 * 4 * 128, "factor 2"),                     # forgot K and V
    (lab01.check_q1_kv_bytes_per_token, 2 * 28 * 4 * 128 * 2, "1 byte"),                # bf16, not fp8
    (lab01.check_q1_kv_bytes_per_token, 2 * 28 * 28 * 128, "query heads"),
    (lab01.check_q1_kv_bytes_per_token, _stub, "finite int"),
    (lab01.check_q2_max_batch, 40, None),
    (lab01.check_q2_max_batch, "80", "finite int"),
    (lab01.check_q3_attention_pairs, 100 * 100 + sum(100 + j for j in range(1, 50)), "triangle"),
    (lab01.check_q3_attention_pairs, 5050 + sum(100 + j for j in range(1, 51)), "one decode step too many"),
    (lab01.check_q3_attention_pairs, 4950 + sum(99 + j for j in range(1, 50)), "itself"),
    (lab01.check_q3_attention_pairs, sum((100 + i) * (101 + i) // 2 for i in range(50)), "naive loop"),
    (lab01.check_q3_attention_pairs, 6225, None),                                          # the old question's answer
    (lab01.check_q4_kv_crossover_context, 114441, "batch of 32"),                       # one sequence's cache
    (lab01.check_q4_kv_crossover_context, 895, "8 KV heads"),                           # query heads cached
    (lab01.check_q4_kv_crossover_context, 7153, "factor 2"),                            # K only
    (lab01.check_q4_kv_crossover_context, 7153, "2 bytes per element"),                 # fp8, same value: both said
    (lab01.check_q4_kv_crossover_context, 3576, "off by one"),
    (lab01.check_q4_kv_crossover_context, 3577.0, "is right but"),
    (lab01.check_q4_kv_crossover_context, 989 / 3.35 / 2, None),                        # the old question's answer
])
def test_interview_wrong_fails(check, wrong, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        check(wrong)


def test_q4_key_from_first_principles_and_mistakes_distinct():
    """KV bytes per step at context t: 32 sequences * t * (2 * 32 * 8 * 128 * 2) bytes; the first t above 15e9."""
    from autograder.lab01.questions import _q4_crossover
    per_step_per_token = 32 * 2 * 32 * 8 * 128 * 2
    t = 1
    while t * per_step_per_token <= 15.0e9:
        t += 1 if t * per_step_per_token > 14.9e9 else max(1, int((15.0e9 - t * per_step_per_token) // per_step_per_token))
    assert t == _q4_crossover() == 3577
    wrongs = {_q4_crossover(batch=1), _q4_crossover(heads=32), _q4_crossover(kv_factor=1), _q4_crossover(kv_bytes=1)}
    assert 3577 not in wrongs and 3576 not in wrongs


# --- profiling questions: graded against the learner's own profiles -------------------------------

@pytest.fixture(scope="module")
def profiles():
    """Profiles of four tiny forward passes, as the notebook builds them (a small model keeps this test cheap)."""
    from minigpt.model import GPT
    from minigpt.teaching.profiling import quiet_profile
    torch.manual_seed(0)
    model = GPT(lab01.SMALL_CONFIGS["GQA 4q/2kv"]).eval()
    g = torch.Generator().manual_seed(0)
    out = {}
    for kind, T, start in (("prefill", 8, 0), ("decode", 1, 15)):
        for batch in (1, 32):
            tokens = torch.randint(0, 255, (batch, T), generator=g)
            cache = KVCache.for_model(model, batch, max_seq_len=16)
            with torch.inference_mode(), quiet_profile() as prof:
                for layer in cache:
                    layer.length = start
                model(tokens, positions=cache.next_positions(T), kv_caches=cache)
            out[kind, batch] = prof
    return out


def _dominant(prof):
    from minigpt.teaching.profiling import self_seconds_by_category
    seconds = self_seconds_by_category(prof)
    return max(seconds, key=seconds.get)


def test_q5_accepts_what_the_profile_says(profiles):
    lab01.check_q5_dominant_category({key: _dominant(p) for key, p in profiles.items()}, profiles)


def test_q5_rejects_the_least_category(profiles):
    from minigpt.teaching.profiling import self_seconds_by_category
    least = {key: min(self_seconds_by_category(p), key=self_seconds_by_category(p).get) for key, p in profiles.items()}
    with pytest.raises(AssertionError, match="takes more self time"):
        lab01.check_q5_dominant_category(least, profiles)


@pytest.mark.parametrize("answer,match", [
    ("matmul", "dict"),
    ({("prefill", 1): "mm"}, "must be one of"),
])
def test_q5_malformed_answers_fail(profiles, answer, match):
    with pytest.raises(AssertionError, match=match):
        lab01.check_q5_dominant_category(answer, profiles)


def test_q5_needs_the_profiles():
    with pytest.raises(AssertionError, match="profiling cell"):
        lab01.check_q5_dominant_category({}, {})


def test_q6_against_the_learner_profile(profiles):
    from minigpt.teaching.profiling import self_seconds_total
    decode, prefill = self_seconds_total(profiles["decode", 1]), self_seconds_total(profiles["prefill", 1])
    lab01.check_q6_decode_position_cost(decode / (prefill / 8), profiles, 8)
    with pytest.raises(AssertionError, match="PER POSITION"):
        lab01.check_q6_decode_position_cost((prefill / 8) / decode, profiles, 8)
    with pytest.raises(AssertionError, match="divide its time by 8"):
        lab01.check_q6_decode_position_cost(decode / prefill, profiles, 8)
