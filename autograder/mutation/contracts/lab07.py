"""Lab 07 (tensor parallelism): the exercises' contracts for the differential tests (equivalence.py).

ex1 shard_weight, ex2 ColumnParallelLinear / RowParallelLinear, ex3 vocab_parallel_logits. Where the code takes part
in collectives (ex2's row-parallel layer, ex3), every rank of the world is played one after another, as the checks
do (autograder.checking.replayed_ranks): each rank's result, collective calls and payload bytes are compared.
World sizes 1, 2 and 4 (and 3, 6, 8 where a config refuses them: shard_weight must raise).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised, call_with

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _config(n_kv: int, group: int, head_dim: int, d_ff: int, vocab: int = 16, n_layers: int = 2):
    from minigpt.config import ModelConfig

    n_heads = n_kv * group
    return ModelConfig(vocab_size=vocab, max_seq_len=16, d_model=n_heads * head_dim, n_layers=n_layers,
                       n_heads=n_heads, n_kv_heads=n_kv, d_ff=d_ff)


# ---------------------------------------------------------------------------------------------------
# Exercise 1: shard_weight(name, full, cfg, tp, rank) -> rank's piece of a GPT state_dict parameter: rows of its
# query heads (wq), of the KV heads they read (wk, wv; a whole head replicated when tp > n_kv_heads), of its d_ff
# block (w_gate, w_up); columns for wo and w_down; the whole tensor otherwise. ValueError when tp does not divide
# n_heads or d_ff, or tp and n_kv_heads do not divide one another. A tensor of its own: after the piece is written
# into, `full` is unchanged (compared), and the piece's layout is compared too (contiguous or not).
# ---------------------------------------------------------------------------------------------------

_NAMES = ("layers.0.attn.wq.weight", "layers.1.attn.wk.weight", "layers.0.attn.wv.weight", "layers.1.attn.wo.weight",
          "layers.0.mlp.w_gate.weight", "layers.1.mlp.w_up.weight", "layers.0.mlp.w_down.weight",
          "layers.0.attn_norm.weight", "layers.1.mlp_norm.weight", "norm.weight", "tok_emb.weight", "lm_head.weight")


def _full_shape(name: str, cfg) -> tuple[int, ...]:
    d, hd, f = cfg.d_model, cfg.head_dim, cfg.d_ff
    if name.endswith("attn.wq.weight"):
        return cfg.n_heads * hd, d
    if name.endswith(("attn.wk.weight", "attn.wv.weight")):
        return cfg.n_kv_heads * hd, d
    if name.endswith("attn.wo.weight"):
        return d, cfg.n_heads * hd
    if name.endswith(("mlp.w_gate.weight", "mlp.w_up.weight")):
        return f, d
    if name.endswith("mlp.w_down.weight"):
        return d, f
    if name.endswith("norm.weight"):
        return (d,)
    return cfg.vocab_size, d


@st.composite
def _shardings(draw):
    n_kv, group, head_dim = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 3)), draw(st.sampled_from([2, 4]))
    d_ff = draw(st.one_of(st.sampled_from([4, 8, 12, 24, 48]), st.integers(1, 30)))
    tp = draw(st.sampled_from([1, 2, 4, 1, 2, 4, 3, 6, 8]))
    return (draw(st.sampled_from(_NAMES)), n_kv, group, head_dim, d_ff, tp, draw(st.integers(0, tp - 1)),
            draw(st.sampled_from(_DTYPES)), draw(st.sampled_from(["cpu", "cpu", "meta"])), draw(st.integers(0, 99)))


def _run_shard(fn, value):
    name, n_kv, group, head_dim, d_ff, tp, rank, dtype, device, seed = value
    cfg = _config(n_kv, group, head_dim, d_ff)
    full = torch.randn(_full_shape(name, cfg), generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)
    piece = call_with(fn, (name, full, cfg, tp, rank))
    if not isinstance(piece, torch.Tensor):
        return piece, None
    seen = (piece.clone(), piece.is_contiguous())
    piece.fill_(7)                       # a view of `full` would write into it
    return seen, full


def _shard_corners(ns):
    out = []
    for name in _NAMES:
        for n_kv, group, tp in ((2, 2, 2), (2, 2, 4), (1, 4, 4), (4, 1, 4), (2, 2, 1), (2, 3, 2)):
            for rank in range(tp):
                out.append((name, n_kv, group, 8, 48, tp, rank, torch.float32, "cpu", 0))
        out += [(name, 2, 2, 8, 48, 2, 1, torch.bfloat16, "cpu", 1),
                (name, 2, 2, 8, 48, 2, 1, torch.float32, "meta", 1)]
    # refused: tp not dividing n_heads (3 of 4 heads; 8 of 4 heads; 4 of 6 heads), d_ff not divisible (130 / 4), tp and
    # n_kv_heads not dividing one another (tp 6, 12 heads, 4 KV heads)
    out += [("layers.0.attn.wq.weight", 2, 2, 8, 48, 3, 0, torch.float32, "cpu", 0),
            ("layers.0.attn.wq.weight", 1, 4, 8, 48, 8, 0, torch.float32, "cpu", 0),
            ("layers.0.attn.wq.weight", 2, 2, 8, 130, 4, 0, torch.float32, "cpu", 0),
            ("norm.weight", 2, 3, 2, 48, 4, 0, torch.float32, "cpu", 0),
            ("layers.0.attn.wk.weight", 4, 3, 2, 48, 6, 0, torch.float32, "cpu", 0)]
    return out


EX1 = Contract("shard_weight", lambda ns: _shardings(), run=_run_shard, corners=_shard_corners)


# ---------------------------------------------------------------------------------------------------
# Exercise 2: ColumnParallelLinear(in_features, out_local, comm), RowParallelLinear(in_local, out_features, comm):
# nn.Modules whose one parameter `weight` is (out_local, in) / (out, in_local); forward(x (..., in)) = x W^T, the
# row-parallel one all-reduced through comm. The cell defines both classes; the subject is the column-parallel one and
# the row-parallel one is read from the same cell's namespace. Compared, per rank of the world (tp 1, 2, 4): the
# parameters of a fresh layer (made under a fixed torch seed: a layer, or a TP model built from the classes, used
# without loading weights, computes with them: build_tp_model(cfg, comm) with no state), the output of forward on a
# fresh layer and on one loaded with given weights (2-D and 3-D x; float32, bfloat16, and the meta device), and the
# collectives each rank called with their payload bytes.
# ---------------------------------------------------------------------------------------------------

def _row_class(column_cls):
    return column_cls.forward.__globals__["RowParallelLinear"]


def _fresh(cls, args, comm, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(*args, comm)


def _params(layer) -> list:
    return [(name, p.detach().clone(), p.requires_grad) for name, p in layer.named_parameters()]


def _ranked(run_rank, tp: int):
    """Every rank's (result, collective calls, payload bytes), the ranks played one after another; or Raised."""
    from autograder.checking.replayed_ranks import replay_comms, replayed_ranks

    try:
        results, _ = replayed_ranks(run_rank, replay_comms(tp), "differential test")
    except Exception as err:                       # noqa: BLE001
        return Raised(type(err).__name__)
    return results


