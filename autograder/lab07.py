"""Checks for Lab 07, tensor-parallel sharding on torch.distributed.

Each check takes the learner's function or classes, runs them on tiny seeded models and raises AssertionError
saying what is wrong. No course function runs in the learner's kernel for a rank, and no count comes from there:

- where the learner's code takes part in a collective (Exercises 2 and 3), the judge plays every rank itself, one
  after another (`_replayed_ranks`): it calls the learner's layers or function (over the wire when judged) and hands
  each rank a communicator of its own, a `CountingComm` whose all-reduces and all-gathers are requests the judge
  answers and counts. The calls, the bytes and the logits are the judge's records of calls it made and served.
- where the ranks run only the package's code (Exercises 4 and 5), they are thread ranks of the judge's own process;
  the learner's KV caches take part as the judge's copies of their buffers (`_cache_copy`).

CPU tier (correctness):
    check_shard_weight(shard_weight)                        every parameter's slice, GQA/MQA/MHA, replication, bad tp
    check_parallel_linears(ColumnParallelLinear, RowParallelLinear)   TP logits == one process, 2 all-reduces a
                                                            layer, the logits depend on what the all-reduces return
    check_vocab_parallel_logits(vocab_parallel_logits)     gathered, not all-reduced
    check_tp_kv_cache(make_tp_cache)                        each rank caches only its KV heads; generation identical
    check_allreduce_bytes(allreduce_bytes_per_token)       the formula, exact against counted collectives
Every check first refuses the package's reference handed in as the answer (the object, a subclass inheriting
the asked-for methods, a thin wrapper that calls it: autograder.checking.reference_guard); the learner's calls on
the ranks run under the same watch, so a wrapper is caught there too.
Interview questions (a model the planner does not list, Qwen2.5-32B's shape, bf16, 8 GPUs over PCIe Gen5 x16):
check_q1 (TP=4 x PP=2 bytes per GPU per token), check_q2 (PP bytes per step of 32), check_q3 (steady-state bubble of a serving pipeline with fewer micro-batches in flight than stages: 1 - m/p,
the drain-every-step formula diagnosed), check_q4 (all-reduce time per step at batch 64, not batch 1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from autograder.harness import call_learner, check_answer, expect_value_error, quiet, within
from autograder.checking.reference_guard import watched as _watched, no_calls_into, own_work
from autograder.checking.replayed_ranks import replay_comms as _replay_comms, replayed_ranks as _replayed_ranks
from autograder.checking.wire import class_of, run_where, storage_address
from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.model import GPT
from minigpt.parallel import sharding
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.launch import RankError, run_ranks
from minigpt.parallel.linears import ColumnParallelLinear, RowParallelLinear, tp_linear_factory
from minigpt.parallel.tp_model import build_tp_model, tp_kv_cache
from minigpt.parallel.vocab_parallel import vocab_parallel_logits
from minigpt.costmodel.parallel_cost import INTERCONNECTS, pipeline_bubble_fraction, tp_allreduce_bytes_per_token
from minigpt.timing import fixed_threads

__all__ = ["check_shard_weight", "check_parallel_linears", "check_vocab_parallel_logits", "check_tp_kv_cache",
           "check_allreduce_bytes", "check_q1_tp_bytes", "check_q2_pp_bytes", "check_q3_bubble",
           "check_q4_tp_latency", "Q2_BATCH", "Q4_BATCH", "Q_LAYERS", "Q_D_MODEL", "CONFIGS"]

CONFIGS = {
    "GQA 4q/2kv": ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48),
    "GQA 8q/4kv": ModelConfig(vocab_size=64, max_seq_len=32, d_model=64, n_layers=1, n_heads=8, n_kv_heads=4, d_ff=48),
    "MQA 4q/1kv": ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=48),
    "MHA 4q/4kv": ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, d_ff=48),
}
ATOL, RTOL = 1e-5, 1e-4
EX2 = "Exercise 2 (the parallel linears)"
EX3 = "Exercise 3 (vocab_parallel_logits)"
EX4 = "Exercise 4 (make_tp_cache)"


def _model(name: str, seed: int = 0) -> GPT:
    with torch.random.fork_rng(devices=[]):         # the global RNG is left as it was
        torch.manual_seed(seed)
        return GPT(CONFIGS[name]).eval()


def _tokens(cfg: ModelConfig, B: int = 2, T: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def _package_ranks(worker: Callable, tp: int, *args: Any) -> list[Any]:
    """worker(comm, *args) on tp thread ranks of this process, every rank's result in rank order. Only for workers
    that run the package's code on the judge's own objects: the learner's code never runs on these threads."""
    try:
        with quiet(), fixed_threads(1):
            return run_ranks(worker, tp, *args, backend="threads", timeout_s=90, collective_timeout_s=20)
    except RankError as err:
        raise AssertionError(f"the tensor-parallel run failed (thread ranks):\n{err}") from None


