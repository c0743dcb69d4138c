"""Shared pieces of the lab 01 checks: the small seeded models, the references the checks refuse, tolerances,
the names of the calibrated speed checks."""

from __future__ import annotations

import torch

from minigpt import attention as attention_module
from minigpt.cache.contiguous import KVCache
from minigpt.cache.contiguous import LayerKVCache as ReferenceLayerKVCache
from minigpt.config import ModelConfig
from minigpt.model import GPT

# Small models for the correctness checks: GQA (2 query heads per KV head), MQA (one KV head), and one layer of
# MHA (a generator that reads the second layer's cache for the length has none there).
SMALL_CONFIGS = {
    "GQA 4q/2kv": ModelConfig(vocab_size=256, max_seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128),
    "MQA 4q/1kv": ModelConfig(vocab_size=256, max_seq_len=48, d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=128),
    "1 layer MHA 2q/2kv": ModelConfig(vocab_size=256, max_seq_len=32, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2,
                                      d_ff=64),
}

# Speed thresholds: the learner's speedup over the baseline must reach a fraction of the reference's speedup
# measured in the same run. The fractions are calibrated per device class by `make calibrate` (autograder/gpu_tier/calibrate.py,
# files autograder/calibration/<check>.<device class>.json), between the reference's ratio and a slow implementation's.
CACHED_SPEED_CHECK = "lab01_cached_speedup"       # slow implementation: generate_naive (recomputes everything)
GRAPH_SPEED_CHECK = "lab01_cuda_graph_decode"     # slow implementation: the fixed-shape step run eagerly (no graph)

ATOL = 1e-4     # float32 logits: cached vs full recomputation differ only by summation order

# The package's attention functions: the reference of Exercise 1 (the setup cell imports naive_attention).
REFERENCE_ATTENTION = tuple(f for name, f in vars(attention_module).items()
                            if callable(f) and getattr(f, "__module__", None) == attention_module.__name__
                            and not isinstance(f, type) and not name.startswith("_"))
# The package's caches and cached generator: the references of Exercises 2 and 3.
REFERENCE_CACHES = (ReferenceLayerKVCache, KVCache)


def small_model(name: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(SMALL_CONFIGS[name]).eval()


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (n,), generator=g).tolist()