@st.composite
def _layers(draw):
    kind = draw(st.sampled_from(["column", "row", "model"]))
    tp = draw(st.sampled_from([1, 2, 4]))
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    return (kind, tp, draw(st.integers(1, 6)), draw(st.integers(1, 6)), lead, draw(st.sampled_from(_DTYPES[:2])),
            draw(st.sampled_from(["cpu", "cpu", "meta"])), draw(st.booleans()), draw(st.integers(0, 99)))


def _run_layers(column_cls, value):
    kind, tp, a, b, lead, dtype, device, load, seed = value
    row_cls = _row_class(column_cls)
    g = torch.Generator().manual_seed(seed)
    if kind == "model":
        return _run_model(column_cls, row_cls, tp, lead, load, seed)
    cls, n_in, n_out = (column_cls, a, b) if kind == "column" else (row_cls, a, b)
    xs = [torch.randn(*lead, n_in, generator=g) for _ in range(tp)]
    weights = [torch.randn(n_out, n_in, generator=g) for _ in range(tp)]
    layers, fresh = [], []
    for rank in range(tp):
        from autograder.checking.replayed_ranks import ReplayBackend
        from minigpt.parallel.comm import CountingComm

        layer = _fresh(cls, (n_in, n_out), CountingComm(ReplayBackend(rank, tp)), seed + rank)
        fresh.append(_params(layer))
        if load:
            layer.load_state_dict({"weight": weights[rank]})
        layers.append(layer.to(dtype=dtype, device=device))

    def run_rank(rank, comm):
        layers[rank].comm = comm
        with torch.no_grad():
            return layers[rank](xs[rank].to(dtype=dtype, device=device))
    if device == "meta":             # meta tensors have no values: one pass, shapes and calls only
        from autograder.checking.replayed_ranks import replay_comms

        outs = []
        for rank, comm in enumerate(replay_comms(tp)):
            out = call_with(lambda: run_rank(rank, comm), ())
            outs.append((out, dict(comm.stats.calls), dict(comm.stats.bytes)))
        return fresh, outs
    return fresh, _ranked(run_rank, tp)