# ---------------------------------------------------------------------------------------------------
# 1. Slices (no processes)
# ---------------------------------------------------------------------------------------------------

def check_shard_weight(shard_weight: Callable) -> None:
    """shard_weight(name, full, cfg, tp, rank) -> rank's piece of the full parameter `name` (a GPT state_dict key)."""
    what = "Exercise 1 (shard_weight)"
    own_work(shard_weight, [sharding.shard_parameter, sharding.shard_state_dict], what=what)
    _check_shard_weight(_watched(shard_weight, (sharding.shard_parameter, sharding.shard_state_dict), what))
    _check_pieces_own_memory(shard_weight)


# A piece of each kind: rows (a view of `full` when sliced), columns, and a whole replicated tensor
_OWNERSHIP_CASES = ("layers.0.attn.wq.weight", "layers.0.mlp.w_down.weight", "tok_emb.weight", "norm.weight")


def piece_shares_memory(shard_weight: Callable, pname: str, full: torch.Tensor, cfg: ModelConfig, tp: int,
                        rank: int) -> bool:
    """Run where shard_weight lives (run_where): True when its piece is a view of `full` (same storage)."""
    with quiet():
        piece = shard_weight(pname, full, cfg, tp, rank)
    return isinstance(piece, torch.Tensor) and piece.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()


def _check_pieces_own_memory(shard_weight: Callable) -> None:
    """Every piece owns its memory: a view of the full parameter keeps all of it alive on every rank (each rank
    would hold the whole model), and writing into one rank's piece would change the others'."""
    cfg, state = CONFIGS["GQA 4q/2kv"], _model("GQA 4q/2kv").state_dict()
    for pname in _OWNERSHIP_CASES:
        full = state[pname].clone()
        if call_learner("shard_weight", run_where, shard_weight, piece_shares_memory, shard_weight, pname, full, cfg, 2,
                        1, context=f"{pname}, tp=2, rank 1"):
            raise AssertionError(f"Exercise 1 (shard_weight): the piece of {pname} (tp=2, rank 1) is a view of the full "
                                 "tensor: it keeps the whole tensor alive on every rank, and a write into one rank's "
                                 "piece changes the full weight. Return a copy (.contiguous().clone()).")


def _check_shard_weight(shard_weight: Callable) -> None:
    cases = [("GQA 4q/2kv", 2), ("GQA 8q/4kv", 2), ("GQA 4q/2kv", 4), ("MQA 4q/1kv", 4), ("MHA 4q/4kv", 4),
             ("GQA 4q/2kv", 1)]
    for name, tp in cases:
        cfg = CONFIGS[name]
        state = _model(name).state_dict()
        for rank in range(tp):
            for pname, full in state.items():
                if pname == "lm_head.weight":
                    continue
                what = f"model {name}, tp={tp}, rank {rank}, {pname} {tuple(full.shape)}"
                got = call_learner("shard_weight", shard_weight, pname, full.clone(), cfg, tp, rank, context=what)
                want = sharding.shard_parameter(pname, full, cfg, tp, rank)
                if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                    raise AssertionError(f"{what}: expected a piece of shape {tuple(want.shape)}, got {shape}. "
                                         + _shape_hint(pname, cfg, tp))
                if not torch.equal(got, want):
                    raise AssertionError(f"{what}: the piece has the right shape but holds the wrong rows/columns. "
                                         + _value_hint(pname, cfg, tp, rank))
    for name, tp, d_ff in (("GQA 4q/2kv", 3, None), ("MQA 4q/1kv", 8, None), ("GQA 4q/2kv", 4, 130)):
        cfg = CONFIGS[name] if d_ff is None else dataclasses.replace(CONFIGS[name], d_ff=d_ff)
        full = _model(name).state_dict()["layers.0.attn.wq.weight"]
        why = (f"d_ff={d_ff} does not split into {tp} equal blocks" if d_ff else
               f"tp={tp} does not divide n_heads={cfg.n_heads} (a rank would get part of a head)")
        expect_value_error(f"Exercise 1 (shard_weight): tp={tp}, n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads}, "
                           f"d_ff={cfg.d_ff}", shard_weight, "layers.0.attn.wq.weight", full, cfg, tp, 0,
                           naming=(str(tp),), hint=f": {why}")


