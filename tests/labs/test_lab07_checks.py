"""Lab 07 checks: a learner's own code passes, the stub, the package's reference handed in (itself, a subclass, a
thin wrapper) and each plausible wrong implementation fail."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from autograder import lab07
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.parallel import sharding
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.linears import ColumnParallelLinear, RowParallelLinear
from minigpt.parallel.tp_model import tp_kv_cache
from minigpt.parallel.vocab_parallel import vocab_parallel_logits
from minigpt.costmodel.calculators import PRESETS
from minigpt.costmodel.parallel_cost import (INTERCONNECTS, pipeline_bubble_fraction, ring_allreduce_time,
                                            tp_allreduce_bytes_per_token)


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubLinear(nn.Module):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError()


# --- the reference, as a learner would write it (own code: the notebook's solution) ---------------

def ref_shard_weight(name, full, cfg, tp, rank):
    if cfg.n_heads % tp or (cfg.n_kv_heads % tp and tp % cfg.n_kv_heads) or cfg.d_ff % tp:
        raise ValueError(f"tp={tp} cannot split {cfg.n_heads} query heads / {cfg.n_kv_heads} KV heads")
    hd, q = cfg.head_dim, cfg.n_heads // tp
    q0, q1 = rank * q, (rank + 1) * q
    group = cfg.n_heads // cfg.n_kv_heads
    kv0, kv1 = q0 // group, (q1 - 1) // group + 1
    f0, f1 = rank * (cfg.d_ff // tp), (rank + 1) * (cfg.d_ff // tp)
    if name.endswith("attn.wq.weight"):
        piece = full[q0 * hd:q1 * hd]
    elif name.endswith(("attn.wk.weight", "attn.wv.weight")):
        piece = full[kv0 * hd:kv1 * hd]
    elif name.endswith(("mlp.w_gate.weight", "mlp.w_up.weight")):
        piece = full[f0:f1]
    elif name.endswith("attn.wo.weight"):
        piece = full[:, q0 * hd:q1 * hd]
    elif name.endswith("mlp.w_down.weight"):
        piece = full[:, f0:f1]
    else:
        piece = full
    return piece.contiguous().clone()


class OwnColumn(nn.Module):
    def __init__(self, in_features, out_local, comm):
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(torch.randn(out_local, in_features) * 0.02)

    def forward(self, x):
        return x @ self.weight.t()


class OwnRow(nn.Module):
    def __init__(self, in_local, out_features, comm):
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(torch.randn(out_features, in_local) * 0.02)

    def forward(self, x):
        return self.comm.all_reduce(x @ self.weight.t())


def own_vocab_logits(x, weight_shard, comm):
    return comm.all_gather(x @ weight_shard.t(), dim=-1)


def ref_make_cache(cfg, tp, rank, max_seq_len):
    n_kv = len(sharding.kv_heads(cfg, tp, rank))
    return KVCache([LayerKVCache(1, max_seq_len, n_kv, cfg.head_dim) for _ in range(cfg.n_layers)])


def ref_allreduce_bytes(cfg, tp, bytes_per_element, wire):
    payload = 2 * cfg.n_layers * cfg.d_model * bytes_per_element
    if tp == 1:
        return 0.0 if wire else float(payload)
    return payload * 2 * (tp - 1) / tp if wire else float(payload)


def test_reference_passes() -> None:
    lab07.check_shard_weight(ref_shard_weight)
    lab07.check_parallel_linears(OwnColumn, OwnRow)
    lab07.check_vocab_parallel_logits(own_vocab_logits)
    lab07.check_tp_kv_cache(ref_make_cache)
    lab07.check_allreduce_bytes(ref_allreduce_bytes)


# --- the package's reference handed in: itself, a subclass, a thin wrapper -----------------------

class InheritedColumn(ColumnParallelLinear):
    pass


class InheritedRow(RowParallelLinear):
    pass


class WrapperColumn(nn.Module):
    def __init__(self, in_features, out_local, comm):
        super().__init__()
        self.inner = [ColumnParallelLinear(in_features, out_local, comm)]     # a list: not a submodule
        self.weight = self.inner[0].weight

    def forward(self, x):
        return self.inner[0](x)


def wrap_shard(name, full, cfg, tp, rank):
    return sharding.shard_parameter(name, full, cfg, tp, rank)


def wrap_vocab(x, weight_shard, comm):
    return vocab_parallel_logits(x, weight_shard, comm)


def wrap_cache(cfg, tp, rank, max_seq_len):
    return tp_kv_cache(cfg, tp, rank, max_seq_len=max_seq_len)


def wrap_bytes(cfg, tp, bytes_per_element, wire):
    return tp_allreduce_bytes_per_token(cfg, tp, bytes_per_element, wire=wire)


@pytest.mark.parametrize("run, message", [
    (lambda: lab07.check_shard_weight(sharding.shard_parameter), "this is the course's reference"),
    (lambda: lab07.check_shard_weight(wrap_shard), r"calls the course's reference \(shard_parameter\)"),
    (lambda: lab07.check_parallel_linears(ColumnParallelLinear, RowParallelLinear), "course's reference"),
    (lambda: lab07.check_parallel_linears(InheritedColumn, OwnRow), "inherits __init__, forward"),
    (lambda: lab07.check_parallel_linears(OwnColumn, InheritedRow), "inherits __init__, forward"),
    (lambda: lab07.check_parallel_linears(WrapperColumn, OwnRow), r"ColumnParallelLinear\.__init__"),
    (lambda: lab07.check_vocab_parallel_logits(vocab_parallel_logits), "course's reference"),
    (lambda: lab07.check_vocab_parallel_logits(wrap_vocab), "calls the course's reference"),
    (lambda: lab07.check_tp_kv_cache(tp_kv_cache), "course's reference"),
    (lambda: lab07.check_tp_kv_cache(wrap_cache), r"calls the course's reference \(tp_kv_cache\)"),
    (lambda: lab07.check_allreduce_bytes(tp_allreduce_bytes_per_token), "course's reference"),
    (lambda: lab07.check_allreduce_bytes(wrap_bytes), "calls the course's reference"),
], ids=["shard itself", "shard wrapper", "linears themselves", "column subclass", "row subclass", "column wrapper",
        "vocab itself", "vocab wrapper", "cache itself", "cache wrapper", "bytes itself", "bytes wrapper"])
def test_the_reference_handed_in_is_refused(run, message) -> None:
    with pytest.raises(ReferenceHandedIn, match=message):
        run()


def test_stubs_fail() -> None:
    for check, arg in ((lab07.check_shard_weight, _stub), (lab07.check_vocab_parallel_logits, _stub),
                       (lab07.check_tp_kv_cache, _stub), (lab07.check_allreduce_bytes, _stub)):
        with pytest.raises(AssertionError, match="not implemented"):
            check(arg)
    with pytest.raises(AssertionError, match="not implemented"):
        lab07.check_parallel_linears(StubLinear, StubLinear)


def test_released_stub_classes_fail() -> None:
    class Column(nn.Module):
        def __init__(self, in_features, out_local, comm):
            super().__init__()
            self.comm = comm
            raise NotImplementedError()

        def forward(self, x):
            raise NotImplementedError()
    with pytest.raises(AssertionError, match="not implemented"):
        lab07.check_parallel_linears(Column, Column)


# --- wrong sharding ------------------------------------------------------------------------------

def norms_sharded(name, full, cfg, tp, rank):
    """Splits the RMSNorm weights too."""
    if name.endswith("norm.weight"):
        n = full.shape[0] // tp
        return full[rank * n:(rank + 1) * n].clone()
    return ref_shard_weight(name, full, cfg, tp, rank)


def kv_round_robin(name, full, cfg, tp, rank):
    """KV heads dealt round-robin while queries are contiguous: a rank's queries and KV heads do not belong together."""
    if name.endswith(("wk.weight", "wv.weight")) and cfg.n_kv_heads > tp:
        hd = cfg.head_dim
        heads = list(range(rank, cfg.n_kv_heads, tp))
        return torch.cat([full[h * hd:(h + 1) * hd] for h in heads]).clone()
    return ref_shard_weight(name, full, cfg, tp, rank)


