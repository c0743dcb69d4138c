"""Tensor parallelism (lab 07): slices, collectives, TP = 2 against one process, sharded loading, launch errors.

Ranks run as threads (fast, no ports) for most tests and as real gloo processes in a few; all shapes are tiny.
"""

from __future__ import annotations

import time

import pytest
import torch

from minigpt.checkpoint import load_model
from minigpt.config import TARGET_CONFIG, ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.model import GPT
from minigpt.parallel import sharding
from minigpt.parallel.comm import CountingComm, Solo, ThreadGroup, ring_wire_bytes
from minigpt.parallel.launch import RankError, run_ranks, torchrun
from minigpt.parallel.loading import load_shard
from minigpt.parallel.tp_model import build_tp_model, load_tp_model, shard_model, tp_kv_cache

GQA = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)
MQA = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=48)
MHA = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, d_ff=48)


def _model(cfg: ModelConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg).eval()


# ----------------------------------------------------------------------------------------- slices

@pytest.mark.parametrize("cfg", [GQA, MQA, MHA])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_slices_cover_every_weight_exactly(cfg: ModelConfig, tp: int) -> None:
    full = _model(cfg).state_dict()
    shards = [sharding.shard_state_dict(full, cfg, tp, r, vocab_parallel=True) for r in range(tp)]
    for name, w in full.items():
        if name == "lm_head.weight":
            continue
        kind = sharding.parameter_kind(name, vocab_parallel=True)
        pieces = [s[name] for s in shards]
        if kind == "replicated":
            assert all(torch.equal(p, w) for p in pieces), name
        elif kind in ("column", "vocab"):
            glued = torch.cat(pieces, 0)
            if name.endswith(("wk.weight", "wv.weight")) and tp > cfg.n_kv_heads:
                glued = torch.cat(pieces[:: tp // cfg.n_kv_heads], 0)     # one copy of each replicated head
            assert torch.equal(glued, w), name
        else:
            assert torch.equal(torch.cat(pieces, 1), w), name


def test_queries_and_their_kv_heads_stay_together() -> None:
    for cfg in (GQA, MQA, MHA, TARGET_CONFIG):
        for tp in (1, 2, 4, 6):
            try:
                sharding.check_tp(cfg, tp)
            except ValueError:
                continue
            for r in range(tp):
                q, kv = sharding.query_heads(cfg, tp, r), sharding.kv_heads(cfg, tp, r)
                assert {h // cfg.group_size for h in q} == set(kv)


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    assert [list(sharding.kv_heads(MQA, 4, r)) for r in range(4)] == [[0]] * 4
    assert sharding.kv_replication(MQA, 4) == 4 and sharding.kv_replication(GQA, 2) == 1
    assert [list(sharding.kv_heads(GQA, 4, r)) for r in range(4)] == [[0], [0], [1], [1]]


@pytest.mark.parametrize("tp, match", [(3, "does not divide n_heads"), (0, "positive"), (8, "does not divide n_heads")])
def test_bad_tp_is_refused(tp: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sharding.check_tp(GQA, tp)


def test_target_refuses_tp_4_and_3() -> None:
    with pytest.raises(ValueError, match="n_heads=6"):
        sharding.query_heads(TARGET_CONFIG, 4, 0)
    with pytest.raises(ValueError, match="n_kv_heads=2"):          # 6 heads / 3 ranks, but 2 KV heads
        sharding.check_tp(TARGET_CONFIG, 3)


def test_norms_are_replicated_and_unknown_names_refused() -> None:
    assert sharding.parameter_kind("layers.0.attn_norm.weight") == "replicated"
    assert sharding.parameter_kind("norm.weight") == "replicated"
    with pytest.raises(KeyError, match="no sharding rule"):
        sharding.parameter_kind("layers.0.attn.bias")


# ----------------------------------------------------------------------------------------- collectives

def test_ring_factor() -> None:
    assert ring_wire_bytes("all_reduce", 1000, 2) == 1000
    assert ring_wire_bytes("all_reduce", 800, 8) == 1400
    assert ring_wire_bytes("all_gather", 800, 4) == 600
    assert ring_wire_bytes("ring_send", 800, 4) == 800            # a ring pass sends its tensor, nothing more
    with pytest.raises(ValueError):
        ring_wire_bytes("broadcast", 1, 2)


def test_thread_collectives_sum_and_gather() -> None:
    def work(comm: CountingComm):
        t = torch.full((2, 3), float(comm.rank + 1))
        return comm.all_reduce(t), comm.all_gather(t, dim=-1), dict(comm.stats.calls), dict(comm.stats.bytes)

    out = run_ranks(work, 2, backend="threads")
    for reduced, gathered, calls, nbytes in out:
        assert torch.equal(reduced, torch.full((2, 3), 3.0))
        assert torch.equal(gathered, torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)], -1))
        assert calls == {"all_reduce": 1, "all_gather": 1} and nbytes == {"all_reduce": 24, "all_gather": 48}


def _ring_pass_work(comm: CountingComm):
    t = torch.full((2, 3), float(comm.rank))
    return comm.ring_pass(t), dict(comm.stats.calls), dict(comm.stats.bytes), comm.stats.wire_bytes()


@pytest.mark.parametrize("n, backend", [(3, "threads"), (2, "gloo"), (1, "threads")])
def test_a_ring_pass_returns_the_left_neighbours_tensor_and_is_counted(n: int, backend: str) -> None:
    out = run_ranks(_ring_pass_work, n, backend=backend, timeout_s=60)
    for rank, (received, calls, nbytes, wire) in enumerate(out):
        assert torch.equal(received, torch.full((2, 3), float((rank - 1) % n)))
        assert calls == {"ring_send": 1} and nbytes == {"ring_send": 24} and wire == 24


def test_a_solo_ring_pass_is_a_copy_and_refuses_a_non_tensor() -> None:
    comm, t = CountingComm(Solo()), torch.arange(4.0)
    received = comm.ring_pass(t)
    assert torch.equal(received, t) and received.data_ptr() != t.data_ptr()
    assert comm.stats.calls == {"ring_send": 1} and comm.stats.bytes == {"ring_send": 16}
    with pytest.raises(TypeError, match="sends a tensor"):
        comm.ring_pass([1.0, 2.0])
    assert comm.stats.calls == {"ring_send": 1}


# ----------------------------------------------------------------------------------------- TP = 2 == one process

def _tp_forward(comm: CountingComm, full: GPT, vocab_parallel: bool):
    cfg = full.config
    model = shard_model(full, comm, vocab_parallel=vocab_parallel)
    tokens = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = tp_kv_cache(cfg, comm.world_size, comm.rank, batch_size=2, max_seq_len=8)
        prefill = model(tokens, positions=cache.next_positions(7), kv_caches=cache)
        comm.stats.reset()
        decode = model(tokens[:, :1], positions=cache.next_positions(1), kv_caches=cache)
    return prefill, decode, dict(comm.stats.calls), dict(comm.stats.bytes), cache[0].n_kv_heads


@pytest.mark.parametrize("cfg, tp", [(GQA, 2), (MQA, 2), (GQA, 4), (MHA, 4)])
@pytest.mark.parametrize("vocab_parallel", [False, True])
def test_tp_logits_match_one_process(cfg: ModelConfig, tp: int, vocab_parallel: bool) -> None:
    full = _model(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want_prefill = full(tokens)
        want_decode = full(torch.cat([tokens, tokens[:, :1]], 1))[:, -1:]
    outs = run_ranks(_tp_forward, tp, full, vocab_parallel, backend="threads")
    for prefill, decode, calls, nbytes, n_kv in outs:
        torch.testing.assert_close(prefill, want_prefill, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(decode, want_decode, atol=1e-5, rtol=1e-4)
        # exactly two all-reduces per layer of (B, 1, d_model) float32, plus the vocab-parallel pair
        layer_bytes = 2 * cfg.n_layers * 2 * cfg.d_model * 4
        if vocab_parallel:
            assert calls == {"all_reduce": 2 * cfg.n_layers + 1, "all_gather": 1}
            assert nbytes == {"all_reduce": layer_bytes + 2 * cfg.d_model * 4, "all_gather": 2 * cfg.vocab_size * 4}
        else:
            assert calls == {"all_reduce": 2 * cfg.n_layers} and nbytes == {"all_reduce": layer_bytes}
        assert n_kv == max(1, cfg.n_kv_heads // tp)


def test_tp1_is_the_plain_model() -> None:
    full = _model(GQA)
    model = shard_model(full, CountingComm(Solo()))
    tokens = torch.arange(5)[None]
    with torch.no_grad():
        assert torch.equal(model(tokens), full(tokens))


def _generate(comm: CountingComm, name: str, n: int):
    model = load_tp_model(name, comm, vocab_parallel=True)
    prompt = list(range(10, 22))
    cache = tp_kv_cache(model.config, comm.world_size, comm.rank, max_seq_len=len(prompt) + n)
    return generate_kv_cache(model, prompt, n, cache=cache).tokens, load_shard(name, comm.world_size, comm.rank).bytes_read


def test_trained_target_generation_is_token_identical_on_two_gloo_ranks() -> None:
    """Real processes, gloo: sharded loading + sharded KV cache + lab 01's loop == one process."""
    want = generate_kv_cache(load_model("target"), list(range(10, 22)), 12).tokens
    (tok0, read0), (tok1, read1) = run_ranks(_generate, 2, "target", 12, backend="gloo", timeout_s=120)
    assert tok0 == tok1 == want
    file_bytes = load_shard("target", 1, 0).bytes_read
    assert read0 < 0.6 * file_bytes and read1 < 0.6 * file_bytes        # each rank read about half


def test_sharded_loading_matches_sharding_the_full_model() -> None:
    full = load_model("target")
    shard = load_shard("target", 2, 1, vocab_parallel=True)
    want = sharding.shard_state_dict(full.state_dict(), full.config, 2, 1, vocab_parallel=True)
    assert set(shard.state) == set(want)
    for k in want:
        torch.testing.assert_close(shard.state[k], want[k], atol=0, rtol=0)


def test_a_hugging_face_folder_gives_the_same_shard_as_the_checkpoint(tmp_path) -> None:
    """The same rank's shard read from the course's checkpoint and from its export as an HF Llama folder."""
    from minigpt.hf.export import export_hf

    folder = export_hf("draft", tmp_path / "draft-hf")
    ours = load_shard("draft", 2, 1, vocab_parallel=True, dtype=torch.float32)
    theirs = load_shard(folder, 2, 1, vocab_parallel=True, dtype=torch.float32)
    assert set(theirs.state) == set(ours.state) and theirs.config == ours.config
    for k in ours.state:          # the export stores bf16: compare at that precision
        torch.testing.assert_close(theirs.state[k], ours.state[k].to(torch.bfloat16).float(), atol=0, rtol=0)
    assert 0 < theirs.bytes_read < theirs.file_bytes


def test_world_size_must_match_the_plan() -> None:
    with pytest.raises(RankError, match="ranks 0, 1 failed: ValueError: the plan asks for tp=4 but the world has 2"):
        run_ranks(lambda comm: load_tp_model("target", comm, expected_world_size=4), 2, backend="threads")


def test_build_refuses_a_shard_for_another_tp() -> None:
    state = sharding.shard_state_dict(_model(GQA).state_dict(), GQA, 4, 0)
    with pytest.raises(RankError, match="ranks 0, 1 failed"):       # the same error on both ranks: said once
        run_ranks(lambda comm: build_tp_model(GQA, comm, state), 2, backend="threads")


# ----------------------------------------------------------------------------------------- failures never hang

def _crash_rank_1(comm: CountingComm):
    if comm.rank == 1:
        raise RuntimeError("boom")
    return comm.all_reduce(torch.ones(3))


@pytest.mark.parametrize("backend", ["threads", "gloo"])
def test_a_crashing_rank_is_named_and_nothing_hangs(backend: str) -> None:
    start = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1 failed: RuntimeError: boom"):
        run_ranks(_crash_rank_1, 2, backend=backend, timeout_s=30, collective_timeout_s=5)
    assert time.monotonic() - start < 25


def test_a_failing_rank_shows_the_callers_lines_not_the_launcher() -> None:
    """A learner's worker (issue 40: lab 09 exercise 6 printed launch.py and ring_attention.py once per rank)."""
    with pytest.raises(RankError) as err:
        run_ranks(_crash_rank_1, 2, backend="gloo", timeout_s=30, collective_timeout_s=5)
    text = str(err.value)
    assert 'raise RuntimeError("boom")' in text and "test_parallel.py" in text, text
    assert "launch.py" not in text and "comm.py" not in text, text


def _hang_rank_0(comm: CountingComm):
    if comm.rank == 0:
        time.sleep(60)
    return comm.rank


def test_a_hung_rank_is_named_and_killed() -> None:
    start = time.monotonic()
    with pytest.raises(RankError, match=r"rank 0 did not finish within 3 s"):
        run_ranks(_hang_rank_0, 2, backend="gloo", timeout_s=3)
    assert time.monotonic() - start < 15


def test_torchrun_two_ranks_matches_one_process() -> None:
    report = torchrun("minigpt.parallel.generate_tp", 2, ["--max-new-tokens", "6"], timeout_s=150)
    assert report["tokens"] == report["one_process_tokens"]
    assert report["max_logit_diff_prefill"] < 1e-3 and report["max_logit_diff_decode"] < 1e-3
    per_token = report["collectives_per_decode_token"]
    assert per_token["all_reduce"]["calls"] == 2 * TARGET_CONFIG.n_layers + 1
    assert per_token["all_reduce"]["bytes"] == (2 * TARGET_CONFIG.n_layers + 1) * TARGET_CONFIG.d_model * 4


def test_torchrun_failure_names_the_rank() -> None:
    with pytest.raises(RankError, match="rank 1 crashed on purpose"):
        torchrun("minigpt.parallel.generate_tp", 2, ["--fail-rank", "1", "--timeout-s", "10"], timeout_s=90)


# ----------------------------------------------------------------------------------------- property: slices partition

from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(n_kv=st.sampled_from([1, 2, 4, 8]), group=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2, 4, 8, 16]),
       head_dim=st.sampled_from([2, 4]), ff_mult=st.integers(1, 3))
def test_every_query_head_and_ffn_unit_has_exactly_one_rank(n_kv: int, group: int, tp: int, head_dim: int, ff_mult: int) -> None:
    n_heads = n_kv * group
    cfg = ModelConfig(vocab_size=32, max_seq_len=8, d_model=n_heads * head_dim, n_layers=1, n_heads=n_heads,
                      n_kv_heads=n_kv, d_ff=16 * ff_mult)
    try:
        sharding.check_tp(cfg, tp)
    except ValueError:
        assert n_heads % tp or (n_kv % tp and tp % n_kv) or cfg.d_ff % tp
        return
    owners = [r for r in range(tp) for _ in sharding.query_heads(cfg, tp, r)]
    assert owners == sorted(owners) and len(owners) == n_heads                      # contiguous, each head once
    assert sum(len(sharding.ffn_units(cfg, tp, r)) for r in range(tp)) == cfg.d_ff
    copies = [sum(h in sharding.kv_heads(cfg, tp, r) for r in range(tp)) for h in range(n_kv)]
    assert copies == [sharding.kv_replication(cfg, tp)] * n_kv                       # each KV head equally replicated
    for r in range(tp):
        assert {h // cfg.group_size for h in sharding.query_heads(cfg, tp, r)} == set(sharding.kv_heads(cfg, tp, r))


def test_ranks_failing_alike_are_named_in_order_whichever_reported_first():
    """The group's ranks are sorted (the order reports arrive in is the machine's, not the test's)."""
    from minigpt.parallel.launch import RankError, _raise_if_failed

    with pytest.raises(RankError, match=r"^ranks 0, 1 failed: boom\nrank 2 stopped$"):
        _raise_if_failed({1: "boom", 0: "boom"}, {2: "stopped"})
