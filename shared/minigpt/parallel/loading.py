"""Sharded checkpoint loading: each rank reads only its slices of the safetensors file.

`safe_open` maps the file lazily; `get_slice(name)[rows, cols]` reads just those bytes, so with tp ranks
each reads about 1/tp of every split weight (plus the replicated norms, and the whole embedding unless
it is vocabulary-parallel). The file's sha256 is not checked here, since that would read every byte on
every rank; `minigpt.checkpoint.load_model` checks it in the single-process path. A Hugging Face folder
(one or several safetensors files) is read the same way, tensor names translated by `minigpt.hf.weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import safe_open
from torch import Tensor

from minigpt.checkpoint import CheckpointError, checkpoint_paths, load_card
from minigpt.config import ModelConfig
from minigpt.parallel.sharding import shard_slices

__all__ = ["ShardedWeights", "load_shard"]


@dataclass
class ShardedWeights:
    config: ModelConfig
    state: dict[str, Tensor]          # this rank's pieces, by GPT state_dict name
    bytes_read: int                   # bytes of the file this rank read (storage dtype)
    file_bytes: int                   # bytes of all tensors in the file


def load_shard(name_or_path: str | Path, tp: int, rank: int, *, vocab_parallel: bool = False,
               dtype: torch.dtype = torch.float32) -> ShardedWeights:
    """Rank `rank` of `tp`: read its piece of every tensor in the checkpoint (see sharding.shard_slices)."""
    from minigpt.hf.loading import is_hf_folder
    if is_hf_folder(name_or_path):
        return _load_hf_shard(Path(name_or_path), tp, rank, vocab_parallel=vocab_parallel, dtype=dtype)
    weights, _ = checkpoint_paths(name_or_path)
    cfg = ModelConfig.from_dict(load_card(name_or_path)["config"])
    if not weights.exists():
        raise CheckpointError(f"checkpoint weights {weights} not found; restore data/ from git or run `make models`")
    with safe_open(str(weights), framework="pt") as f:
        return _read_shards(cfg, ((name, f.get_slice(name)) for name in f.keys()), tp, rank,
                            vocab_parallel=vocab_parallel, dtype=dtype)


def _load_hf_shard(folder: Path, tp: int, rank: int, *, vocab_parallel: bool, dtype: torch.dtype) -> ShardedWeights:
    from minigpt.hf.loading import load_hf_config
    from minigpt.hf.weights import checkpoint_tensors

    cfg = load_hf_config(folder)
    slices = ((name, f.get_slice(hf_name)) for name, hf_name, f in checkpoint_tensors(folder)
              if not (cfg.tie_embeddings and name == "lm_head.weight"))
    return _read_shards(cfg, slices, tp, rank, vocab_parallel=vocab_parallel, dtype=dtype)


def _read_shards(cfg: ModelConfig, slices: Iterable[tuple[str, Any]], tp: int, rank: int, *, vocab_parallel: bool,
                 dtype: torch.dtype) -> ShardedWeights:
    """Rank `rank`'s piece of each (name, safetensors slice), read without the rest of the tensor: the rows and
    columns of shard_slices, cast to dtype; bytes_read counts the pieces, file_bytes the whole tensors."""
    state: dict[str, Tensor] = {}
    bytes_read = file_bytes = 0
    for name, full in slices:
        shape = full.get_shape()
        rows, cols = shard_slices(name, cfg, tp, rank, vocab_parallel=vocab_parallel)
        piece = full[rows] if len(shape) == 1 else full[rows, cols]
        state[name] = piece.to(dtype)
        bytes_read += piece.numel() * piece.element_size()
        file_bytes += _numel(shape) * piece.element_size()
    return ShardedWeights(cfg, state, bytes_read, file_bytes)


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