def _shape_hint(pname: str, cfg: ModelConfig, tp: int) -> str:
    if pname.endswith("norm.weight"):
        return "RMSNorm weights scale all d_model features, which every rank holds: replicate them, do not split."
    if pname.endswith(("wk.weight", "wv.weight")) and tp > cfg.n_kv_heads:
        return (f"with tp={tp} > n_kv_heads={cfg.n_kv_heads} each rank needs one WHOLE KV head (replicated on "
                f"{tp // cfg.n_kv_heads} ranks); splitting the rows evenly cuts a head in pieces.")
    if pname.endswith(("wo.weight", "w_down.weight")):
        return "row-parallel layers split the INPUT features: columns of the (out, in) weight."
    if pname == "tok_emb.weight":
        return "the embedding is replicated here (vocab parallelism comes later in the lab)."
    return "column-parallel layers split the OUTPUT features: rows of the (out, in) weight, whole heads per rank."


def _value_hint(pname: str, cfg: ModelConfig, tp: int, rank: int) -> str:
    if pname.endswith(("wk.weight", "wv.weight")):
        return (f"rank {rank} must hold the KV heads its own query heads {list(sharding.query_heads(cfg, tp, rank))} "
                f"read (head h reads KV head h // {cfg.group_size}), i.e. {list(sharding.kv_heads(cfg, tp, rank))}.")
    if pname.endswith("wq.weight") or pname.endswith("wo.weight"):
        return f"rank {rank} holds a contiguous block of query heads: {list(sharding.query_heads(cfg, tp, rank))}."
    return f"rank {rank} holds the contiguous block number {rank} of {tp}."


# ---------------------------------------------------------------------------------------------------
# 2. Column- and row-parallel linears, on ranks the judge plays
# ---------------------------------------------------------------------------------------------------

class _LearnerLayer:
    """One of the learner's linears inside a rank's model that the judge runs: every forward is a call the judge
    makes (over the wire when judged), its output checked for shape and dtype. Not an nn.Module, so the learner's object
    never becomes part of the judge's model."""

    def __init__(self, layer: Any, weight_shape: torch.Size, where: str) -> None:
        self.layer, self.out_features, self.where = layer, weight_shape[0], where

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = call_learner(EX2, self.layer, x, context=self.where)
        want = (*x.shape[:-1], self.out_features)
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != want or y.dtype != x.dtype:
            got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
            raise AssertionError(f"{EX2}: {self.where} returned {got} for an input of shape {tuple(x.shape)}, expected "
                                 f"{want} {x.dtype}: a column-parallel layer keeps this rank's slice of the output "
                                 "features, a row-parallel one returns all of them (after its all-reduce)")
        return y


def _learner_layer(build: Callable, in_features: int, out_features: int, name: str, piece: torch.Tensor,
                   where: str) -> _LearnerLayer:
    """The learner's layer for projection `name` (built by the package's factory from the learner's classes, with
    the judge's communicator), its slice `piece` loaded into its `weight`."""
    layer = call_learner(EX2, build, in_features, out_features, name, context=where)
    try:
        call_learner(EX2, lambda: layer.load_state_dict({"weight": piece.clone()}), context=f"{where}, its weight")
    except AssertionError as err:
        raise AssertionError(f"{err}. The layer must be an nn.Module whose only parameter is `weight`, of shape "
                             f"{tuple(piece.shape)} here: (out_local, in) for a column-parallel layer, (out, in_local) "
                             "for a row-parallel one") from None
    return _LearnerLayer(layer, piece.shape, where)


def _learner_rank_model(cfg: ModelConfig, comm: CountingComm, state: dict, column_cls: type, row_cls: type) -> GPT:
    """Rank comm.rank's model, in the judge: the package's GPT whose projections are the learner's layers, each
    holding the rank's slice (`state`, from shard_state_dict), and whose embedding and norms are the judge's own."""
    build = tp_linear_factory(cfg, comm, column_cls=column_cls, row_cls=row_cls)

    def make_linear(in_features: int, out_features: int, name: str) -> Any:
        where = f"rank {comm.rank} of {comm.world_size}, {name}"
        return _learner_layer(build, in_features, out_features, name, state[f"{name}.weight"], where)

    with torch.random.fork_rng(devices=[]):        # the layers' own initial draws leave the global RNG as it was
        model = GPT(cfg, make_linear=make_linear).eval()
    own = model.state_dict()           # the embedding (the LM head is tied to it) and the norms
    model.load_state_dict({key: value for key, value in state.items() if key in own}, strict=False)
    return model


