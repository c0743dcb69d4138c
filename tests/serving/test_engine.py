"""LLMEngine and NaiveEngine (lab 08): outputs equal lab 01's cached generation, prefix caching changes nothing
but the work, aborts free blocks at once, bad requests are refused with nothing changed. Outputs are compared with
each token's log-probability: this tiny random model mostly repeats its last token, so K/V read from the wrong
block would leave the greedy tokens as they were."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minigpt.cache.block_manager import BlockManager
from minigpt.engine import cached_generation
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.prefix_scheduler import PrefixCachingScheduler
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.naive import NaiveEngine
from tests.minigpt.recorded_logprobs import chosen, generate_with_logprobs, record_sampling
from tests.minigpt.recorded_logprobs import assert_same_outputs

SHARED = list(range(40, 80))          # a 40-token shared "system prompt"


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    tails = [torch.randint(0, 4000, (n,), generator=g).tolist() for n in (3, 17, 30, 1, 9)]
    return [SHARED + t for t in tails] + [tails[1], tails[2] + SHARED]


def cached_generation_with_logprobs(model, prompt, n, sampling=SamplingParams()) -> list[tuple[int, float]]:
    """Lab 01's cached generation of `prompt`: its tokens with their log-probabilities."""
    with pytest.MonkeyPatch.context() as patch:
        sampled = record_sampling(patch, cached_generation)
        tokens = generate_kv_cache(model, prompt, n, sampling).tokens
    return chosen(sampled[0][:len(tokens)]) if tokens else []


@pytest.fixture(scope="module")
def reference(tiny):
    return [cached_generation_with_logprobs(tiny, p, 12) for p in prompts()]


@pytest.mark.parametrize("prefix", [True, False])
def test_engine_greedy_equals_cached_generation(tiny, reference, prefix):
    engine = LLMEngine(tiny, EngineConfig(num_blocks=64, block_size=8, max_num_seqs=4, max_num_batched_tokens=32,
                                          enable_prefix_caching=prefix))
    out, found = generate_with_logprobs(engine, prompts(), SamplingParams(), max_tokens=12)
    assert_same_outputs(found, reference, "the engine")
    assert all(c.num_completion_tokens == 12 and c.finish_reason == "length" for c in out)
    s = engine.stats()
    assert s.num_blocks_used == 0 and s.num_running == 0 and s.num_waiting == 0
    assert (s.prefix_cache_hit_rate > 0) == prefix
    assert engine.scheduler.sequences == {}            # a long-running server forgets finished requests


def test_naive_engine_equals_cached_generation(tiny, reference):
    engine = NaiveEngine(tiny)
    _, found = generate_with_logprobs(engine, prompts(), SamplingParams(), max_tokens=12)
    assert_same_outputs(found, reference, "the naive engine")
    assert engine.num_steps == len(reference) * 12       # one token of one request per step


def test_text_deltas_concatenate_to_the_decoded_output(tiny, tokenizer):
    engine = LLMEngine(tiny, EngineConfig(num_blocks=64), tokenizer=tokenizer)
    out = engine.generate(["Once upon a time", "def f(x):"], SamplingParams(temperature=1.0, seed=3), max_tokens=30)
    for c in out:
        assert c.text == tokenizer.decode(c.token_ids)


def test_sampling_is_seeded_and_matches_cached_generation(tiny):
    p = prompts()[0]
    sp = SamplingParams(temperature=0.9, top_k=50, seed=7)
    engine = LLMEngine(tiny, EngineConfig(num_blocks=64))
    _, found = generate_with_logprobs(engine, [p], sp, max_tokens=10)
    assert_same_outputs(found, [cached_generation_with_logprobs(tiny, p, 10, sp)], "the engine")


def test_abort_frees_blocks_at_once(tiny):
    engine = LLMEngine(tiny, EngineConfig(num_blocks=64, block_size=8))
    engine.add_request("a", prompts()[0], 50)
    engine.add_request("b", prompts()[1], 50)
    engine.step()
    used = engine.stats().num_blocks_used
    assert used > 0
    out = engine.abort("a")
    assert out.finished and out.finish_reason == "abort"
    assert engine.stats().num_blocks_used < used
    assert engine.abort("a") is None                     # twice is harmless
    engine.abort("b")
    assert engine.stats().num_blocks_used == 0 and not engine.has_unfinished()


