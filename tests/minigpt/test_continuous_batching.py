"""Lab 03 reference: requests, scheduler, packed runner, baselines, metrics, roofline simulator."""

from __future__ import annotations

import pytest
import torch

from autograder.checking import models as checking
from autograder import lab03
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.paged import PagedKVCache
from minigpt.cache.paged_attention import paged_attention
from minigpt.engine.baselines import StaticBatchScheduler, run_sequential, static_generate
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.metrics import goodput, percentile, request_metrics, summarize
from minigpt.engine.packed_batch import pack_chunks, varlen_paged_attention
from minigpt.engine.request import Request, SequenceStatus
from minigpt.engine.runner import ModelRunner, rows_computed
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import serve
from minigpt.sampling import SamplingParams
from minigpt.costmodel.calculators import PRESETS, weight_bytes_read
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.serving_simulator import goodput_curve, knee, poisson_workload, simulate, step_cost
from minigpt.timing import fixed_threads


@pytest.fixture(scope="module")
def model():
    return checking.scaled_model(0)


def _requests(n, seed=0, max_prompt=40, max_new=20, **kw):
    g = torch.Generator().manual_seed(seed)
    return [Request(i, torch.randint(0, 255, (int(torch.randint(2, max_prompt, (1,), generator=g)),), generator=g).tolist(),
                    int(torch.randint(1, max_new, (1,), generator=g)), stop_token_ids=(), **kw) for i in range(n)]


def test_scheduler_invariants_on_seeded_workloads():
    lab03.scheduler_invariants(Scheduler, max_examples=150)


def test_packed_step_equals_padded_step_and_wastes_nothing(model):
    """One mixed step (a 20-token chunk + 3 decodes): the same logits in both layouts, 23 rows vs 4 * 20."""
    logits, rows = {}, {}
    for layout in ("packed", "padded"):
        cache = PagedKVCache.for_model(model, 64, 4)
        sch = Scheduler(cache.manager, SchedulerConfig(4, 64), max_model_len=96)
        runner = ModelRunner(model, cache, layout)
        for r in _requests(3, seed=1, max_prompt=10):
            sch.add_request(r)
        out = sch.schedule()
        sch.update(out, runner.execute(out), 0.0)                       # prefill three prompts
        sch.add_request(Request("long", list(range(20)), 3, stop_token_ids=()))
        out = sch.schedule()
        assert sorted(len(c.tokens) for c in out.chunks) == [1, 1, 1, 20]
        with fixed_threads(1):
            logits[layout] = runner.forward(out.chunks)
        rows[layout] = rows_computed(out.chunks, layout)
    torch.testing.assert_close(logits["packed"], logits["padded"], atol=1e-4, rtol=1e-4)
    assert rows == {"packed": 23, "padded": 80}


def test_varlen_attention_matches_lab02_padded_attention():
    g = torch.Generator().manual_seed(0)
    Hq, Hkv, D, bs = 4, 2, 8, 4
    k_pool, v_pool = torch.randn(16, bs, Hkv, D, generator=g), torch.randn(16, bs, Hkv, D, generator=g)
    tables = torch.tensor([[3, 7, 1, 0], [5, 9, 0, 0], [2, 0, 0, 0]], dtype=torch.int32)
    seq_lens, q_lens = torch.tensor([13, 6, 1]), torch.tensor([5, 1, 1])
    q = torch.randn(1, Hq, 7, D, generator=g)
    got = varlen_paged_attention(q, k_pool, v_pool, torch.tensor([0, 5, 6, 7]), seq_lens, tables)
    padded = torch.zeros(3, Hq, 5, D)
    padded[0], padded[1, :, :1], padded[2, :, :1] = q[0, :, :5], q[0, :, 5:6], q[0, :, 6:7]
    want = paged_attention(padded, k_pool, v_pool, tables, seq_lens, q_lens)
    torch.testing.assert_close(got[0, :, :5], want[0])
    torch.testing.assert_close(got[0, :, 5:6], want[1, :, :1])
    torch.testing.assert_close(got[0, :, 6:7], want[2, :, :1])