def check_parallel_linears(column_cls: type, row_cls: type) -> None:
    """column_cls(in_features, out_local, comm), row_cls(in_local, out_features, comm): nn.Modules with a `weight`
    of shape (out_local, in) / (out, in_local); a TP model built from them matches one process, and each layer
    calls exactly two all-reduces (after wo and after w_down), nothing else."""
    own_work(column_cls, ColumnParallelLinear, what=EX2, methods=("__init__", "forward"))
    own_work(row_cls, RowParallelLinear, what=EX2, methods=("__init__", "forward"))
    with no_calls_into(ColumnParallelLinear, RowParallelLinear, what=EX2):
        _check_parallel_linears(column_cls, row_cls)


INIT_STD = 0.02        # the model's linears start normal with this std (GPT._init_weights), the parallel ones too


def _check_fresh_weights(column_cls: type, row_cls: type) -> None:
    """A layer as built, before any weights are loaded: a model made from the classes and trained from scratch starts
    from these. Each weight is normal with std 0.02 (131,072 draws: the estimate is within 0.5% of the true std)."""
    comm = _replay_comms(2)[0]
    for cls, kind, shape in ((column_cls, "ColumnParallelLinear", (256, 512)), (row_cls, "RowParallelLinear",
                                                                                 (512, 256))):
        args = (shape[1], shape[0], comm)        # column: (in_features, out_local); row: (in_local, out_features)
        layer = call_learner(EX2, cls, *args, context=f"a fresh {kind}{args[:2]}")
        weight = call_learner(EX2, getattr, layer, "weight", context=f"a fresh {kind}{args[:2]}, its weight")
        weight = torch.as_tensor(weight).detach().float()
        std, mean = weight.std().item(), weight.mean().item()
        if weight.shape != shape or not (within(abs(std - INIT_STD), 0.1 * INIT_STD)
                                         and within(abs(mean), 0.05 * INIT_STD)):
            raise AssertionError(f"{EX2}: a fresh {kind}{args[:2]} has a weight of shape {tuple(weight.shape)}, mean "
                                 f"{mean:.3g} and std {std:.3g}; expected shape {shape}, drawn as the model's linears "
                                 f"are, normal with mean 0 and std {INIT_STD} (torch.randn gives std 1: a model built "
                                 "from these layers and trained from scratch would start with exploding activations)")


def _check_parallel_linears(column_cls: type, row_cls: type) -> None:
    for name, tp in (("GQA 4q/2kv", 2), ("MQA 4q/1kv", 4), ("GQA 8q/4kv", 2)):
        cfg, full, tokens = CONFIGS[name], _model(name), _tokens(CONFIGS[name])
        with torch.no_grad():
            want = full(tokens)
        comms = _replay_comms(tp)
        models = [_learner_rank_model(cfg, comm, sharding.shard_state_dict(full.state_dict(), cfg, tp, comm.rank),
                                      column_cls, row_cls) for comm in comms]

        def forward(rank: int, comm: CountingComm) -> torch.Tensor:
            with torch.no_grad():
                return models[rank](tokens)
        outs, first = _replayed_ranks(forward, comms, EX2)
        what = f"{EX2}: model {name}, tp={tp}, prefill of {tuple(tokens.shape)} tokens"
        for rank, (logits, calls, nbytes) in enumerate(outs):
            _check_rank_logits(logits, want, calls, nbytes, cfg, f"{what}, rank {rank}")
        for rank, logits in enumerate(first):
            if torch.allclose(logits, want, atol=ATOL, rtol=RTOL):
                raise AssertionError(f"{what}: rank {rank}'s logits came out right even while the grader answered its "
                                     "all-reduces with a wrong sum on purpose: a row-parallel layer must return what "
                                     "comm.all_reduce gives it, not a sum made some other way")
    _check_fresh_weights(column_cls, row_cls)


def _check_rank_logits(logits: torch.Tensor, want: torch.Tensor, calls: dict, nbytes: dict, cfg: ModelConfig,
                       what: str) -> None:
    """One rank's logits against one process, and its collectives as the judge counted them."""
    n_ar, expected = calls.get("all_reduce", 0), 2 * cfg.n_layers
    if not torch.allclose(logits, want, atol=ATOL, rtol=RTOL):
        err = (logits - want).abs().max().item()
        hint = ""
        if n_ar > expected:
            hint = (f" {n_ar} all-reduces ran instead of {expected}: a column-parallel layer must NOT all-reduce "
                    "(its output features are different on each rank; summing them mixes heads).")
        elif n_ar < expected:
            hint = (f" only {n_ar} all-reduces ran instead of {expected}: a row-parallel layer's output is a "
                    "partial sum over this rank's input features; all-reduce it.")
        raise AssertionError(f"{what}: the logits differ from one process by up to {err:.3g}.{hint}")
    if n_ar != expected or set(calls) - {"all_reduce"}:
        raise AssertionError(f"{what}: called {calls}; a Megatron layer needs exactly 2 all-reduces (one after wo, one "
                             f"after w_down): {expected} for {cfg.n_layers} layers")
    if nbytes.get("all_reduce") != expected * want.shape[0] * want.shape[1] * cfg.d_model * 4:
        raise AssertionError(f"{what}: all-reduced {nbytes.get('all_reduce')} bytes; each all-reduce should carry one "
                             "(B, T, d_model) float32 activation")


