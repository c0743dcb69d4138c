"""minigpt.cache.contiguous and minigpt.engine (lab 01): the reference cache and cached generator match full recomputation."""

import pytest
import torch
from recorded_logprobs import assert_same_steps, record_sampling

import minigpt.generate as naive_generation
from minigpt.config import TARGET_CONFIG
from minigpt.generate import generate_naive
from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.engine import cached_generation
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.cuda_graph import GraphedDecodeStep, static_attention
from minigpt.attention import naive_attention
from minigpt.sampling import SamplingParams


def test_layer_cache_writes_and_returns_all_positions():
    cache = LayerKVCache(2, 6, 3, 4)
    assert cache.k.shape == (2, 6, 3, 4) and cache.length == 0
    k1, v1 = torch.randn(2, 4, 3, 4), torch.randn(2, 4, 3, 4)
    k2, v2 = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    cache.update(k1, v1)
    k_all, v_all = cache.update(k2, v2)
    assert cache.length == 5
    assert torch.equal(k_all, torch.cat([k1, k2], 1)) and torch.equal(v_all, torch.cat([v1, v2], 1))
    cache.reset()
    assert cache.length == 0 and torch.equal(cache.update(k2, v2)[0], k2)


def test_overflow_raises_and_leaves_state_alone():
    cache = LayerKVCache(1, 4, 1, 2)
    cache.update(torch.ones(1, 3, 1, 2), torch.ones(1, 3, 1, 2))
    before = cache.k.clone()
    with pytest.raises(ValueError, match="needs 5 positions but the cache holds max_seq_len=4"):
        cache.update(torch.zeros(1, 2, 1, 2), torch.zeros(1, 2, 1, 2))
    assert cache.length == 3 and torch.equal(cache.k, before)
    cache.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))        # exactly full is fine
    assert cache.length == 4


def test_wrong_head_count_is_refused():
    cache = LayerKVCache(1, 4, 2, 8)
    with pytest.raises(ValueError, match="n_kv_heads=2"):
        cache.update(torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8))
    with pytest.raises(ValueError, match="positive"):
        LayerKVCache(1, 0, 2, 8)


def test_bytes_follow_the_formula():
    cfg = TARGET_CONFIG
    cache = KVCache.for_model(cfg, batch_size=3, max_seq_len=100, dtype=torch.bfloat16)
    assert cache.nbytes == 2 * cfg.n_layers * 3 * 100 * cfg.n_kv_heads * cfg.head_dim * 2
    assert len(cache) == cfg.n_layers and cache[0].k.shape == (3, 100, cfg.n_kv_heads, cfg.head_dim)


def test_cached_logits_match_full_recompute(tiny_model):
    cache = KVCache.for_model(tiny_model)
    ids = torch.randint(0, 64, (1, 10))
    with torch.inference_mode():
        full = tiny_model(ids)
        prefill = tiny_model(ids[:, :6], positions=cache.next_positions(6), kv_caches=cache)
        chunk = tiny_model(ids[:, 6:9], positions=cache.next_positions(3), kv_caches=cache)
        step = tiny_model(ids[:, 9:], positions=cache.next_positions(1), kv_caches=cache)
    torch.testing.assert_close(torch.cat([prefill, chunk, step], 1), full, atol=1e-5, rtol=1e-4)
    assert cache.length == 10


@pytest.mark.parametrize("prompt_len,new", [(1, 20), (5, 27), (31, 1), (4, 0)])
def test_greedy_identical_to_naive(tiny_model, prompt_len, new, monkeypatch):
    """The same tokens, with the same log-probabilities to rounding (this random model mostly repeats its last token:
    a cache read wrong leaves the tokens as they were, not their log-probabilities)."""
    prompt = torch.randint(0, 64, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    sampled = record_sampling(monkeypatch, naive_generation, cached_generation)
    want = generate_naive(tiny_model, prompt, new, stop_token_ids=())
    assert generate_kv_cache(tiny_model, prompt, new, stop_token_ids=()) == want
    assert_same_steps(sampled[1:], sampled[:1], "the KV cache")


def test_sampling_and_stops_identical_to_naive(tiny_model, monkeypatch):
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.95, seed=3)
    sampled = record_sampling(monkeypatch, naive_generation, cached_generation)
    a = generate_naive(tiny_model, [1, 2, 3], 20, params, stop_token_ids=())
    assert generate_kv_cache(tiny_model, [1, 2, 3], 20, params, stop_token_ids=()) == a
    stop = (a.tokens[4],)
    assert generate_kv_cache(tiny_model, [1, 2, 3], 20, params, stop_token_ids=stop) == \
        generate_naive(tiny_model, [1, 2, 3], 20, params, stop_token_ids=stop)
    assert_same_steps(sampled[1:3], [sampled[0], sampled[3]], "the KV cache")


def test_request_checks(tiny_model):
    with pytest.raises(ValueError, match="exceeds the context"):
        generate_kv_cache(tiny_model, [1] * 30, 3)
    cache = KVCache.for_model(tiny_model)
    cache[0].length = cache[1].length = 2
    with pytest.raises(ValueError, match="empty cache"):
        generate_kv_cache(tiny_model, [1], 3, cache=cache)
    cache[0].length = 1
    with pytest.raises(RuntimeError, match="disagree"):
        cache.length


def test_static_attention_masks_beyond_position():
    q = torch.randn(2, 4, 3, 8)
    k, v = torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    positions = torch.tensor([4, 5, 6])                   # three queries, keys 7..9 are unused slots
    got = static_attention(positions)(q, k, v)
    want = naive_attention(q, k[:, :, :7], v[:, :, :7])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_fixed_shape_decode_step_matches_eager(tiny_model):
    """The fixed-shape step (run eagerly here) gives the same logits as the ordinary cached step."""
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(5))
    a, b = KVCache.for_model(tiny_model), KVCache.for_model(tiny_model)
    with torch.inference_mode():
        for cache in (a, b):
            tiny_model(ids[:, :8], positions=cache.next_positions(8), kv_caches=cache)
        step = GraphedDecodeStep(tiny_model, b, use_graph=False)
        for p in range(8, 12):
            want = tiny_model(ids[:, p:p + 1], positions=a.next_positions(1), kv_caches=a)[:, -1]
            torch.testing.assert_close(step(ids[:, p:p + 1], p), want, atol=1e-5, rtol=1e-4)
    assert b.length == 12
    assert tiny_model.layers[0].attn.attention is not step.attention       # attention restored after the step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_decode_matches_eager(tiny_model):
    model = tiny_model.cuda()
    ids = torch.randint(0, 64, (1, 12), device="cuda")
    a, b = KVCache.for_model(model), KVCache.for_model(model)
    with torch.inference_mode():
        for cache in (a, b):
            model(ids[:, :8], positions=cache.next_positions(8), kv_caches=cache)
        step = GraphedDecodeStep(model, b)
        assert step.graph is not None
        for p in range(8, 12):
            want = model(ids[:, p:p + 1], positions=a.next_positions(1), kv_caches=a)[:, -1]
            torch.testing.assert_close(step(ids[:, p:p + 1], p), want, atol=1e-4, rtol=1e-3)