def _run_model(column_cls, row_cls, tp: int, lead: tuple, load: bool, seed: int):
    """A TP model of a small GQA config built from the classes (build_tp_model), from a state or without one."""
    from minigpt.model import GPT
    from minigpt.parallel.sharding import shard_state_dict
    from minigpt.parallel.tp_model import build_tp_model

    cfg = _config(2, 2, 4, 8, vocab=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        full = GPT(cfg).eval()
    tokens = torch.randint(0, cfg.vocab_size, (lead[0], 3), generator=torch.Generator().manual_seed(seed))
    models = {}

    def run_rank(rank, comm):
        if rank not in models:
            state = shard_state_dict(full.state_dict(), cfg, tp, rank) if load else None
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + 1 + rank)
                models[rank] = build_tp_model(cfg, comm, state, column_cls=column_cls, row_cls=row_cls)
        with torch.no_grad():
            return models[rank](tokens)
    return _ranked(run_rank, tp)


def _layer_corners(ns):
    out = []
    for kind in ("column", "row"):
        for tp in (1, 2, 4):
            for load in (False, True):
                out.append((kind, tp, 4, 3, (2, 3), torch.float32, "cpu", load, 0))
        out += [(kind, 2, 4, 3, (2,), torch.bfloat16, "cpu", True, 1), (kind, 2, 4, 3, (2, 3), torch.float32, "meta",
                                                                        False, 1)]
    out += [("model", tp, 0, 0, (2,), torch.float32, "cpu", load, 0) for tp in (1, 2, 4) for load in (False, True)]
    return out


EX2 = Contract("ColumnParallelLinear", lambda ns: _layers(), run=_run_layers, corners=_layer_corners,
               examples=60)


# ---------------------------------------------------------------------------------------------------
# Exercise 3: vocab_parallel_logits(x (..., d_model), weight_shard (V/tp, d_model), comm) -> the full logits (..., V)
# on every rank, rank r's columns being rows [rV/tp, (r+1)V/tp) of the weight. comm is a CountingComm (its all_gather
# concatenates along dim, -1 by default). Per rank: the logits, the collectives called and their bytes.
# ---------------------------------------------------------------------------------------------------