# ---------------------------------------------------------------------------------------------------
# 3. Vocabulary-parallel LM head
# ---------------------------------------------------------------------------------------------------

def check_vocab_parallel_logits(fn: Callable) -> None:
    """fn(x (..., d_model), weight_shard (V/tp, d_model), comm) -> full logits (..., V), identical on every rank."""
    own_work(fn, vocab_parallel_logits, what=EX3)
    with no_calls_into(vocab_parallel_logits, what=EX3):
        _check_vocab_parallel_logits(fn)


def _check_vocab_parallel_logits(fn: Callable) -> None:
    g = torch.Generator().manual_seed(3)
    x, weight = torch.randn(2, 3, 32, generator=g), torch.randn(64, 32, generator=g)
    want = x @ weight.t()
    for tp in (2, 4):
        def rank_logits(rank: int, comm: CountingComm, tp: int = tp) -> Any:
            rows = sharding.vocab_rows(CONFIGS["GQA 4q/2kv"], tp, rank)
            shard = weight[rows.start:rows.stop]
            piece = shard.clone()
            got = call_learner(EX3, fn, x, piece, comm, context=f"tp={tp}, rank {rank}")
            if piece.shape != shard.shape or not torch.equal(piece, shard):
                raise AssertionError(f"{EX3}: tp={tp}, rank {rank}: the call changed the weight shard it was given "
                                     f"(now of shape {tuple(piece.shape)}): the model calls it again on the same shard "
                                     "at every step, so read it, never write it (weight_shard.t() is a view; t_() "
                                     "transposes the shard itself)")
            return got
        outs, _ = _replayed_ranks(rank_logits, _replay_comms(tp), EX3)
        for rank, (got, calls, _) in enumerate(outs):
            what = f"{EX3}: tp={tp}, rank {rank}, x {tuple(x.shape)}, full weight {tuple(weight.shape)}"
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                hint = (" An all-reduce adds the logits of DIFFERENT tokens together; gather the pieces along the "
                        "vocabulary instead (comm.all_gather(local, dim=-1)).") if calls.get("all_reduce") else ""
                raise AssertionError(f"{what}: expected logits of shape {tuple(want.shape)}, got {shape}.{hint}")
            if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                raise AssertionError(f"{what}: logits differ from x @ W^T by up to {(got - want).abs().max().item():.3g}; "
                                     "rank r's logits are columns [r*V/tp, (r+1)*V/tp), gathered in rank order")


# ---------------------------------------------------------------------------------------------------
# 4. Sharded KV cache and cached generation
# ---------------------------------------------------------------------------------------------------

def _cache_layers(cache: Any, cfg: ModelConfig, what: str) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(k, v, length) of each layer of the learner's cache, read from it (over the wire when judged). Refused: not a
    KVCache of LayerKVCaches, a layer count other than the model's, buffers shared between layers or between k and v
    (one layer's writes would land in another's)."""
    kind = class_of(cache)
    if not (isinstance(kind, type) and issubclass(kind, KVCache)):
        raise AssertionError(f"{what}: make_tp_cache returned a {getattr(kind, '__name__', kind)!s}, expected a "
                             "minigpt.cache.contiguous.KVCache of LayerKVCaches")
    layers = call_learner(EX4, list, cache, context="reading the layers of the cache it returned")
    if len(layers) != cfg.n_layers:
        raise AssertionError(f"{what}: the cache has {len(layers)} layers, the model {cfg.n_layers}: one "
                             "LayerKVCache per layer")
    read = []
    for layer in layers:
        kind = class_of(layer)
        if not (isinstance(kind, type) and issubclass(kind, LayerKVCache)):
            raise AssertionError(f"{what}: a layer of the cache is a {getattr(kind, '__name__', kind)!s}, expected a "
                                 "minigpt LayerKVCache")
        k, v, length = layer.k, layer.v, layer.length
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.ndim == 4 and k.shape == v.shape
                and k.dtype == v.dtype and type(length) is int):
            raise AssertionError(f"{what}: a layer's k and v must be (batch, max_seq_len, n_kv_heads, head_dim) "
                                 "tensors of one shape and dtype, its length an int (build it with LayerKVCache)")
        read.append((k, v, length))
    addresses = [storage_address(t) for k, v, _ in read for t in (k, v)]
    if len(set(addresses)) != len(addresses):
        raise AssertionError(f"{what}: layers of the cache share their buffers (the same LayerKVCache twice?): "
                             "each layer needs a LayerKVCache of its own")
    return read


def _cache_copy(layers: list[tuple[torch.Tensor, torch.Tensor, int]]) -> KVCache:
    """The judge's own KVCache holding what the learner's holds: the same shapes, dtype, contents and length."""
    copies = []
    for k, v, length in layers:
        layer = LayerKVCache(*k.shape, dtype=k.dtype)
        layer.k.copy_(k)
        layer.v.copy_(v)
        layer.length = length
        copies.append(layer)
    return KVCache(copies)


def _cache_worker(comm: CountingComm, caches: list[KVCache], name: str, full_state: dict, prompt: list[int], n: int):
    cfg = CONFIGS[name]
    state = sharding.shard_state_dict(full_state, cfg, comm.world_size, comm.rank)
    model = build_tp_model(cfg, comm, state)
    return generate_kv_cache(model, prompt, n, cache=caches[comm.rank]).tokens


def check_tp_kv_cache(make_cache: Callable) -> None:
    """make_cache(cfg, tp, rank, max_seq_len) -> a minigpt.cache.contiguous.KVCache holding only this rank's KV
    heads; lab 01's generate_kv_cache on the TP ranks is token-identical to one process."""
    own_work(make_cache, tp_kv_cache, what=EX4)
    with no_calls_into(tp_kv_cache, what=EX4):
        _check_tp_kv_cache(make_cache)