def test_sampled_outputs_survive_preemption(model):
    """Temperature sampling: each sequence keeps its own generator across preemption, so output == alone."""
    params = SamplingParams(temperature=0.8, seed=3)
    reqs = _requests(6, seed=2, sampling=params)
    cache = PagedKVCache.for_model(model, 14, 4)
    with fixed_threads(1):
        res = serve(reqs, Scheduler(cache.manager, SchedulerConfig(4, 8), max_model_len=96), ModelRunner(model, cache).execute)
        assert sum(s.num_preemptions for s in res.sequences) > 0
        for s in res.sequences:
            assert s.output_tokens == generate_kv_cache(model, list(s.prompt), s.request.max_new_tokens, params,
                                                        stop_token_ids=()).tokens
    assert cache.manager.pool.num_used == 0


def test_bad_requests_rejected_others_served(model):
    reqs = _requests(3, seed=4) + [Request("too-long", [1] * 90, 10, stop_token_ids=())]
    cache = PagedKVCache.for_model(model, 64, 4)
    with fixed_threads(1):
        res = serve(reqs, Scheduler(cache.manager, SchedulerConfig(4, 16), max_model_len=96), ModelRunner(model, cache).execute)
    assert [r.request_id for r, _ in res.rejected] == ["too-long"] and "exceeds the context" in res.rejected[0][1]
    assert len(res.sequences) == 3 and all(s.status is SequenceStatus.FINISHED for s in res.sequences)


@pytest.mark.parametrize("kwargs, match", [({"prompt": [], "max_new_tokens": 3}, "empty"),
                                           ({"prompt": [1], "max_new_tokens": 0}, "max_new_tokens"),
                                           ({"prompt": [1], "max_new_tokens": -2}, "max_new_tokens"),
                                           ({"prompt": [1], "max_new_tokens": 2, "arrival_time": -1.0}, "arrival_time")])
def test_request_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Request("r", **kwargs)


def test_config_and_abort_errors():
    for bad in [dict(max_num_seqs=0), dict(max_num_batched_tokens=-4), dict(max_num_seqs=8, max_num_batched_tokens=4)]:
        with pytest.raises(ValueError):
            SchedulerConfig(**bad)
    sch = Scheduler(BlockManager(8, 4), SchedulerConfig(2, 8), max_model_len=64)
    sch.add_request(Request("a", [1, 2, 3], 4))
    with pytest.raises(ValueError, match="already in use"):
        sch.add_request(Request("a", [1], 1))
    with pytest.raises(ValueError, match="no such unfinished request"):
        sch.abort("nope")
    out = sch.schedule()
    sch.update(out, {"a": 5}, 1.0)
    sch.abort("a")
    assert sch.manager.pool.num_used == 0 and not sch.has_unfinished()
    with pytest.raises(ValueError, match="pool has only"):
        sch.add_request(Request("big", [1] * 40, 2))
    with pytest.raises(ValueError, match="chunked prefill"):
        Scheduler(BlockManager(64, 4), SchedulerConfig(2, 8, enable_chunked_prefill=False),
                  max_model_len=64).add_request(Request("c", [1] * 12, 2))


def test_baselines_match_alone(model):
    reqs = _requests(5, seed=5)
    with fixed_threads(1):
        seq = run_sequential(model, reqs)
        stat = static_generate(model, [list(r.prompt) for r in reqs], [r.max_new_tokens for r in reqs], 2)
        for r, s, st in zip(reqs, seq.sequences, stat):
            want = generate_kv_cache(model, list(r.prompt), r.max_new_tokens, stop_token_ids=()).tokens
            assert s.output_tokens == want == st


