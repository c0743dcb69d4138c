"""The engine-style fused decode step: the model's logits to float32 rounding, the same greedy tokens, clear refusals."""

from __future__ import annotations

import pytest
import torch
from minigpt_fixtures import TINY

from minigpt.cache.contiguous import KVCache
from minigpt.config import Llama3RopeScaling, ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.fused_decode import FusedDecodeStep, generate_fused
from minigpt.model import GPT


def _model(config: ModelConfig) -> GPT:
    torch.manual_seed(0)
    return GPT(config).eval()


@pytest.mark.parametrize("config", [TINY, ModelConfig(**{**TINY.__dict__, "n_kv_heads": 4}),
                                    ModelConfig(**{**TINY.__dict__, "rope_scaling": Llama3RopeScaling(
                                        factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8)})],
                         ids=["gqa", "mha", "llama3-rope-scaling"])
@torch.inference_mode()
def test_logits_match_the_model_step_by_step(config):
    model = _model(config)
    step = FusedDecodeStep(model)
    prompts = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    fused_cache, ref_cache = KVCache.for_model(model, 2, 16), KVCache.for_model(model, 2, 16)
    for cache in (fused_cache, ref_cache):
        logits = model(prompts, positions=cache.next_positions(5), kv_caches=cache)[:, -1]
    tokens = logits.argmax(-1)
    for _ in range(8):
        ours = step(tokens, fused_cache)
        theirs = model(tokens[:, None], positions=ref_cache.next_positions(1), kv_caches=ref_cache)[:, -1]
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        tokens = theirs.argmax(-1)
    assert fused_cache.length == ref_cache.length == 13
    torch.testing.assert_close(fused_cache.layers[0].k[:, :13], ref_cache.layers[0].k[:, :13], rtol=1e-4, atol=1e-5)


def test_greedy_tokens_equal_lab_01s(tiny_model):
    prompt = [5, 9, 2, 7]
    assert generate_fused(tiny_model, prompt, 12) == generate_kv_cache(tiny_model, prompt, 12, stop_token_ids=()).tokens
    assert generate_fused(tiny_model, prompt, 0) == []


def test_refusals(tiny_model):
    from minigpt.quant.linear import quantize_weight_only
    quantized = quantize_weight_only(_model(TINY), bits=8)
    with pytest.raises(TypeError, match="plain nn.Linear"):
        FusedDecodeStep(quantized)
    cache = KVCache.for_model(tiny_model, 1, 3)
    step = FusedDecodeStep(tiny_model)
    for _ in range(3):
        step(torch.tensor([1]), cache)
    with pytest.raises(ValueError, match="cache is full"):
        step(torch.tensor([1]), cache)
