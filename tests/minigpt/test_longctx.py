"""minigpt.longctx: RoPE scaling, the ring-buffer cache, eviction, ring attention and the serving cost model.

Each test uses a tiny seeded model or seeded tensors; together about 11 s on the shared 2-core machine."""

from __future__ import annotations

import math

import pytest
import torch

from minigpt.attention import naive_attention
from minigpt.config import ModelConfig
from minigpt.longctx import kv_compression as kvc
from minigpt.longctx.eviction import (compressed_prompt_attention, h2o_mask, keep_positions, kept_attention_mass,
                                      observation_scores, snapkv_keep)
from minigpt.longctx.long_forward import bucket_perplexity, long_logits, position_nll, swapped_attention
from minigpt.longctx.ring_attention import ring_attention, ring_bytes_per_rank, ring_pass, ring_worker
from minigpt.longctx.rope_scaling import (base_inv_freq, correction_dim, rotations_in_context, scaled_inv_freq,
                                         yarn_logit_scale)
from minigpt.longctx.serving_cost import chunked_prefill
from minigpt.longctx.sliding_window import RingKVCache, cached_logits, kept_positions, streaming_attention
from minigpt.model import GPT
from minigpt.parallel.launch import run_ranks
from minigpt.costmodel.calculators import PRESETS, prefill_flops
from minigpt.costmodel.hardware import ACCELERATORS

CFG = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CFG).eval()


def _tokens(T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(seed))


def test_scaling_methods_keep_or_stretch_the_right_pairs() -> None:
    f = base_inv_freq(64, 10_000.0)
    assert torch.allclose(scaled_inv_freq(64, 10_000.0, 8, "pi", 512), f / 8)
    ntk = scaled_inv_freq(64, 10_000.0, 8, "ntk", 512)
    assert ntk[0] == f[0] and math.isclose(ntk[-1], f[-1] / 8, rel_tol=1e-9)
    yarn = scaled_inv_freq(64, 10_000.0, 8, "yarn", 512)
    turns = rotations_in_context(f, 512)
    assert torch.equal(yarn[turns >= 32], f[turns >= 32])
    assert torch.allclose(yarn[turns <= 1], f[turns <= 1] / 8)
    assert yarn_logit_scale(1.0) == 1.0 and math.isclose(yarn_logit_scale(8.0), (0.1 * math.log(8) + 1) ** 2)
    with pytest.raises(ValueError, match="unknown RoPE scaling"):
        scaled_inv_freq(64, 10_000.0, 2, "linear", 512)
    with pytest.raises(ValueError, match="unknown YaRN ramp"):
        scaled_inv_freq(64, 10_000.0, 2, "yarn", 512, ramp="cosine")


@pytest.mark.parametrize("head_dim, theta, factor, trained", [(64, 1e4, 8.0, 512), (128, 5e5, 16.0, 8192),
                                                              (128, 1e4, 4.0, 4096)])
