"""Which slice of every weight a tensor-parallel rank holds (Megatron-style), as pure functions.

For `tp` ranks and rank r (no processes needed to compute any of this):

* Column-parallel (split the OUTPUT features, rows of the (out, in) weight): wq, wk, wv, w_gate, w_up.
  Rank r computes its own heads / its own d_ff/tp hidden units; no communication.
* Row-parallel (split the INPUT features, columns of the weight): wo, w_down. Each rank's product is a
  partial sum of the full output, so an all-reduce follows: two all-reduces per layer.
* Heads stay whole and together: rank r owns query heads [r*Hq/tp, (r+1)*Hq/tp) and exactly the KV
  heads those queries read (query head h reads KV head h // (Hq/Hkv)). When tp > n_kv_heads a KV head
  is needed by several ranks and is replicated on each of them (tp/Hkv copies).
* Replicated: RMSNorm weights (they scale all d_model features, which every rank holds).
* Vocabulary-parallel (optional): the (vocab, d_model) embedding, tied to the LM head, split by rows.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from minigpt.config import ModelConfig

__all__ = ["ParallelKind", "check_tp", "query_heads", "kv_heads", "kv_replication", "ffn_units", "vocab_rows",
           "parameter_kind", "shard_slices", "shard_parameter", "shard_state_dict", "local_linear_shape"]

ParallelKind = Literal["column", "row", "replicated", "vocab"]

COLUMN = ("attn.wq", "attn.wk", "attn.wv", "mlp.w_gate", "mlp.w_up")
ROW = ("attn.wo", "mlp.w_down")


def check_tp(cfg: ModelConfig, tp: int, rank: int | None = None, *, vocab_parallel: bool = False) -> None:
    """Raise ValueError unless `tp` ranks can split `cfg` along head boundaries (and `rank` is one of them)."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tensor-parallel size must be a positive int, got {tp!r}")
    if cfg.n_heads % tp:
        raise ValueError(f"tensor-parallel size {tp} does not divide n_heads={cfg.n_heads}: a rank would hold part "
                         f"of a head; choose a divisor of {cfg.n_heads}")
    if cfg.n_kv_heads % tp and tp % cfg.n_kv_heads:
        raise ValueError(f"tensor-parallel size {tp} and n_kv_heads={cfg.n_kv_heads}: one must divide the other "
                         "(split the KV heads, or replicate each KV head on tp/n_kv_heads ranks)")
    if cfg.d_ff % tp:
        raise ValueError(f"tensor-parallel size {tp} does not divide d_ff={cfg.d_ff}")
    if vocab_parallel and cfg.vocab_size % tp:
        raise ValueError(f"tensor-parallel size {tp} does not divide vocab_size={cfg.vocab_size}")
    if rank is not None and not (isinstance(rank, int) and 0 <= rank < tp):
        raise ValueError(f"rank {rank!r} is not in [0, {tp})")


def query_heads(cfg: ModelConfig, tp: int, rank: int) -> range:
    """Query heads of `rank`: a contiguous block of n_heads/tp heads."""
    check_tp(cfg, tp, rank)
    n = cfg.n_heads // tp
    return range(rank * n, (rank + 1) * n)


