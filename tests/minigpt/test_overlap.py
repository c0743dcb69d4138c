"""Overlap scheduling (lab 12): the engine with `async_scheduling` hands out the serial engine's tokens, their
log-probabilities and finish reasons on drawn workloads (admissions, chunked prefill, preemption, prefix caching, stop
tokens, greedy and seeded sampling), aborts and failing requests go as in the serial engine, no step runs a request
that has stopped, every block comes back, and a placeholder is never hashed into the prefix cache. The
log-probabilities matter: this small random model mostly repeats its last token, so a step made ahead that reads
the wrong K/V would leave the tokens as they were."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.engine.request import PLACEHOLDER, Request, Sequence
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.tokenizer import EOT_ID
from tests.minigpt.recorded_logprobs import assert_same_outputs

CONFIG = ModelConfig(vocab_size=EOT_ID + 1, max_seq_len=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
STOP_BIAS = ((EOT_ID, 6.0),)      # the end-of-text token drawn every 15 steps or so by a random model at temperature 1


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> GPT:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return GPT(CONFIG).eval()


def _workload(seed: int) -> list[tuple[list[int], int, SamplingParams]]:
    """Requests drawn from `seed`: prompts of 1-60 tokens, some sharing a prefix; budgets of 1-30 tokens; greedy,
    seeded, and seeded with the end-of-text token likely."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, 4000, (24,), generator=g).tolist()
    out = []
    for i in range(12):
        n = int(torch.randint(1, 61, (1,), generator=g))
        prompt = torch.randint(0, 4000, (n,), generator=g).tolist()
        if i % 3 == 0:
            prompt = shared + prompt[:20]
        budget = int(torch.randint(1, 31, (1,), generator=g))
        kind = i % 3
        sampling = (SamplingParams() if kind == 0 else SamplingParams(temperature=1.0, seed=seed * 100 + i) if kind == 1
                    else SamplingParams(temperature=1.0, seed=seed * 100 + i, logit_bias=STOP_BIAS))
        out.append((prompt, budget, sampling))
    return out


def _run(model: GPT, requests, *, async_scheduling: bool, abort_after: dict | None = None, **config):
    """Every request's tokens with their log-probabilities, its finish reason, and the engine."""
    settings = {"num_blocks": 14, "block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 16,
                "enable_prefix_caching": True, "batch_invariant": True, **config}
    engine = LLMEngine(model, EngineConfig(async_scheduling=async_scheduling, **settings))
    for i, (prompt, budget, sampling) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, max_tokens=budget, sampling=replace(sampling, logprobs=0))
    tokens: dict = {f"r{i}": [] for i in range(len(requests))}
    reasons: dict = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += [(t, lp.logprob) for t, lp in zip(out.new_token_ids, out.logprobs, strict=True)]
            if out.finish_reason is not None:
                reasons[out.request_id] = out.finish_reason
        for rid, n in (abort_after or {}).items():
            if rid not in reasons and len(tokens[rid]) >= n:
                reasons[rid] = engine.abort(rid).finish_reason
    engine.close()
    assert engine.cache.manager.pool.num_used == 0, "blocks still held after every request finished"
    return tokens, reasons, engine


@pytest.mark.parametrize("seed", range(4))
def test_overlapped_engine_hands_out_the_serial_engines_tokens(model, seed):
    requests = _workload(seed)
    serial, serial_reasons, _ = _run(model, requests, async_scheduling=False)
    overlapped, reasons, engine = _run(model, requests, async_scheduling=True)
    assert reasons == serial_reasons
    differ = [rid for rid in serial if serial[rid] != overlapped[rid]]
    assert not differ, f"seed {seed}: requests {differ} got other tokens or log-probabilities than in the serial engine"
    assert "stop" in reasons.values() and "length" in reasons.values(), "the workload should stop both ways"
    assert engine.num_preemptions > 0, "the workload should preempt"


def test_without_batch_invariance_the_same_batches_give_the_same_tokens(model):
    requests = [(list(range(5 + i, 30 + 3 * i)), 20, SamplingParams()) for i in range(4)]
    serial, _, _ = _run(model, requests, async_scheduling=False, batch_invariant=False, num_blocks=64)
    overlapped, _, _ = _run(model, requests, async_scheduling=True, batch_invariant=False, num_blocks=64)
    assert_same_outputs(list(overlapped.values()), list(serial.values()), "overlap scheduling")


def test_an_abort_between_steps_ends_the_request_as_in_the_serial_engine(model):
    requests = _workload(7)
    cut = {"r1": 3, "r4": 1, "r5": 6}
    serial, serial_reasons, _ = _run(model, requests, async_scheduling=False, abort_after=cut)
    overlapped, reasons, _ = _run(model, requests, async_scheduling=True, abort_after=cut)
    assert reasons == serial_reasons and overlapped == serial