def test_yarn_index_ramp_is_transformers_own(head_dim, theta, factor, trained) -> None:
    """ramp="index" equals Transformers' _compute_yarn_parameters (the library vLLM mirrors), and its attention factor
    squared is yarn_logit_scale; the paper's ramp keeps and interpolates the same pairs, blends the rest otherwise."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import _compute_yarn_parameters
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=int(trained * factor),
                         rope_parameters={"rope_type": "yarn", "factor": factor, "rope_theta": theta,
                                          "original_max_position_embeddings": trained})
    inv_freq, attention_factor = _compute_yarn_parameters(config)
    index = scaled_inv_freq(head_dim, theta, factor, "yarn", trained, ramp="index")
    torch.testing.assert_close(index, inv_freq.double(), rtol=1e-6, atol=0)
    assert attention_factor ** 2 == pytest.approx(yarn_logit_scale(factor))
    turns_ramp = scaled_inv_freq(head_dim, theta, factor, "yarn", trained)
    f = base_inv_freq(head_dim, theta)
    low, high = math.floor(correction_dim(32, head_dim, theta, trained)), math.ceil(correction_dim(1, head_dim, theta, trained))
    assert torch.equal(index[:low + 1], f[:low + 1]) and torch.allclose(index[high:], f[high:] / factor)
    assert not torch.allclose(index, turns_ramp)


def test_long_logits_equal_the_model_inside_its_context(model) -> None:
    tokens = _tokens(20)
    f = base_inv_freq(CFG.head_dim, CFG.rope_theta)
    with torch.no_grad():
        want = model(tokens)
    torch.testing.assert_close(long_logits(model, tokens, f), want, atol=1e-5, rtol=1e-5)
    assert position_nll(model, _tokens(100), f).shape == (1, 99)          # past max_seq_len is allowed here


def test_swapped_attention_restores_the_model(model) -> None:
    before = [b.attn.attention for b in model.layers]
    with pytest.raises(RuntimeError):
        with swapped_attention(model, naive_attention):
            raise RuntimeError("boom")
    assert [b.attn.attention for b in model.layers] == before


@pytest.mark.parametrize("window, sinks, prefill", [(8, 0, 5), (8, 3, 11), (5, 2, 1), (64, 0, 10)])
def test_ring_cache_equals_masked_streaming_attention(model, window, sinks, prefill) -> None:
    tokens = _tokens(50)
    f = base_inv_freq(CFG.head_dim, CFG.rope_theta)
    want = long_logits(model, tokens, f, attention=streaming_attention(window, sinks, f, block=7))
    caches = [RingKVCache(1, CFG.n_kv_heads, CFG.head_dim, window, sinks, f) for _ in range(CFG.n_layers)]
    nbytes = caches[0].nbytes
    got = cached_logits(model, tokens, caches, f, prefill=min(prefill, window + sinks))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert caches[0].nbytes == nbytes == 2 * (window + sinks) * CFG.n_kv_heads * CFG.head_dim * 4


def test_a_window_as_long_as_the_sequence_is_full_attention(model) -> None:
    tokens, f = _tokens(40), base_inv_freq(CFG.head_dim, CFG.rope_theta)
    torch.testing.assert_close(long_logits(model, tokens, f, attention=streaming_attention(40)),
                               long_logits(model, tokens, f), atol=1e-5, rtol=1e-5)


def test_ring_cache_refuses_an_evicting_chunk_unchanged() -> None:
    cache = RingKVCache(1, 2, 8, window=4)
    k = torch.randn(1, 3, 2, 8, generator=torch.Generator().manual_seed(0))
    cache.update(k, k)
    with pytest.raises(ValueError, match="one at a time"):
        cache.update(torch.cat([k, k], 1), torch.cat([k, k], 1))
    assert cache.length == 3 and kept_positions(7, 4, 2) == [0, 1, 3, 4, 5, 6]
    with pytest.raises(ValueError, match="inv_freq"):
        RingKVCache(1, 2, 8, window=4, n_sinks=2)


def test_snapkv_keeps_the_observation_window_and_the_most_voted() -> None:
    scores = torch.zeros(1, 2, 10)
    scores[0, :, 3] = 1.0
    scores[0, :, 5] = 0.5
    assert snapkv_keep(scores, 4, 2).tolist() == [[3, 5, 8, 9]]
    one_vote = torch.zeros(1, 2, 12)
    one_vote[0, :, 4] = 1.0
    one_vote[0, :, 8] = 0.4
    assert snapkv_keep(one_vote, 5, 2)[0, [0, 2]].tolist() == [4, 8]               # the two voted, a tie for the third
    assert snapkv_keep(one_vote, 5, 2, kernel=3).tolist() == [[3, 4, 5, 10, 11]]      # the voted token's neighbours
    with pytest.raises(ValueError, match="odd"):
        snapkv_keep(one_vote, 5, 2, kernel=2)
    with pytest.raises(ValueError):
        snapkv_keep(scores, 1, 2)


def test_eviction_policies_and_kept_mass(model) -> None:
    tokens, f = _tokens(30), base_inv_freq(CFG.head_dim, CFG.rope_theta)
    full = position_nll(model, tokens, f)
    torch.testing.assert_close(position_nll(model, tokens, f, attention=compressed_prompt_attention(20, 20, "window")),
                               full, atol=1e-5, rtol=1e-5)                          # budget = prompt: nothing dropped
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 4, 30, 8, generator=g), torch.randn(1, 2, 30, 8, generator=g)
    assert keep_positions("sinks+window", q, k, 20, 8).tolist()[0] == [0, 1, 2, 3, 16, 17, 18, 19]
    assert observation_scores(q, k, 20, 4).sum(-1).allclose(torch.full((2, 4), 2.0))      # 2 query heads per KV head
    assert kept_attention_mass(q, k, 20, torch.ones(2, 20, dtype=torch.bool)) == pytest.approx(1.0)
    record: list[float] = []
    position_nll(model, tokens, f, attention=compressed_prompt_attention(20, 6, "snapkv", obs_window=4, record=record))
    assert len(record) == CFG.n_layers and all(0 < m < 1 for m in record)


def test_h2o_keeps_its_budget_and_evicts_as_it_decodes() -> None:
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 40, 8, generator=g), torch.randn(1, 2, 40, 8, generator=g)
    mask = h2o_mask(q, k, 30, 10)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    assert not (mask & ~causal).any()                                          # never a future key
    assert (mask[:, 30:].sum(-1) == 10).all()                                  # the budget, counting the new token
    assert all(mask[h, t, t] for h in range(2) for t in range(40))             # each query sees itself
    kept = mask[:, 29, :30]
    assert kept.sum(-1).tolist() == [10, 10] and kept[:, 25:30].all()          # half recent, half heavy hitters
    for t in range(31, 40):                                                    # evicted once, never back
        assert not (mask[:, t, :t] & ~mask[:, t - 1, :t]).any()
    assert keep_positions("h2o", q, k, 30, 10).tolist() == kept.nonzero()[:, 1].view(2, -1).tolist()
    with pytest.raises(ValueError):
        h2o_mask(q, k, 30, 40)
    v = torch.randn(1, 2, 40, 8, generator=g)
    record: list[float] = []
    out = compressed_prompt_attention(30, 10, "h2o", record=record)(q, k, v)
    assert out.shape == q.shape and torch.isfinite(out).all() and 0 < record[0] < 1


@pytest.mark.parametrize("n, backend", [(3, "threads"), (2, "gloo")])
def test_ring_attention_equals_causal_attention_and_counts_bytes(n, backend) -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 4, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)
    outs = run_ranks(ring_worker, n, ring_attention, q, k, v, backend=backend, timeout_s=60)
    torch.testing.assert_close(torch.cat([o for o, _, _ in outs], 2), naive_attention(q, k, v), atol=1e-5, rtol=1e-5)
    assert all(b["ring_send"] == ring_bytes_per_rank(12, n, 1, 2, 8, 4) for _, _, b in outs)
    outs = run_ranks(ring_worker, n, ring_attention, q, k, v, False, backend="threads", timeout_s=60)
    want = torch.softmax(q @ k.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8), -1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(torch.cat([o for o, _, _ in outs], 2), want, atol=1e-5, rtol=1e-5)


def test_ring_pass_is_the_communicators_ring_pass() -> None:
    """The notebook's `ra.ring_pass(comm, t)` asks the communicator itself (a judge's communicator serves it)."""
    class Recording:
        def __init__(self) -> None:
            self.sent: list[torch.Tensor] = []

        def ring_pass(self, t: torch.Tensor) -> torch.Tensor:
            self.sent.append(t)
            return t + 1
    comm, t = Recording(), torch.zeros(2)
    assert torch.equal(ring_pass(comm, t), torch.ones(2)) and comm.sent == [t]


def test_kv_layouts() -> None:
    L = kvc.LAYOUTS
    assert L["Llama-3-8B (GQA)"].bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert L["DeepSeek-V2 (MLA)"].bytes_per_token() == 60 * 576 * 2
    assert kvc.kv_bytes(L["Llama-2-7B (MHA)"], 1000, 2) == 2 * 1000 * 2 * 32 * 32 * 128 * 2
    with pytest.raises(ValueError):
        kvc.kv_elements_per_token_layer("GQA", 32, 5, 128)


def test_chunked_prefill_sums_to_one_prefill() -> None:
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    one, chunked = chunked_prefill(shape, 8192, 8192, gpu), chunked_prefill(shape, 8192, 1000, gpu)
    assert one.flops == chunked.flops == prefill_flops(shape, 8192)
    assert len(chunked.chunks) == 9 and chunked.chunks[-1].tokens == 192
    assert chunked.bytes > one.bytes and 0 < one.attention_share < 1
    assert chunked_prefill(shape, 8192, 64, gpu).time_s > one.time_s                # tiny chunks re-read the weights


