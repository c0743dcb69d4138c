"""The engine-style fused model: the model's logits to float32 rounding (prefill, decode, batches, caches, any
attention function), the same greedy tokens with the same log-probabilities, fresh copies when the weights change,
clear refusals."""

from __future__ import annotations

import pytest
import torch
from minigpt_fixtures import TINY
from recorded_logprobs import assert_same_steps, record_sampling, with_logprobs

from minigpt.cache.contiguous import KVCache
from minigpt.config import Llama3RopeScaling, ModelConfig
from minigpt.engine import cached_generation
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.fused_decode import FusedModel, fusable, generate_fused
from minigpt.model import GPT


def _model(config: ModelConfig = TINY) -> GPT:
    with torch.random.fork_rng():          # the weights' initialisation draws from the global generator: seeded here,
        torch.manual_seed(0)               # and the global state left as it was
        return GPT(config).eval()


@pytest.mark.parametrize("config", [TINY, ModelConfig(**{**TINY.__dict__, "n_kv_heads": 4}),
                                    ModelConfig(**{**TINY.__dict__, "rope_scaling": Llama3RopeScaling(
                                        factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8)})],
                         ids=["gqa", "mha", "llama3-rope-scaling"])
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
@torch.inference_mode()
def test_logits_match_the_model_prefill_then_decode(config, attention):
    model = _model(config)
    model.set_attention(attention)
    fused = FusedModel(model)
    prompts = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fused(prompts, torch.arange(5)), model(prompts), rtol=1e-4, atol=1e-5)
    ours, theirs = KVCache.for_model(model, 2, 16), KVCache.for_model(model, 2, 16)
    tokens = prompts
    for _ in range(8):
        a = fused(tokens, positions=ours.next_positions(tokens.shape[1]), kv_caches=ours)
        b = model(tokens, positions=theirs.next_positions(tokens.shape[1]), kv_caches=theirs)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        tokens = b[:, -1:].argmax(-1)
    torch.testing.assert_close(ours.layers[0].k[:, :13], theirs.layers[0].k[:, :13], rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_per_sequence_positions(tiny_model):
    tokens = torch.tensor([[3, 4, 5], [6, 7, 8]])
    positions = torch.tensor([[0, 1, 2], [4, 5, 6]])
    torch.testing.assert_close(FusedModel(tiny_model)(tokens, positions), tiny_model(tokens, positions),
                               rtol=1e-4, atol=1e-5)


def test_greedy_tokens_equal_lab_01s(tiny_model, monkeypatch):
    """With their log-probabilities: this random model mostly repeats its last token, so a cache read wrong would
    leave the tokens as they were."""
    prompt = [5, 9, 2, 7]
    fused, rows = FusedModel(tiny_model), []

    def recording(tokens, **kwargs):
        logits = fused(tokens, **kwargs)
        rows.append(logits[0, -1])
        return logits
    want = record_sampling(monkeypatch, cached_generation)
    tokens = generate_fused(tiny_model, prompt, 12, fused=recording)
    assert tokens == generate_kv_cache(tiny_model, prompt, 12, stop_token_ids=()).tokens
    assert_same_steps([with_logprobs(torch.stack(rows), tokens)], want, "generate_fused")
    assert generate_fused(tiny_model, prompt, 0) == []


@torch.inference_mode()
def test_copies_follow_the_model_weights(tiny_model):
    fused = FusedModel(tiny_model)
    tokens = torch.tensor([[1, 2, 3]])
    tiny_model.layers[0].mlp.w_up.weight.mul_(2.0)                 # in place
    torch.testing.assert_close(fused(tokens, torch.arange(3)), tiny_model(tokens), rtol=1e-4, atol=1e-5)
    shape = tiny_model.layers[1].attn.wq.weight.shape
    replaced = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    tiny_model.layers[1].attn.wq.weight = torch.nn.Parameter(replaced)
    torch.testing.assert_close(fused(tokens, torch.arange(3)), tiny_model(tokens), rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_copies_follow_replaced_modules_and_layers(tiny_model):
    """A projection, a block's attention, a whole block or the head replaced: the next call fuses again."""
    import copy

    fused = FusedModel(tiny_model)
    tokens = torch.tensor([[1, 2, 3]])
    donor = _model()
    with torch.no_grad():
        for p in donor.parameters():
            p.mul_(1.5)
    for replace in (lambda: setattr(tiny_model.layers[0].mlp, "w_down", copy.deepcopy(donor.layers[0].mlp.w_down)),
                    lambda: setattr(tiny_model.layers[1], "attn", copy.deepcopy(donor.layers[1].attn)),
                    lambda: tiny_model.layers.__setitem__(0, copy.deepcopy(donor.layers[0])),
                    lambda: setattr(tiny_model, "lm_head", copy.deepcopy(donor.lm_head))):
        replace()
        torch.testing.assert_close(fused(tokens, torch.arange(3)), tiny_model(tokens), rtol=1e-4, atol=1e-5)


def test_a_call_may_bring_its_own_attention(tiny_model):
    """`attention=` is used by every layer for that call only; the model's own attention is left as it was."""
    from minigpt.attention import sdpa_attention

    calls = []

    def spy(q, k, v):
        calls.append(q.shape)
        return sdpa_attention(q, k, v)
    before = [b.attn.attention for b in tiny_model.layers]
    fused = FusedModel(tiny_model)
    tokens = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(fused(tokens, torch.arange(3), attention=spy), tiny_model(tokens), rtol=1e-4, atol=1e-5)
    assert len(calls) == len(tiny_model.layers)
    assert [b.attn.attention for b in tiny_model.layers] == before


def test_refuses_models_whose_projections_are_not_plain_linears():
    from minigpt.quant.linear import quantize_weight_only

    quantized = quantize_weight_only(_model(), bits=8)
    assert fusable(_model()) and not fusable(quantized)
    with pytest.raises(TypeError, match="plain nn.Linear"):
        FusedModel(quantized)
