"""Checks for Lab 07, tensor-parallel sharding on torch.distributed.

Each check takes the learner's function or classes, runs them on tiny seeded models (sharding checks need
no processes; the layer checks run TP = 2 and 4 as thread ranks and TP = 2 as two real gloo processes)
and raises AssertionError saying what is wrong. Judged (autograder/judging/judge.py), the ranks that call the learner's
classes run in the learner's kernel (`_on_ranks`, through wire.run_where) and send back only their results.

CPU tier (correctness):
    check_shard_weight(shard_weight)                        every parameter's slice, GQA/MQA/MHA, replication, bad tp
    check_parallel_linears(ColumnParallelLinear, RowParallelLinear)   TP logits == one process, 2 all-reduces a layer
    check_vocab_parallel_logits(vocab_parallel_logits)     gathered, not all-reduced (its ranks are replayed one after
                                                            another in this process: a judged function is called
                                                            over the wire, its collectives answered here)
    check_tp_kv_cache(make_tp_cache)                        each rank caches only its KV heads; generation identical
    check_allreduce_bytes(allreduce_bytes_per_token)       the formula, exact against counted collectives
Every check first refuses the package's reference handed in as the answer (the object, a subclass inheriting
the asked-for methods, a thin wrapper that calls it: autograder.checking.reference_guard); thread ranks run under the same
watch, so a wrapper is caught on the ranks too.
Interview questions (a model the planner does not list, Qwen2.5-32B's shape, bf16, 8 GPUs over PCIe Gen5 x16):
check_q1 (TP=4 x PP=2 bytes per GPU per token), check_q2 (PP bytes per step of 32), check_q3 (steady-state bubble of a serving pipeline with fewer micro-batches in flight than stages: 1 - m/p,
the drain-every-step formula diagnosed), check_q4 (all-reduce time per step at batch 64, not batch 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable

import torch

from autograder.harness import call_learner, check_answer, expect_value_error, quiet
from autograder.checking.reference_guard import watched as _watched, no_calls_into, own_work
from autograder.checking.wire import is_remote, run_where
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.model import GPT
from minigpt.parallel import sharding
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.launch import RankError, run_ranks
from minigpt.parallel.linears import ColumnParallelLinear, RowParallelLinear
from minigpt.parallel.tp_model import build_tp_model, tp_kv_cache
from minigpt.parallel.vocab_parallel import vocab_parallel_logits
from minigpt.teaching.parallel_cost import INTERCONNECTS, pipeline_bubble_fraction, tp_allreduce_bytes_per_token
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


def _model(name: str, seed: int = 0) -> GPT:
    with torch.random.fork_rng(devices=[]):         # the global RNG is left as it was
        torch.manual_seed(seed)
        return GPT(CONFIGS[name]).eval()


def _tokens(cfg: ModelConfig, B: int = 2, T: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def _on_ranks(worker: Callable, tp: int, *args: Any, backend: str = "threads", watch: tuple = (),
              what: str = "") -> list[Any]:
    """worker(comm, *args) on tp ranks of this process (threads) or forked from it (gloo), every rank's result in
    rank order; calls into `watch` (the references) refused. Judged, this runs in the learner's kernel (the ranks
    call the learner's classes at once, which one connection to the judge cannot serve) and only the results, as
    data, come back: the verdict stays in the check."""
    with quiet(), fixed_threads(1), no_calls_into(*watch, what=what) if watch else contextlib.nullcontext():
        return run_ranks(worker, tp, *args, backend=backend, timeout_s=90, collective_timeout_s=20)


def _run(worker: Callable, tp: int, *args: Any, backend: str = "threads", watch: tuple = (),
         what: str = "") -> list[Any]:
    """_on_ranks where the learner's objects among args live: here, or in the kernel when they are Remotes."""
    learner = next((a for a in args if is_remote(a)), None)
    try:
        results = run_where(learner, _on_ranks, worker, tp, *args, backend=backend, watch=tuple(watch), what=what)
    except RankError as err:
        msg = str(err)
        if "NotImplementedError" in msg:
            raise AssertionError("not implemented yet (NotImplementedError) on the ranks:\n" + msg) from None
        raise AssertionError(f"the tensor-parallel run failed ({backend} ranks):\n{msg}") from None
    if not isinstance(results, list) or len(results) != tp or not all(isinstance(r, tuple) for r in results):
        raise AssertionError(f"the {tp} ranks did not report one result each (got {type(results).__name__}): was "
                             "the grader's rank runner replaced in the notebook?")
    return results


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
# 2. Column- and row-parallel linears, run on ranks
# ---------------------------------------------------------------------------------------------------

def _linear_worker(comm: CountingComm, name: str, full_state: dict, column_cls: type, row_cls: type):
    cfg = CONFIGS[name]
    state = sharding.shard_state_dict(full_state, cfg, comm.world_size, comm.rank)
    model = build_tp_model(cfg, comm, state, column_cls=column_cls, row_cls=row_cls)
    with torch.no_grad():
        logits = model(_tokens(cfg))
    return logits, dict(comm.stats.calls), dict(comm.stats.bytes)


