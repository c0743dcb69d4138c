"""Fixtures for the serving tests (lab 08): tiny seeded models and engines, shared per module or session."""

from __future__ import annotations

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.model import GPT

# A tiny random model over the course vocabulary, so the course tokenizer (text prompts) works with it.
TINY_SERVING = ModelConfig(vocab_size=4096, max_seq_len=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)


def tiny_model(seed: int = 0, config: ModelConfig = TINY_SERVING) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()


@pytest.fixture(scope="session")
def tokenizer():
    from minigpt.tokenizer import load_tokenizer
    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny() -> GPT:
    return tiny_model(0)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread, and a busy 2-core machine punishes oversubscription (10x)."""
    from minigpt.timing import fixed_threads
    with fixed_threads(1):
        yield
