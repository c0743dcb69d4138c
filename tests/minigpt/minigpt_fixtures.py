"""Small shapes shared by the package tests (imported by conftest.py and the test modules)."""

from typing import Callable, TypeVar

import torch

from minigpt.config import ModelConfig

T = TypeVar("T")


def seeded(seed: int, build: Callable[[], T]) -> T:
    """build() with the global RNG seeded (nn.Linear draws its initial weights from it), the RNG restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()

TINY = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