def _check_tp_kv_cache(make_cache: Callable) -> None:
    prompt, n = [3, 14, 15, 9, 26, 5], 10
    for name, tp in (("GQA 4q/2kv", 2), ("MQA 4q/1kv", 2)):
        cfg = CONFIGS[name]
        full = _model(name)
        want = generate_kv_cache(full, prompt, n).tokens
        local = len(sharding.kv_heads(cfg, tp, 0))
        caches = []
        for rank in range(tp):
            where = f"model {name}, tp={tp}, rank {rank}"
            what = f"{EX4}: {where}"
            layers = _cache_layers(call_learner(EX4, make_cache, cfg, tp, rank, len(prompt) + n, context=where), cfg,
                                   what)
            heads = [k.shape[2] for k, _, _ in layers]
            if any(h != local for h in heads):
                raise AssertionError(f"{what}: the cache layers hold {heads} KV heads, expected {local} each: a rank "
                                     "caches only the KV heads its query heads read (replicated when tp > n_kv_heads)")
            nbytes = sum(k.nbytes + v.nbytes for k, v, _ in layers)
            expected = 2 * cfg.n_layers * (len(prompt) + n) * local * cfg.head_dim * 4
            if nbytes != expected:
                raise AssertionError(f"{what}: the cache allocates {nbytes} bytes, expected {expected} "
                                     f"(max_seq_len={len(prompt) + n}, batch 1, float32)")
            caches.append(_cache_copy(layers))
        outs = _package_ranks(_cache_worker, tp, caches, name, full.state_dict(), prompt, n)
        for rank, tokens in enumerate(outs):
            if tokens != want:
                raise AssertionError(f"{EX4}: model {name}, tp={tp}, rank {rank}: generated {tokens} on caches laid "
                                     f"out as yours, one process generates {want}")


# ---------------------------------------------------------------------------------------------------
# 5. Communication, exact
# ---------------------------------------------------------------------------------------------------

def _count_worker(comm: CountingComm, name: str, full_state: dict):
    cfg = CONFIGS[name]
    model = build_tp_model(cfg, comm, sharding.shard_state_dict(full_state, cfg, comm.world_size, comm.rank))
    cache = tp_kv_cache(cfg, comm.world_size, comm.rank, max_seq_len=8)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), positions=cache.next_positions(3), kv_caches=cache)
        comm.stats.reset()
        model(torch.tensor([[4]]), positions=cache.next_positions(1), kv_caches=cache)      # one decode token
    return comm.stats.bytes["all_reduce"], comm.stats.wire_bytes("all_reduce")


def check_allreduce_bytes(fn: Callable) -> None:
    """fn(cfg, tp, bytes_per_element, wire) -> bytes of the all-reduces for one decode token: the payload
    (wire=False) or what each rank sends in a ring (wire=True); checked exactly against counted collectives
    (float32 runs), for 4-byte and 2-byte (bf16/fp16) elements, at tp = 2 (ring factor 1) and tp = 4 (1.5)."""
    what = "Exercise 5 (allreduce_bytes_per_token)"
    own_work(fn, tp_allreduce_bytes_per_token, what=what)
    with no_calls_into(tp_allreduce_bytes_per_token, what=what):
        _check_allreduce_bytes(fn)