def even_rows(name, full, cfg, tp, rank):
    """Splits every column-parallel weight into tp equal row blocks: cuts a KV head in pieces when tp > n_kv_heads."""
    if sharding.parameter_kind(name) == "column":
        n = full.shape[0] // tp
        return full[rank * n:(rank + 1) * n].clone()
    return ref_shard_weight(name, full, cfg, tp, rank)


def row_layers_split_by_rows(name, full, cfg, tp, rank):
    """Splits wo / w_down by output features too (treats them as column-parallel)."""
    if sharding.parameter_kind(name) == "row":
        n = full.shape[0] // tp
        return full[rank * n:(rank + 1) * n].clone()
    return ref_shard_weight(name, full, cfg, tp, rank)


def no_divisibility_check(name, full, cfg, tp, rank):
    """Slices by floor division without refusing a tp that does not divide the heads."""
    if cfg.n_heads % tp:
        n = full.shape[0] // tp
        return full[rank * n:(rank + 1) * n].clone()
    return ref_shard_weight(name, full, cfg, tp, rank)


@pytest.mark.parametrize("wrong, message", [
    (norms_sharded, "RMSNorm"),
    (kv_round_robin, "KV heads its own query heads"),
    (even_rows, "WHOLE KV head"),
    (row_layers_split_by_rows, "INPUT features"),
    (no_divisibility_check, "must raise ValueError"),
])
def test_wrong_sharding_is_rejected(wrong, message) -> None:
    with pytest.raises(AssertionError, match=message):
        lab07.check_shard_weight(wrong)