def check_parallel_linears(column_cls: type, row_cls: type) -> None:
    """column_cls(in_features, out_local, comm), row_cls(in_local, out_features, comm): nn.Modules with a `weight`
    of shape (out_local, in) / (out, in_local); a TP model built from them matches one process, and each layer
    calls exactly two all-reduces (after wo and after w_down), nothing else."""
    what = "Exercise 2 (the parallel linears)"
    own_work(column_cls, ColumnParallelLinear, what=what, methods=("__init__", "forward"))
    own_work(row_cls, RowParallelLinear, what=what, methods=("__init__", "forward"))
    with no_calls_into(ColumnParallelLinear, RowParallelLinear, what=what):
        _check_parallel_linears(column_cls, row_cls)


def _check_parallel_linears(column_cls: type, row_cls: type) -> None:
    for name, tp, backend in (("GQA 4q/2kv", 2, "gloo"), ("MQA 4q/1kv", 4, "threads"), ("GQA 8q/4kv", 2, "threads")):
        cfg = CONFIGS[name]
        full = _model(name)
        with torch.no_grad():
            want = full(_tokens(cfg))
        outs = _run(_linear_worker, tp, name, full.state_dict(), column_cls, row_cls, backend=backend,
                    watch=(ColumnParallelLinear, RowParallelLinear), what="Exercise 2 (the parallel linears)")
        what = f"model {name}, tp={tp} ({backend} ranks), prefill of {tuple(_tokens(cfg).shape)} tokens"
        for rank, (logits, calls, nbytes) in enumerate(outs):
            n_ar = calls.get("all_reduce", 0)
            expected = 2 * cfg.n_layers
            if not isinstance(logits, torch.Tensor) or logits.shape != want.shape:
                raise AssertionError(f"{what}: rank {rank}'s logits have shape "
                                     f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else logits!r}, "
                                     f"expected {tuple(want.shape)}")
            if not torch.allclose(logits, want, atol=ATOL, rtol=RTOL):
                err = (logits - want).abs().max().item()
                hint = ""
                if n_ar > expected:
                    hint = (f" {n_ar} all-reduces ran instead of {expected}: a column-parallel layer must NOT all-reduce "
                            "(its output features are different on each rank; summing them mixes heads).")
                elif n_ar < expected:
                    hint = (f" only {n_ar} all-reduces ran instead of {expected}: a row-parallel layer's output is a "
                            "partial sum over this rank's input features; all-reduce it.")
                raise AssertionError(f"{what}: rank {rank}'s logits differ from one process by up to {err:.3g}.{hint}")
            if n_ar != expected or set(calls) - {"all_reduce"}:
                raise AssertionError(f"{what}: rank {rank} called {calls}; a Megatron layer needs exactly 2 all-reduces "
                                     f"(one after wo, one after w_down): {expected} for {cfg.n_layers} layers")
            if nbytes.get("all_reduce") != expected * want.shape[0] * want.shape[1] * cfg.d_model * 4:
                raise AssertionError(f"{what}: rank {rank} all-reduced {nbytes.get('all_reduce')} bytes; each all-reduce "
                                     "should carry one (B, T, d_model) float32 activation")


# ---------------------------------------------------------------------------------------------------
# 3. Vocabulary-parallel LM head
# ---------------------------------------------------------------------------------------------------

class _ReplayBackend:
    """One rank of a world run one rank at a time (no threads, no processes): the k-th collective of a round
    answers with what every rank gave its k-th collective in the previous round (copies of this rank's own tensor
    in the first). Rounds repeat until the tensors given are the ones answered for: then each rank saw exactly
    what real collectives would have given it. For a deterministic function of its inputs, as the LM head is."""

    def __init__(self, rank: int, world_size: int, previous: list[list[tuple[str, torch.Tensor]]] | None) -> None:
        self.rank, self.world_size, self.previous = rank, world_size, previous
        self.given: list[tuple[str, torch.Tensor]] = []

    def _parts(self, op: str, t: torch.Tensor) -> list[torch.Tensor]:
        k = len(self.given)
        self.given.append((op, t.detach().clone()))
        if self.previous is None or any(len(p) <= k for p in self.previous):
            return [t.detach().clone() for _ in range(self.world_size)]
        return [p[k][1].clone() for p in self.previous]

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        parts = self._parts("all_reduce", t)
        out = parts[0].clone()
        for p in parts[1:]:
            out += p
        return out

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        return self._parts("all_gather", t)