def _byte_mistakes(payload: float, wire: float, tp: int, flag: bool, element: int) -> list[tuple[float, str]]:
    """Wrong answers and their diagnoses; the wire-factor mistakes first, since at tp = 2 some of them coincide with
    'one all-reduce per layer' (payload (n-1)/n = payload / 2 there)."""
    mistakes: list[tuple[float, str]] = []
    if flag:
        mistakes += [(payload, "forgot the ring factor 2(n-1)/n: each rank sends payload * 2(n-1)/n."),
                     (payload * (tp - 1) / tp, "(n-1)/n is an all-GATHER; an all-reduce is a reduce-scatter plus an "
                                               "all-gather: 2(n-1)/n."),
                     (payload * 2 * (tp - 1), "2(n-1) chunks are sent, but each chunk is payload / n: the ring factor is "
                                              "2(n-1)/n, not 2(n-1).")]
    measured = wire if flag else payload
    if element != 4:
        mistakes.append((measured * 4 / element, f"that is the float32 figure: use bytes_per_element ({element} here), "
                                                 "not 4."))
    if not any(math.isclose(measured / 2, v, rel_tol=0.0, abs_tol=1e-9) for v, _ in mistakes):
        mistakes.append((measured / 2, "one all-reduce per layer? There are two: after attention's wo and after "
                                       "w_down."))
    return [(v, m) for v, m in mistakes if not math.isclose(v, measured, rel_tol=0.0, abs_tol=1e-9)]


def _check_allreduce_bytes(fn: Callable) -> None:
    for name, tp in (("GQA 4q/2kv", 2), ("MQA 4q/1kv", 4)):
        cfg = CONFIGS[name]
        payload32, wire32 = _package_ranks(_count_worker, tp, name, _model(name).state_dict())[0]
        ring = 2 * (tp - 1) / tp
        for element, dtype in ((4, "float32"), (2, "bf16/fp16")):
            payload, wire = payload32 * element // 4, wire32 * element / 4
            for flag, measured in ((False, payload), (True, wire)):
                what = f"model {name}, tp={tp}, {dtype} ({element}-byte elements), wire={flag}"
                got = call_learner("allreduce_bytes_per_token", fn, cfg, tp, element, flag, context=what)
                check_answer(got, float(measured), what, _byte_mistakes(payload, wire, tp, flag, element),
                             unit="bytes", rel=1e-9, reveal=True,
                             hint=f"payload = 2 all-reduces * n_layers * d_model * bytes_per_element; wire = payload "
                                  f"* 2(n-1)/n = payload * {ring:g} here.")
    with quiet():
        one = fn(CONFIGS["GQA 4q/2kv"], 1, 4, True)
    check_answer(one, 0.0, "tp=1, wire=True (a single rank sends nothing)", unit="bytes", rel=1e-9, reveal=True)


# ---------------------------------------------------------------------------------------------------
# Interview questions: a model the planner does not list (Qwen2.5-32B's shape: 64 layers, d_model 5120), bf16,
# 8 GPUs linked by PCIe Gen5 x16. Keys computed here from the shape, not from parallel_cost.
# ---------------------------------------------------------------------------------------------------

Q_LAYERS, Q_D_MODEL = 64, 5120
_PCIE = INTERCONNECTS["PCIe Gen5 x16"]


def _ring_bytes(layers: int, n: int, batch: int = 1, factor: float | None = None) -> float:
    """Bytes one GPU sends for 2 all-reduces per layer of batch x d_model bf16 values: factor 2(n-1)/n by default."""
    factor = 2 * (n - 1) / n if factor is None else factor
    return 2 * layers * batch * Q_D_MODEL * 2 * factor