# --- wrong linears -------------------------------------------------------------------------------

class UnitNormalColumn(OwnColumn):
    """torch.randn's std 1 for a fresh weight (issue 57: std 1.02 survived; loaded weights hide it)."""

    def __init__(self, in_features, out_local, comm):
        super().__init__(in_features, out_local, comm)
        self.weight = nn.Parameter(torch.randn(out_local, in_features))


class ZeroRow(OwnRow):
    """A fresh weight of zeros: a model trained from it starts with every row-parallel output 0."""

    def __init__(self, in_local, out_features, comm):
        super().__init__(in_local, out_features, comm)
        self.weight = nn.Parameter(torch.zeros(out_features, in_local))


def test_fresh_weights_are_drawn_as_the_models_linears():
    for column, row in ((UnitNormalColumn, OwnRow), (OwnColumn, ZeroRow)):
        with pytest.raises(AssertionError, match="normal with mean 0 and std 0.02"):
            lab07.check_parallel_linears(column, row)


class AllReduceColumn(OwnColumn):
    """All-reduces after the column-parallel layer too."""

    def forward(self, x):
        return self.comm.all_reduce(x @ self.weight.t())


class NoAllReduceRow(OwnRow):
    """Forgets the all-reduce after the row-parallel layer."""

    def forward(self, x):
        return x @ self.weight.t()


class GatherColumn(OwnColumn):
    """Gathers the column output back to full width: right numbers downstream is impossible (the row layer
    expects its slice), and it spends a collective per column layer."""

    def forward(self, x):
        return self.comm.all_gather(x @ self.weight.t(), dim=-1)


class DropoutRow(OwnRow):
    """Leaves dropout on: what it gives the all-reduce changes from one run to the next."""

    def forward(self, x):
        return self.comm.all_reduce(torch.nn.functional.dropout(x, 0.5, training=True) @ self.weight.t())