@st.composite
def _vocab(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    return (tp, draw(st.integers(1, 4)) * tp, draw(st.integers(1, 6)), lead, draw(st.sampled_from(_DTYPES)),
            draw(st.sampled_from(["cpu", "cpu", "meta"])), draw(st.integers(0, 99)))


def _run_vocab(fn, value):
    from autograder.checking.replayed_ranks import replay_comms

    tp, vocab, d, lead, dtype, device, seed = value
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, d, generator=g).to(dtype=dtype, device=device)
    weight = torch.randn(vocab, d, generator=g).to(dtype=dtype, device=device)
    rows = vocab // tp

    def run_rank(rank, comm):
        return fn(x.clone(), weight[rank * rows:(rank + 1) * rows].clone(), comm)
    if device == "meta":
        outs = []
        for rank, comm in enumerate(replay_comms(tp)):
            out = call_with(lambda: run_rank(rank, comm), ())
            outs.append((out, dict(comm.stats.calls), dict(comm.stats.bytes)))
        return outs
    return _ranked(run_rank, tp)


EX3 = Contract("vocab_parallel_logits", lambda ns: _vocab(), run=_run_vocab,
               corners=lambda ns: [(tp, 64, 32, (2, 3), torch.float32, "cpu", 3) for tp in (1, 2, 4)]
               + [(2, 8, 4, (), torch.float32, "cpu", 0), (2, 8, 4, (3,), torch.bfloat16, "cpu", 0),
                  (4, 8, 4, (2, 3), torch.float32, "meta", 0)])


# ---------------------------------------------------------------------------------------------------
# Exercise 4: make_tp_cache(cfg, tp, rank, max_seq_len) -> a KVCache (batch 1, float32) of cfg.n_layers LayerKVCaches
# holding rank's KV heads (len(kv_heads(cfg, tp, rank)): one whole head when tp > n_kv_heads). Compared: every layer's
# buffers and length, and whether a write into one layer's keys shows in another layer's or in the values.
# ---------------------------------------------------------------------------------------------------

@st.composite
def _tp_caches(draw):
    tp = draw(st.sampled_from([1, 2, 4, 1, 2, 4, 3, 8]))
    return (draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 3)), draw(st.sampled_from([2, 4])),
            draw(st.integers(1, 3)), tp, draw(st.integers(0, tp - 1)), draw(st.integers(1, 8)))


def _run_tp_cache(fn, value):
    n_kv, group, head_dim, n_layers, tp, rank, max_seq_len = value
    cache = call_with(fn, (_config(n_kv, group, head_dim, 8, n_layers=n_layers), tp, rank, max_seq_len))
    if isinstance(cache, Raised):
        return cache
    layers = list(cache)
    seen = [(type(layer).__name__, layer.k.clone(), layer.v.clone(), layer.length) for layer in layers]
    layers[0].k.fill_(1.0)                 # shared buffers would show it
    return type(cache).__name__, seen, [(layer.k.clone(), layer.v.clone()) for layer in layers]


EX4 = Contract("make_tp_cache", lambda ns: _tp_caches(), run=_run_tp_cache,
               corners=lambda ns: [(2, 2, 8, 2, tp, r, 16) for tp in (1, 2, 4) for r in range(tp)]
               + [(1, 4, 8, 2, 2, r, 16) for r in range(2)] + [(4, 1, 8, 1, 2, 1, 1)])


# ---------------------------------------------------------------------------------------------------
# Exercise 5: allreduce_bytes_per_token(cfg, tp, bytes_per_element, wire) -> the payload 2 L d_model bytes (wire=False)
# or what each rank sends in a ring, payload * 2 (tp - 1) / tp (wire=True; 0 at tp = 1). A float, exact.
# ---------------------------------------------------------------------------------------------------

EX5 = Contract("allreduce_bytes_per_token",
               lambda ns: st.tuples(st.builds(_config, st.sampled_from([1, 2, 4]), st.integers(1, 3),
                                              st.sampled_from([2, 4, 8]), st.just(8), st.just(16), st.integers(1, 80)),
                                    st.integers(1, 16), st.sampled_from([1, 2, 4]), st.booleans()),
               corners=lambda ns: [(_config(2, 2, 8, 8, n_layers=2), tp, e, w) for tp in (1, 2, 4, 8) for e in (2, 4)
                                   for w in (False, True)])


CONTRACTS = {"ex1_code": EX1, "ex2_code": EX2, "ex3_code": EX3, "ex4_code": EX4, "ex5_code": EX5}