@pytest.mark.parametrize("kwargs, words", [
    (dict(request_id="x", prompt_ids=[], max_tokens=4), "empty"),
    (dict(request_id="x", prompt_ids=[1] * 100, max_tokens=40), "context"),
    (dict(request_id="x", prompt_ids=[1], max_tokens=0), "max_tokens"),
    (dict(request_id="x", prompt_ids=[5000], max_tokens=4), "vocabulary"),
    (dict(request_id="dup", prompt_ids=[1], max_tokens=4), "in use"),
    (dict(request_id="x", prompt_ids=[1], max_tokens=4, adapter=0), "adapter"),
    (dict(request_id="x", prompt_ids="text", max_tokens=4), "tokenizer"),
    (dict(request_id="x", prompt_ids=[1] * 60, max_tokens=60), "blocks"),
])
def test_bad_requests_are_refused_with_nothing_changed(tiny, kwargs, words):
    engine = LLMEngine(tiny, EngineConfig(num_blocks=8, block_size=8))
    engine.add_request("dup", [1, 2], 3)
    with pytest.raises(ValueError, match=words):
        engine.add_request(**kwargs)
    assert [s.seq_id for s in engine.scheduler.waiting] == ["dup"]


def test_speculative_config_is_refused():
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(speculative_k=4)


def test_prefix_scheduler_only_with_prefix_caching_manager():
    with pytest.raises(ValueError, match="prefix caching"):
        Scheduler(BlockManager(8, 4, enable_prefix_caching=True), max_model_len=64)
    PrefixCachingScheduler(BlockManager(8, 4, enable_prefix_caching=True), SchedulerConfig(), max_model_len=64)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prefix_caching_changes_no_output_and_frees_every_block(tiny, data):
    """Hypothesis: random prompts sharing prefixes, a small pool (preemptions), small budgets (chunked prefill):
    greedy outputs with prefix caching == without, and every block is free at the end."""
    block_size = data.draw(st.sampled_from([2, 4, 8]))
    base = data.draw(st.lists(st.integers(0, 4000), min_size=1, max_size=24))
    reqs = []
    for _ in range(data.draw(st.integers(1, 6))):
        keep = data.draw(st.integers(0, len(base)))
        tail = data.draw(st.lists(st.integers(0, 4000), min_size=0 if keep else 1, max_size=12))
        reqs.append((base[:keep] + tail, data.draw(st.integers(1, 8))))
    num_blocks = data.draw(st.integers(max(len(p) + n for p, n in reqs) // block_size + 1, 40))
    budget = data.draw(st.integers(4, 32))
    outs = []
    for prefix in (False, True):
        engine = LLMEngine(tiny, EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4,
                                              max_num_batched_tokens=budget, enable_prefix_caching=prefix))
        outs.append(generate_with_logprobs(engine, [p for p, _ in reqs], SamplingParams(), [n for _, n in reqs])[1])
        assert engine.stats().num_blocks_used == 0
    assert_same_outputs(outs[1], outs[0], "prefix caching")


def test_prefix_caching_with_preemption_and_chunked_prefill(tiny, reference):
    """A pool too small for the batch: sequences are preempted and recomputed (from the prefix cache where it holds
    their blocks); every greedy output still equals generating it alone, and every block is free at the end."""
    engine = LLMEngine(tiny, EngineConfig(num_blocks=24, block_size=4, max_num_seqs=4, max_num_batched_tokens=16))
    _, found = generate_with_logprobs(engine, prompts(), SamplingParams(), max_tokens=12)
    s = engine.stats()
    assert s.num_preemptions > 0 and s.prefix_cache_hit_tokens > 0
    assert_same_outputs(found, reference, "the engine, preempting,")
    assert s.num_blocks_used == 0