class TransposedWeightColumn(OwnColumn):
    """Stores the weight as (in, out_local), the transpose of nn.Linear's layout."""

    def __init__(self, in_features, out_local, comm):
        super().__init__(in_features, out_local, comm)
        self.weight = nn.Parameter(torch.zeros(in_features, out_local))

    def forward(self, x):
        return x @ self.weight


@functools.cache
def _one_process_row_outputs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight, output on the check's tokens) of every wo and w_down of the check's models, run in one process."""
    found: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, cfg in lab07.CONFIGS.items():
        full = lab07._model(name)
        hooks = [module.register_forward_hook(lambda m, args, out: found.append((m.weight.detach(), out.detach())))
                 for path, module in full.named_modules() if path.endswith(("attn.wo", "mlp.w_down"))]
        with torch.no_grad():
            full(lab07._tokens(cfg))
        for hook in hooks:
            hook.remove()
    return found


class OracleRow(OwnRow):
    """Calls the all-reduce (the count is right) but returns the one-process layer's output, looked up by the slice
    of weight it holds: the logits are right whatever the all-reduces answer, as when a kernel computes them from
    the whole model instead of from the ranks."""

    def forward(self, x):
        self.comm.all_reduce(x @ self.weight.t())
        width = self.weight.shape[1]
        for weight, out in _one_process_row_outputs():
            blocks = weight.split(width, dim=1)
            if out.shape[:-1] == x.shape[:-1] and any(b.shape == self.weight.shape and torch.equal(b, self.weight)
                                                      for b in blocks):
                return out.clone()
        raise LookupError("no one-process layer holds this slice")


@pytest.mark.parametrize("column, row, message", [
    (AllReduceColumn, OwnRow, "column-parallel layer must NOT all-reduce"),
    (OwnColumn, NoAllReduceRow, "partial sum"),
    (GatherColumn, OwnRow, "differ|shape|failed"),
    (OwnColumn, DropoutRow, "kept changing"),
    (TransposedWeightColumn, OwnRow, r"size mismatch for weight.*\(out_local, in\) for a column-parallel layer"),
    (OwnColumn, OracleRow, "came out right even while the grader answered its all-reduces with a wrong sum"),
])
def test_wrong_linears_are_rejected(column, row, message) -> None:
    with pytest.raises(AssertionError, match=message):
        lab07.check_parallel_linears(column, row)


def test_the_layers_get_the_judges_communicator_and_it_counts() -> None:
    """Each rank's layers hold the check's own CountingComm, whose all-reduces the check answers: the count is the
    check's record of calls it served, not a number the ranks report."""
    seen = []

    class Recording(OwnRow):
        def __init__(self, in_local, out_features, comm):
            super().__init__(in_local, out_features, comm)
            seen.append(comm)
    lab07.check_parallel_linears(OwnColumn, Recording)
    assert seen and all(type(c) is CountingComm and type(c.backend).__module__ == "autograder.checking.replayed_ranks"
                        for c in seen)


# --- wrong LM head -------------------------------------------------------------------------------

def lm_head_all_reduced(x, weight_shard, comm):
    return comm.all_reduce(x @ weight_shard.t())


def lm_head_local_only(x, weight_shard, comm):
    return x @ weight_shard.t()


def lm_head_gather_wrong_dim(x, weight_shard, comm):
    return comm.all_gather(x @ weight_shard.t(), dim=0)


def lm_head_gathered_on_rank_0_only(x, weight_shard, comm):
    """Only rank 0 gathers (the others would wait for it forever in a real group)."""
    local = x @ weight_shard.t()
    return comm.all_gather(local, dim=-1) if comm.rank == 0 else local


def lm_head_transposing_the_shard(x, weight_shard, comm):
    """t_() transposes the caller's shard in place: right logits once, a transposed shard for the next call (issue 57:
    the mutant survived, judged calls get a copy of the shard)."""
    return comm.all_gather(x @ weight_shard.t_(), dim=-1)


