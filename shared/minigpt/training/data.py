"""The corpus as token ids, and random training windows."""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from minigpt.paths import data_dir
from minigpt.tokenizer import EOT, load_tokenizer


def read_split(split: str) -> str:
    """The raw text of "train" or "val" (documents joined by <|endoftext|>)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    path = data_dir() / "corpus" / f"{split}.txt"
    if not path.exists():
        raise FileNotFoundError(f"corpus file {path} not found; restore data/ from git")
    return path.read_text(encoding="utf-8")


@lru_cache(maxsize=2)
def load_tokens(split: str) -> Tensor:
    """All tokens of a split as one int64 stream (end-of-text between documents)."""
    ids = load_tokenizer().encode(read_split(split), allowed_special={EOT})
    return torch.tensor(ids, dtype=torch.long)


def random_windows(tokens: Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets, both (batch_size, seq_len), from random offsets."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    x = torch.stack([tokens[s:s + seq_len] for s in starts.tolist()])
    y = torch.stack([tokens[s + 1:s + seq_len + 1] for s in starts.tolist()])
    return x, y


def eval_windows(tokens: Tensor, seq_len: int, max_windows: int | None = None) -> tuple[Tensor, Tensor]:
    """Non-overlapping windows covering the split from its start: (N, seq_len) inputs and targets."""
    n = (len(tokens) - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    x = tokens[: n * seq_len].view(n, seq_len)
    y = tokens[1: n * seq_len + 1].view(n, seq_len)
    return x, y
