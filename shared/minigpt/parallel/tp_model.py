"""One rank's tensor-parallel mini-GPT and its sharded KV cache.

    comm = CountingComm(TorchDistributed())                        # or a ThreadGroup member
    model = load_tp_model("target", comm, vocab_parallel=True)     # this rank's slices only
    cache = tp_kv_cache(model.config, comm.world_size, comm.rank, max_seq_len=64)
    out = generate_kv_cache(model, prompt, 16, cache=cache)        # lab 01's loop, unchanged

The model is the ordinary `GPT`, built with `tp_linear_factory` (no fork of model.py): a rank holds
n_heads/tp query heads, their KV heads, d_ff/tp hidden units, and (vocab-parallel) V/tp embedding rows.
Its KV cache holds only its KV heads: 1/tp of the cache, or 1/n_kv_heads of it when tp > n_kv_heads
and KV heads are replicated. Every rank ends each forward pass with the same full logits.
"""

from __future__ import annotations

from pathlib import Path
import torch
from torch import Tensor

from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.linears import ColumnParallelLinear, RowParallelLinear, tp_linear_factory
from minigpt.parallel.loading import load_shard
from minigpt.parallel.sharding import check_tp, kv_heads, shard_state_dict
from minigpt.parallel.vocab_parallel import VocabParallelEmbedding, VocabParallelLMHead

__all__ = ["build_tp_model", "shard_model", "load_tp_model", "tp_kv_cache"]

def build_tp_model(cfg: ModelConfig, comm: CountingComm, state: dict[str, Tensor] | None = None, *,
                   vocab_parallel: bool = False, column_cls: type = ColumnParallelLinear,
                   row_cls: type = RowParallelLinear, attention: str = "sdpa") -> GPT:
    """Rank `comm.rank`'s model; `state` (this rank's pieces, as from shard_state_dict) is loaded strictly."""
    check_tp(cfg, comm.world_size, comm.rank, vocab_parallel=vocab_parallel)
    model = GPT(cfg, make_linear=tp_linear_factory(cfg, comm, column_cls=column_cls, row_cls=row_cls),
                attention=attention)
    if vocab_parallel:
        if not cfg.tie_embeddings:
            raise ValueError("vocab_parallel here shards the tied embedding/LM head; this config is untied")
        model.tok_emb = VocabParallelEmbedding(cfg.vocab_size, cfg.d_model, comm)
        model.lm_head = VocabParallelLMHead(model.tok_emb, comm)
    if state is not None:
        state = {k: v for k, v in state.items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"rank {comm.rank}: the shard does not fit a tp={comm.world_size} model: "
                             f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    return model.eval()


def shard_model(full: GPT, comm: CountingComm, *, vocab_parallel: bool = False, **kwargs) -> GPT:
    """Rank `comm.rank`'s tensor-parallel copy of a one-process model."""
    cfg = full.config
    state = shard_state_dict(full.state_dict(), cfg, comm.world_size, comm.rank, vocab_parallel=vocab_parallel)
    return build_tp_model(cfg, comm, state, vocab_parallel=vocab_parallel, **kwargs).to(full.dtype)


def load_tp_model(name_or_path: str | Path, comm: CountingComm, *, vocab_parallel: bool = False,
                  expected_world_size: int | None = None, device: torch.device | str = "cpu") -> GPT:
    """Read this rank's slices of a checkpoint and build its model.

    `expected_world_size`: the tensor-parallel size a deployment plan asks for; a world of another size
    is refused with a clear error before any weight is read. `device`: where the model lives (NCCL ranks
    need their own GPU, e.g. cuda:LOCAL_RANK; gloo ranks the CPU).
    """
    if expected_world_size is not None and expected_world_size != comm.world_size:
        raise ValueError(f"the plan asks for tp={expected_world_size} but the world has {comm.world_size} ranks; "
                         f"start exactly {expected_world_size} ranks (torchrun --nproc-per-node {expected_world_size})")
    shard = load_shard(name_or_path, comm.world_size, comm.rank, vocab_parallel=vocab_parallel)
    return build_tp_model(shard.config, comm, shard.state, vocab_parallel=vocab_parallel).to(device)


def tp_kv_cache(cfg: ModelConfig, tp: int, rank: int, *, batch_size: int = 1, max_seq_len: int | None = None,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> KVCache:
    """An empty KV cache for rank `rank`'s KV heads only: (B, S, len(kv_heads), head_dim) per layer."""
    n_kv = len(kv_heads(cfg, tp, rank))
    length = cfg.max_seq_len if max_seq_len is None else max_seq_len
    return KVCache([LayerKVCache(batch_size, length, n_kv, cfg.head_dim, dtype=dtype, device=device)
                    for _ in range(cfg.n_layers)])