@pytest.mark.parametrize("wrong, message", [(lm_head_all_reduced, "gather the pieces along the vocabulary"),
                                            (lm_head_transposing_the_shard, "changed the weight shard it was given"),
                                            (lm_head_local_only, "expected logits of shape"),
                                            (lm_head_gather_wrong_dim, "expected logits of shape"),
                                            (lm_head_gathered_on_rank_0_only, "called different collectives")])
def test_wrong_lm_heads_are_rejected(wrong, message) -> None:
    with pytest.raises(AssertionError, match=message):
        lab07.check_vocab_parallel_logits(wrong)


# --- wrong caches --------------------------------------------------------------------------------

def full_cache(cfg, tp, rank, max_seq_len):
    """Every rank allocates all KV heads (the model then writes fewer: shape error, and tp x the memory)."""
    return KVCache.for_model(cfg, max_seq_len=max_seq_len)


def cache_kv_over_tp(cfg, tp, rank, max_seq_len):
    """n_kv_heads // tp heads: zero heads when tp > n_kv_heads (forgets the replication)."""
    return KVCache([LayerKVCache(1, max_seq_len, cfg.n_kv_heads // tp, cfg.head_dim) for _ in range(cfg.n_layers)])


def shared_layer_cache(cfg, tp, rank, max_seq_len):
    """The same LayerKVCache for every layer: each layer's keys overwrite the previous layer's."""
    layer = LayerKVCache(1, max_seq_len, len(sharding.kv_heads(cfg, tp, rank)), cfg.head_dim)
    return KVCache([layer] * cfg.n_layers)


def layers_as_a_list(cfg, tp, rank, max_seq_len):
    """The layers, but not wrapped in a KVCache (generate_kv_cache needs its next_positions and length)."""
    return ref_make_cache(cfg, tp, rank, max_seq_len).layers


def half_precision_cache(cfg, tp, rank, max_seq_len):
    """float16 buffers for a float32 model: half the bytes, and keys rounded on the way in."""
    n_kv = len(sharding.kv_heads(cfg, tp, rank))
    return KVCache([LayerKVCache(1, max_seq_len, n_kv, cfg.head_dim, dtype=torch.float16)
                    for _ in range(cfg.n_layers)])


@pytest.mark.parametrize("wrong, message", [(full_cache, "expected 1 each"), (cache_kv_over_tp, "positive integer"),
                                            (shared_layer_cache, "share their buffers"),
                                            (layers_as_a_list, "expected a minigpt.cache.contiguous.KVCache"),
                                            (half_precision_cache, "float32")])
def test_wrong_caches_are_rejected(wrong, message) -> None:
    with pytest.raises(AssertionError, match=message):
        lab07.check_tp_kv_cache(wrong)


# --- wrong communication formula -----------------------------------------------------------------

def no_ring_factor(cfg, tp, bpe, wire):
    return float(2 * cfg.n_layers * cfg.d_model * bpe) if tp > 1 else 0.0


def one_allreduce_per_layer(cfg, tp, bpe, wire):
    return ref_allreduce_bytes(cfg, tp, bpe, wire) / 2


def gather_factor(cfg, tp, bpe, wire):
    payload = 2 * cfg.n_layers * cfg.d_model * bpe
    return payload * (tp - 1) / tp if wire else float(payload)


def ignores_element_size(cfg, tp, bpe, wire):
    """Always 4-byte elements: right for float32 only."""
    return ref_allreduce_bytes(cfg, tp, 4, wire)


def ring_factor_without_division(cfg, tp, bpe, wire):
    payload = 2 * cfg.n_layers * cfg.d_model * bpe
    return float(payload * 2 * (tp - 1)) if wire else float(payload)


@pytest.mark.parametrize("wrong, message", [(no_ring_factor, "ring factor"), (one_allreduce_per_layer, "two"),
                                            (gather_factor, "all-GATHER"),
                                            (ignores_element_size, "use bytes_per_element"),
                                            (ring_factor_without_division, "not 2\\(n-1\\)")])
def test_wrong_byte_formulas_are_rejected(wrong, message) -> None:
    with pytest.raises(AssertionError, match=message):
        lab07.check_allreduce_bytes(wrong)


def test_wire_factor_mistake_at_tp2_is_not_blamed_on_the_layer_count() -> None:
    """At tp = 2 the all-gather factor (n-1)/n halves the payload, as one all-reduce per layer would: the message
    names the factor, not the layer count."""
    with pytest.raises(AssertionError) as err:
        lab07.check_allreduce_bytes(gather_factor)
    assert "all-GATHER" in str(err.value) and "per layer" not in str(err.value)


# --- interview questions -------------------------------------------------------------------------

def test_interview_answers() -> None:
    # Qwen2.5-32B's shape, by hand: 64 layers, d_model 5120, bf16
    pcie = INTERCONNECTS["PCIe Gen5 x16"]
    lab07.check_q1_tp_bytes(2 * 32 * 5120 * 2 * 2 * 3 // 4)               # its stage's 32 layers, ring over 4
    lab07.check_q2_pp_bytes(7 * 32 * 5120 * 2)
    lab07.check_q3_bubble(1 - 6 / 8)
    lab07.check_q4_tp_latency(128 * ring_allreduce_time(64 * 10240, 8, pcie) * 1e3)
    assert pipeline_bubble_fraction(8, 6) == 7 / 13
    for check, wrong, message in ((lab07.check_q1_tp_bytes, 2 * 32 * 5120 * 2, "payload"),
                                  (lab07.check_q1_tp_bytes, 983_040.0, "int"),
                                  (lab07.check_q1_tp_bytes, 2 * 64 * 5120 * 2 * 2 * 3 // 4, "one stage"),
                                  (lab07.check_q1_tp_bytes, 2 * 32 * 5120 * 2 * 2 * 7 // 8, "n = 4"),
                                  (lab07.check_q2_pp_bytes, 8 * 32 * 5120 * 2, "7 boundaries"),
                                  (lab07.check_q2_pp_bytes, 7 * 5120 * 2, "32 sequences"),
                                  (lab07.check_q3_bubble, 7 / 13, "drain-every-step"),
                                  (lab07.check_q3_bubble, 0.0, "at least p micro-batches"),
                                  (lab07.check_q3_bubble, 6 / 8, "busy share"),
                                  (lab07.check_q4_tp_latency, 128 * ring_allreduce_time(10240, 8, pcie) * 1e3, "batch-1"),
                                  (lab07.check_q4_tp_latency, 128 * 14 / 8 * 64 * 10240 / pcie.bandwidth * 1e3,
                                   "bandwidth term alone"),
                                  (lab07.check_q4_tp_latency, None, "finite")):
        with pytest.raises(AssertionError, match=message):
            check(wrong)


def test_no_question_is_about_a_model_the_planner_lists() -> None:
    """The planner widget prints bytes and times for every preset: the questions' shape must not be one of them."""
    assert all((s.n_layers, s.d_model) != (lab07.Q_LAYERS, lab07.Q_D_MODEL) for s in PRESETS.values())


def test_q3_answer_is_what_the_simulation_gives() -> None:
    """The steady-state idle share of 6 micro-batches kept in flight through 8 stages, simulated, is Q3's answer,
    and the drain-every-step schedule gives the textbook (p-1)/(m+p-1)."""
    from minigpt.teaching.pipeline_schedule import simulate_pipeline
    serving = simulate_pipeline(8, 6, 12, drain_every_step=False)
    drained = simulate_pipeline(8, 6, 12, drain_every_step=True)
    lab07.check_q3_bubble(serving.steady_idle_fraction())
    assert drained.idle_fraction() == pytest.approx(pipeline_bubble_fraction(8, 6))
    assert simulate_pipeline(4, 8, 12, drain_every_step=False).steady_idle_fraction() == 0.0