def _replayed_ranks(fn: Callable, tp: int, args_of_rank: Callable[[int], tuple], what: str,
                    rounds: int = 4) -> list[tuple[Any, dict]]:
    """fn(*args_of_rank(rank), comm) on tp ranks simulated one after another (_ReplayBackend); every rank's
    (result, collective calls). The learner's function is called from this thread only, so a judged one (a
    Remote) is called over the wire like any other."""
    previous = None
    for _ in range(rounds):
        results, given = [], []
        for rank in range(tp):
            backend = _ReplayBackend(rank, tp, previous)
            comm = CountingComm(backend)
            out = call_learner(what, fn, *args_of_rank(rank), comm, context=f"tp={tp}, rank {rank}")
            results.append((out, dict(comm.stats.calls)))
            given.append(backend.given)
        ops = [[op for op, _ in g] for g in given]
        if any(o != ops[0] for o in ops):
            raise AssertionError(f"{what}, tp={tp}: the ranks called different collectives ({ops}): every rank must "
                                 "call the same collectives in the same order, or they wait for each other forever")
        if previous is not None and all(a[1].shape == b[1].shape and torch.equal(a[1], b[1])
                                        for g, p in zip(given, previous) for a, b in zip(g, p)):
            return results
        previous = given
    raise AssertionError(f"{what}, tp={tp}: what your function gives its collectives kept changing from one run to "
                         "the next with the same inputs; it must depend only on x, weight_shard and the collectives")


def check_vocab_parallel_logits(fn: Callable) -> None:
    """fn(x (..., d_model), weight_shard (V/tp, d_model), comm) -> full logits (..., V), identical on every rank."""
    what = "Exercise 3 (vocab_parallel_logits)"
    own_work(fn, vocab_parallel_logits, what=what)
    with no_calls_into(vocab_parallel_logits, what=what):
        _check_vocab_parallel_logits(fn)


def _check_vocab_parallel_logits(fn: Callable) -> None:
    g = torch.Generator().manual_seed(3)
    x, weight = torch.randn(2, 3, 32, generator=g), torch.randn(64, 32, generator=g)
    want = x @ weight.t()
    for tp in (2, 4):
        def args_of_rank(rank: int, tp: int = tp) -> tuple:
            rows = sharding.vocab_rows(CONFIGS["GQA 4q/2kv"], tp, rank)
            return x, weight[rows.start:rows.stop].clone()
        outs = _replayed_ranks(fn, tp, args_of_rank, "vocab_parallel_logits")
        for rank, (got, calls) in enumerate(outs):
            what = f"tp={tp}, rank {rank}, x {tuple(x.shape)}, full weight {tuple(weight.shape)}"
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

def _cache_worker(comm: CountingComm, make_cache: Callable, name: str, full_state: dict, prompt: list[int], n: int):
    cfg = CONFIGS[name]
    state = sharding.shard_state_dict(full_state, cfg, comm.world_size, comm.rank)
    model = build_tp_model(cfg, comm, state)
    cache = make_cache(cfg, comm.world_size, comm.rank, len(prompt) + n)
    heads = [layer.n_kv_heads for layer in cache]
    out = generate_kv_cache(model, prompt, n, cache=cache)
    return out.tokens, heads, cache.nbytes


def check_tp_kv_cache(make_cache: Callable) -> None:
    """make_cache(cfg, tp, rank, max_seq_len) -> a minigpt.cache.contiguous.KVCache holding only this rank's KV
    heads; lab 01's generate_kv_cache on the TP ranks is token-identical to one process."""
    what = "Exercise 4 (make_tp_cache)"
    own_work(make_cache, tp_kv_cache, what=what)
    with no_calls_into(tp_kv_cache, what=what):
        _check_tp_kv_cache(make_cache)


def _check_tp_kv_cache(make_cache: Callable) -> None:
    prompt, n = [3, 14, 15, 9, 26, 5], 10
    for name, tp in (("GQA 4q/2kv", 2), ("MQA 4q/1kv", 2)):
        cfg = CONFIGS[name]
        full = _model(name)
        want = generate_kv_cache(full, prompt, n).tokens
        outs = _run(_cache_worker, tp, make_cache, name, full.state_dict(), prompt, n, watch=(tp_kv_cache,),
                    what="Exercise 4 (make_tp_cache)")
        local = len(sharding.kv_heads(cfg, tp, 0))
        for rank, (tokens, heads, nbytes) in enumerate(outs):
            what = f"model {name}, tp={tp}, rank {rank}"
            if any(h != local for h in heads):
                raise AssertionError(f"{what}: the cache layers hold {heads} KV heads, expected {local} each: a rank "
                                     "caches only the KV heads its query heads read (replicated when tp > n_kv_heads)")
            if tokens != want:
                raise AssertionError(f"{what}: generated {tokens}, one process generates {want}")
            expected = 2 * cfg.n_layers * (len(prompt) + n) * local * cfg.head_dim * 4
            if nbytes != expected:
                raise AssertionError(f"{what}: the cache allocates {nbytes} bytes, expected {expected} "
                                     f"(max_seq_len={len(prompt) + n}, batch 1, float32)")


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
        payload32, wire32 = _run(_count_worker, tp, name, _model(name).state_dict())[0]
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
