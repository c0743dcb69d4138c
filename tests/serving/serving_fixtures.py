"""Helpers shared by the serving tests (imported by name, like tests/minigpt/minigpt_fixtures.py)."""

from __future__ import annotations

import torch

from minigpt.config import ModelConfig
from minigpt.model import GPT

# A tiny random model over the course vocabulary, so the course tokenizer (text prompts) works with it.
TINY_SERVING = ModelConfig(vocab_size=4096, max_seq_len=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)


def tiny_model(seed: int = 0, config: ModelConfig = TINY_SERVING) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()
