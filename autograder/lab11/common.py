"""What lab 11's checks share: the small seeded models the connector checks run, their prompts, and the judge's
ends of a connector (a logged runner and channels, the decode side's block store)."""

from __future__ import annotations

import torch

from minigpt.config import ModelConfig
from minigpt.disagg.layerwise import LayerRunner
from minigpt.disagg.receiver import DecodeKVStore
from minigpt.model import GPT

CONFIGS = {
    "GQA 4q/2kv, 3 layers": ModelConfig(vocab_size=64, max_seq_len=64, d_model=32, n_layers=3, n_heads=4,
                                        n_kv_heads=2, d_ff=48),
    "MHA 2q/2kv, 2 layers": ModelConfig(vocab_size=64, max_seq_len=64, d_model=16, n_layers=2, n_heads=2,
                                        n_kv_heads=2, d_ff=32),
    "MQA 4q/1kv, 4 layers": ModelConfig(vocab_size=64, max_seq_len=64, d_model=32, n_layers=4, n_heads=4,
                                        n_kv_heads=1, d_ff=48),
}


def model(name: str, seed: int = 0) -> GPT:
    """A small model with seeded weights (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(CONFIGS[name]).eval()


def prompt(name: str, length: int, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CONFIGS[name].vocab_size, (length,), generator=g).tolist()


def layer_kv(m: GPT, tokens: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """Every layer's (k, v), each (T, n_kv_heads, head_dim), and the greedy first token: the truth a producer sends."""
    runner = LayerRunner(m)
    with torch.no_grad():
        x = runner.embed(tokens)
        kvs = []
        for i in range(runner.n_layers):
            x, k, v = runner.layer(i, x)
            kvs.append((k.clone(), v.clone()))
        return kvs, int(runner.logits(x).argmax())


def store(m: GPT, num_blocks: int, block_size: int) -> DecodeKVStore:
    return DecodeKVStore.for_model(m, num_blocks=num_blocks, block_size=block_size)