def test_a_request_whose_sampling_fails_fails_alone(model):
    requests = [(list(range(10, 30)), 12, SamplingParams()), (list(range(40, 50)), 12, SamplingParams())]
    runs = []
    for async_scheduling in (False, True):
        engine = LLMEngine(model, EngineConfig(num_blocks=32, block_size=8, async_scheduling=async_scheduling,
                                               enable_prefix_caching=False))
        for i, (prompt, budget, sampling) in enumerate(requests):
            engine.add_request(f"r{i}", prompt, max_tokens=budget, sampling=sampling)
        engine.scheduler.sequences["r1"].logits_processor = _failing_after(4)
        outs = []
        while engine.has_unfinished():
            outs += engine.step()
        engine.close()
        assert engine.cache.manager.pool.num_used == 0
        runs.append({(o.request_id, tuple(o.new_token_ids), o.finish_reason, o.error is not None) for o in outs})
    assert runs[0] == runs[1]


def _failing_after(n: int):
    def processor(logits, output_tokens):
        if len(output_tokens) >= n:
            raise RuntimeError("a processor that breaks")
        return logits
    return processor


def test_no_step_computes_a_request_after_it_stopped(model):
    """The step scheduled ahead drops a request whose token just stopped it: the overlapped engine computes no
    more token rows than the serial one on a workload where every request stops on a token."""
    requests = [(list(range(3 * i, 3 * i + 9)), 30, SamplingParams(temperature=1.0, seed=i, logit_bias=STOP_BIAS))
                for i in range(6)]
    serial = _run(model, requests, async_scheduling=False)[2].runner.num_rows
    overlapped = _run(model, requests, async_scheduling=True)[2].runner.num_rows
    assert overlapped <= serial


def test_a_placeholder_counts_as_a_token_but_is_never_output_or_hashed(model):
    seq = Sequence(Request("a", (1, 2, 3), max_new_tokens=2))
    assert seq.append_placeholder() is None
    assert seq.num_tokens == 4 and seq.token_slice(3, 4) == [PLACEHOLDER] and seq.output_tokens == []
    with pytest.raises(ValueError, match="already waits"):
        seq.append_placeholder()
    assert seq.resolve_placeholder(9, 1.0) is None and seq.token_slice(3, 4) == [9]
    assert seq.append_placeholder() == "length"
    engine = LLMEngine(model, EngineConfig(num_blocks=8, block_size=4, enable_prefix_caching=True))
    manager = engine.cache.manager
    manager.add_sequence("s", [5, 6, 7])
    manager.append_tokens("s", [PLACEHOLDER])
    assert len(manager.prefix_cache) == 0, "a block holding a placeholder was hashed"
    manager.resolve_token("s", 3, 8)
    assert len(manager.prefix_cache) == 1 and manager.table("s").token_ids == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="no placeholder"):
        manager.resolve_token("s", 3, 8)


def test_blocks_completed_by_decoded_tokens_are_cached_as_in_the_serial_engine(model):
    """A follow-up request whose prompt is an earlier request's prompt and output (a chat's next turn) finds the
    blocks the earlier decode filled in the prefix cache, overlapped or not."""
    hits = []
    for async_scheduling in (False, True):
        engine = LLMEngine(model, EngineConfig(num_blocks=32, block_size=4, async_scheduling=async_scheduling))
        first = engine.generate([list(range(100, 106))], SamplingParams(), max_tokens=20)[0].token_ids
        before = engine.stats().prefix_cache_hit_tokens
        engine.generate([list(range(100, 106)) + first + [7]], SamplingParams(), max_tokens=2)
        hits.append(engine.stats().prefix_cache_hit_tokens - before)
        engine.close()
    assert hits[0] == hits[1] == 24, f"cached prompt tokens of the next turn (serial, overlapped): {hits}"


def test_the_timeline_hides_the_cpu_work_behind_the_model_step_when_overlapped():
    from minigpt.engine.overlap import step_timeline

    model, cpu = [4.0, 4.0, 4.0], [1.0, 1.0, 6.0]
    assert step_timeline(model, cpu, overlapped=False) == [(1.0, 5.0), (6.0, 10.0), (16.0, 20.0)]
    # step 1's CPU work ran beside step 0 (from 1 to 2): it launches when step 0 ends; step 2's (6 s) outlasts
    # step 1's model call and delays it by 2 s; every launch pays the hand-off
    assert step_timeline(model, cpu, overlapped=True, handoff_s=0.5) == [(1.5, 5.5), (6.0, 10.0), (12.5, 16.5)]
    with pytest.raises(ValueError, match="one of each"):
        step_timeline([1.0], [1.0, 2.0], overlapped=True)