def test_static_scheduler_waits_for_a_full_batch():
    sch = StaticBatchScheduler(BlockManager(64, 4), 3, max_model_len=64)
    sch.add_request(Request("a", [1, 2], 2))
    assert not sch.schedule().chunks                       # waits for 3
    sch.end_of_arrivals()
    assert [c.seq_id for c in sch.schedule().chunks] == ["a"]


def test_metrics():
    lab03.metrics_cases(request_metrics, goodput)
    assert percentile([1, 2, 3, 4], 50) == 2.5
    with pytest.raises(ValueError):
        percentile([], 50)


def test_chunked_prefill_lowers_inter_token_latency_in_steps():
    """A 60-token prompt arrives while 3 requests decode: without chunking one step carries all 60 tokens."""
    def run(chunked):
        sch = Scheduler(BlockManager(200, 4), SchedulerConfig(4, 64 if not chunked else 16, chunked), max_model_len=128)
        arrivals = [(0, Request(i, [1, 2, 3], 30, stop_token_ids=())) for i in range(3)]
        arrivals.append((5, Request("long", list(range(60)), 2, stop_token_ids=())))
        sizes = []
        lab03.drive(sch, arrivals, on_step=lambda step, view: sizes.append(sum(len(c["tokens"]) for c in view["chunks"])))
        return max(sizes)
    assert run(False) == 63 and run(True) == 16


def test_roofline_step_cost_and_simulator():
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    reqs = poisson_workload(60, 8.0, seed=1)
    res = simulate("continuous", reqs)
    assert len(res.sequences) == 60 and res.output_tokens == sum(r.max_new_tokens for r in reqs)
    one_decode = step_cost(_one_decode(), shape, gpu)
    assert one_decode == pytest.approx(weight_bytes_read(shape, 1) / gpu.memory_bandwidth, rel=0.01)   # what a step reads
    pts = {p: goodput_curve(p, [2.0, 16.0], n=60) for p in ("static", "continuous")}
    assert pts["continuous"][-1].goodput >= pts["static"][-1].goodput
    assert knee(pts["continuous"], 0.0) == 16.0


def _one_decode():
    sch = Scheduler(BlockManager(8, 4), SchedulerConfig(2, 8), max_model_len=64)
    sch.add_request(Request("a", [1], 3, stop_token_ids=()))
    return sch.schedule()


def test_serving_widget_readout():
    from minigpt.teaching.serving_widget import ServingSimulator, serving_readout
    text, fig, pts = serving_readout("continuous", 5.0, 0.5, 1024, n=20)
    assert "continuous" in text and "token budget 1024" in text and [p.rate for p in pts] == [1.0, 2.0, 5.0]
    with pytest.raises(ValueError, match="policy"):
        serving_readout("fifo", 5.0, 0.5, 1024)
    w = ServingSimulator(max_rate=2.0)
    before = w.readout.value
    w.policy.value = "static"
    assert w.readout.value != before and "static" in w.readout.value


@pytest.mark.parametrize("lens", [[37], [5, 17, 33], [16, 16]])
def test_decode_step_attention_equals_paged_decode_attention(lens):
    """The engine's decode-only path (rows found once per step, fused SDPA per layer) equals lab 02's reference."""
    from minigpt.cache.paged_attention import paged_decode_attention
    from minigpt.engine.packed_batch import decode_attention, decode_rows
    g = torch.Generator().manual_seed(len(lens))
    bs, nb, Hkv, Hq, D, B = 8, 32, 2, 4, 16, len(lens)
    k_pool, v_pool = torch.randn(nb, bs, Hkv, D, generator=g), torch.randn(nb, bs, Hkv, D, generator=g)
    perm = torch.randperm(nb, generator=g)
    tables = torch.stack([perm[6 * b:6 * (b + 1)] for b in range(B)]).int()
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(B, Hq, D, generator=g)
    want = paged_decode_attention(q, k_pool, v_pool, tables, seq_lens)
    got = decode_attention(q[:, :, None], k_pool, v_pool, *decode_rows(tables, seq_lens, bs))[:, :, 0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
