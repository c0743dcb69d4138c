"""Small shapes shared by the package tests (imported by conftest.py and the test modules)."""

from minigpt.config import ModelConfig

TINY = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