def kv_heads(cfg: ModelConfig, tp: int, rank: int) -> range:
    """KV heads of `rank`: exactly those its query heads read (h // group_size for h in query_heads)."""
    q = query_heads(cfg, tp, rank)
    return range(q.start // cfg.group_size, (q.stop - 1) // cfg.group_size + 1)


def kv_replication(cfg: ModelConfig, tp: int) -> int:
    """How many ranks hold a copy of each KV head: max(1, tp / n_kv_heads)."""
    check_tp(cfg, tp)
    return max(1, tp // cfg.n_kv_heads)


def ffn_units(cfg: ModelConfig, tp: int, rank: int) -> range:
    """Hidden units of the SwiGLU MLP held by `rank`: a contiguous block of d_ff/tp."""
    check_tp(cfg, tp, rank)
    n = cfg.d_ff // tp
    return range(rank * n, (rank + 1) * n)


def vocab_rows(cfg: ModelConfig, tp: int, rank: int) -> range:
    """Vocabulary rows of the embedding (and tied LM head) held by `rank` under vocab parallelism."""
    check_tp(cfg, tp, rank, vocab_parallel=True)
    n = cfg.vocab_size // tp
    return range(rank * n, (rank + 1) * n)


def parameter_kind(name: str, *, vocab_parallel: bool = False) -> ParallelKind:
    """How the parameter called `name` (a GPT state_dict key) is split."""
    if name.endswith(tuple(f"{m}.weight" for m in COLUMN)):
        return "column"
    if name.endswith(tuple(f"{m}.weight" for m in ROW)):
        return "row"
    if name in ("tok_emb.weight", "lm_head.weight"):
        return "vocab" if vocab_parallel else "replicated"
    if name.endswith("norm.weight"):
        return "replicated"
    raise KeyError(f"no sharding rule for parameter {name!r}")


def _heads_to_rows(heads: range, head_dim: int) -> slice:
    return slice(heads.start * head_dim, heads.stop * head_dim)


def _as_slice(r: range) -> slice:
    return slice(r.start, r.stop)


def shard_slices(name: str, cfg: ModelConfig, tp: int, rank: int, *,
                 vocab_parallel: bool = False) -> tuple[slice, slice]:
    """(rows, columns) of the full (out, in) weight `name` that `rank` holds; slice(None) = all.

    1-D norm weights get (slice(None), slice(None)) and are used whole.
    """
    check_tp(cfg, tp, rank, vocab_parallel=vocab_parallel)
    everything = slice(None)
    kind = parameter_kind(name, vocab_parallel=vocab_parallel)
    hd = cfg.head_dim
    if kind == "replicated":
        return everything, everything
    if kind == "vocab":
        return _as_slice(vocab_rows(cfg, tp, rank)), everything
    if name.endswith("attn.wq.weight"):
        return _heads_to_rows(query_heads(cfg, tp, rank), hd), everything
    if name.endswith(("attn.wk.weight", "attn.wv.weight")):
        return _heads_to_rows(kv_heads(cfg, tp, rank), hd), everything
    if name.endswith(("mlp.w_gate.weight", "mlp.w_up.weight")):
        return _as_slice(ffn_units(cfg, tp, rank)), everything
    if name.endswith("attn.wo.weight"):
        return everything, _heads_to_rows(query_heads(cfg, tp, rank), hd)
    return everything, _as_slice(ffn_units(cfg, tp, rank))          # mlp.w_down


def shard_parameter(name: str, full: Tensor, cfg: ModelConfig, tp: int, rank: int, *,
                    vocab_parallel: bool = False) -> Tensor:
    """Rank `rank`'s piece of the full parameter `full` (a contiguous copy)."""
    rows, cols = shard_slices(name, cfg, tp, rank, vocab_parallel=vocab_parallel)
    piece = full[rows] if full.ndim == 1 else full[rows, cols]
    return piece.contiguous().clone()


def shard_state_dict(state: dict[str, Tensor], cfg: ModelConfig, tp: int, rank: int, *,
                     vocab_parallel: bool = False) -> dict[str, Tensor]:
    """Every parameter of a full state_dict, cut to `rank`'s piece (a tied lm_head.weight is dropped)."""
    return {k: shard_parameter(k, v, cfg, tp, rank, vocab_parallel=vocab_parallel)
            for k, v in state.items() if not (cfg.tie_embeddings and k == "lm_head.weight")}


def local_linear_shape(name: str, in_features: int, out_features: int, cfg: ModelConfig, tp: int,
                       rank: int) -> tuple[int, int]:
    """(in, out) of rank `rank`'s piece of the linear layer `name` (e.g. "layers.0.attn.wq")."""
    rows, cols = shard_slices(f"{name}.weight", cfg, tp, rank)
    out_local = len(range(out_features)[rows])
    in_local = len(range(in_features)[cols])
    return in_local, out_local