def check_q1_tp_bytes(answer: Any) -> None:
    """TP = 4 inside each of PP = 2 stages (8 GPUs): bytes each GPU sends for the all-reduces of one generated token."""
    want = int(_ring_bytes(Q_LAYERS // 2, 4))
    check_answer(answer, want, "Q1 (TP=4 x PP=2: bytes one GPU sends for the all-reduces of one token)",
                 {int(_ring_bytes(Q_LAYERS // 2, 4, factor=1)): "that is the payload; a ring all-reduce sends 2(n-1)/n "
                  "of it from each GPU.",
                  int(_ring_bytes(Q_LAYERS, 4)): "a GPU holds one stage, 32 of the 64 layers: it all-reduces only "
                  "for those.",
                  int(_ring_bytes(Q_LAYERS // 2, 4, factor=3 / 4)): "(n-1)/n is an all-gather (or one all-reduce "
                  "per layer); an all-reduce sends 2(n-1)/n, and there are two per layer.",
                  int(_ring_bytes(Q_LAYERS // 2, 8)): "the all-reduces run among the 4 GPUs of a stage, n = 4, not "
                  "among all 8.",
                  int(_ring_bytes(Q_LAYERS, 8)): "that is TP = 8 over all 64 layers; here TP = 4 and each GPU has "
                  "half the layers."},
                 unit="bytes", hint="Per GPU: its stage's 32 layers x 2 all-reduces x d_model x 2 bytes x 2(n-1)/n, n = 4.")


Q2_BATCH = 32


def check_q2_pp_bytes(answer: Any) -> None:
    """PP = 8 (8 layers per stage), a decode step of 32 sequences: bytes that cross stage boundaries in that step,
    all boundaries together."""
    step = Q2_BATCH * Q_D_MODEL * 2
    check_answer(answer, 7 * step, "Q2 (PP=8 bytes between stages per decode step of 32)",
                 {8 * step: "8 stages have 7 boundaries, not 8.",
                  7 * Q_D_MODEL * 2: "that is one token's; the step carries 32 sequences, each sending its hidden state.",
                  7 * step * Q_LAYERS // 8: "only the last layer of a stage sends, once per boundary.",
                  7 * step * 2: "bf16 elements are 2 bytes, not 4."},
                 unit="bytes", hint="Each sequence's hidden state (d_model values, 2 bytes each) crosses each of the p-1 "
                                    "boundaries once per step.")


def check_q3_bubble(answer: Any) -> None:
    """PP = 8 in a serving engine that keeps 6 micro-batches in flight across decode steps (equal stage times):
    the fraction of time each stage idles in steady state, 1 - m/p (the pipeline never drains between steps)."""
    p, m = 8, 6
    check_answer(answer, 1 - m / p, "Q3 (steady-state pipeline bubble, micro-batches kept in flight)",
                 {pipeline_bubble_fraction(p, m): "(p-1)/(m+p-1) is the drain-every-step (training / one-batch) "
                                                  "bubble; here nothing drains between decode steps: each micro-batch "
                                                  "re-enters stage 0 as soon as its token leaves the last stage.",
                  0.0: "the bubble vanishes only with at least p micro-batches in flight; with 6 in a ring of 8 "
                       "stages, 2 stages have nothing to do at any moment.",
                  m / p: "that is the busy share; the question asks for the idle share.",
                  (p - 1) / m: "(p-1)/m is the drain-every-step bubble relative to useful time, and this pipeline "
                               "does not drain between steps."},
                 unit="fraction of time (0..1)", rel=1e-3,
                 hint="In steady state each micro-batch cycles through the p stages; at any moment m of the p stages "
                      "hold one. Section 8's simulation with 4 stages shows the pattern.")


Q4_BATCH = 64


def check_q4_tp_latency(answer: Any) -> None:
    """TP = 8 over PCIe Gen5 x16 (63.0 GB/s one way, 8 us per ring step), decoding a batch of 64: milliseconds the
    all-reduces add to each decode step (no overlap)."""
    payload = Q4_BATCH * Q_D_MODEL * 2
    per_allreduce = 2 * 7 * (_PCIE.step_latency_s + payload / 8 / _PCIE.bandwidth)
    want = 2 * Q_LAYERS * per_allreduce * 1e3
    bw_only = 2 * Q_LAYERS * (2 * 7 / 8 * payload / _PCIE.bandwidth) * 1e3
    batch_one = 2 * Q_LAYERS * 2 * 7 * (_PCIE.step_latency_s + Q_D_MODEL * 2 / 8 / _PCIE.bandwidth) * 1e3
    check_answer(answer, want, "Q4 (TP=8 all-reduce time per decode step at batch 64)",
                 {batch_one: "that is the batch-1 figure: at batch 64 each all-reduce carries 64 x d_model x 2 bytes, "
                             "and the bytes are no longer negligible next to the latencies.",
                  bw_only: "that is the bandwidth term alone; each all-reduce also pays 2(n-1) step latencies.",
                  want / 2: "two all-reduces per layer, 64 layers: 128 of them.",
                  2 * Q_LAYERS * (2 * 7 * _PCIE.step_latency_s + 2 * 7 * payload / _PCIE.bandwidth) * 1e3:
                      "each of the 2(n-1) steps sends payload / n, not the whole payload."},
                 unit="ms", rel=0.002,
                 hint="Payload = batch x d_model x 2 bytes; each all-reduce: 2(n-1) ring steps of "
                      "(alpha + payload/n / bandwidth); 2 per layer.")
