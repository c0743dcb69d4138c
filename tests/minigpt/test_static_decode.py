"""minigpt.engine.static_decode: the fused, fixed-shape decode step gives the model's logits and writes one slot."""

from __future__ import annotations

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.engine.static_decode import MATRICES, decode_step, empty_cache, fuse_weights
from minigpt.model import GPT


@pytest.mark.parametrize("tie", [True, False])
def test_the_step_gives_the_models_logits_at_every_position(tie):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=97, max_seq_len=24, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                d_ff=48, tie_embeddings=tie)).eval()
    cfg = model.config
    tokens = torch.randint(0, cfg.vocab_size, (cfg.max_seq_len,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        full = model(torch.tensor([tokens]), positions=torch.arange(len(tokens)))[0]
    w = fuse_weights(model.state_dict(), cfg)
    assert all(len(w[key]) == cfg.n_layers and w[key][0].is_contiguous() for key in MATRICES)
    assert w["head"].shape == (cfg.d_model, cfg.vocab_size)
    k, v = empty_cache(cfg)
    for position, token in enumerate(tokens):
        before = k.clone()
        logits = decode_step(w, cfg, token, position, k, v)
        torch.testing.assert_close(logits, full[position], atol=1e-5, rtol=1e-5)
        others = torch.arange(cfg.max_seq_len) != position
        assert torch.equal(k[:, others], before[:, others])
