"""Lab 03 checks: the reference passes, the stub and each plausible wrong implementation fail."""

from __future__ import annotations

import pytest
import torch

from autograder import lab03
from autograder.slow_implementations import RefillOnlyWhenEmpty   # also measured by `make calibrate`
from minigpt.engine.baselines import static_generate
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.metrics import goodput, request_metrics
from minigpt.engine.packed_batch import pack_chunks
from minigpt.engine.scheduler import Scheduler, SchedulerOutput
from minigpt.cache.block_table import blocks_needed

EXAMPLES = 40


class StubScheduler(Scheduler):
    def schedule(self):
        raise NotImplementedError()


def _stub(*args, **kwargs):
    raise NotImplementedError()


# --- wrong schedulers --------------------------------------------------------------------------------

class NoFreeOnFinish(Scheduler):
    """Finished sequences leave the batch but keep their blocks."""
    def _finish(self, seq, reason, now):
        manager_free = self.manager.free
        self.manager.free = lambda seq_id: None
        try:
            super()._finish(seq, reason, now)
        finally:
            self.manager.free = manager_free


class LosesTokensOnPreempt(Scheduler):
    """Preemption drops the generated tokens: the request starts over from its prompt."""
    def _preempt(self, seq):
        super()._preempt(seq)
        seq.stop.tokens.clear()


class OverBudget(Scheduler):
    """Prefills run whole: a long prompt blows the token budget."""
    def schedule(self):
        saved = self.config
        object.__setattr__(saved, "max_num_batched_tokens", saved.max_num_batched_tokens)
        out = super().schedule()
        # extend every prefill chunk to the whole remaining prompt (reserving the extra slots)
        for c in out.chunks:
            extra = c.seq.num_tokens - (c.start + len(c.tokens))
            if extra > 0 and c.seq.num_tokens - c.start > 1 and \
                    self.manager.blocks_for_append(c.seq_id, extra) <= self.manager.pool.num_free:
                more = c.seq.token_slice(c.start + len(c.tokens), c.seq.num_tokens)
                c.slots += self.manager.append_tokens(c.seq_id, more).slots
                c.tokens += more
        return out


class RestartsChunkAtZero(Scheduler):
    """The second chunk of a prompt is scheduled at position 0 again."""
    def _reserve(self, seq, n):
        chunk = super()._reserve(seq, n)
        if chunk.start > 0 and len(chunk.tokens) > 1:
            chunk.start = 0
        return chunk


class LifoAdmission(Scheduler):
    """Newest waiting request first: under a steady stream of arrivals the oldest waits."""
    def schedule(self):
        fresh = [s for s in self.waiting if not s.num_preemptions]
        resumed = [s for s in self.waiting if s.num_preemptions]
        self.waiting = type(self.waiting)(resumed + fresh[::-1])
        out = super().schedule()
        self.waiting = type(self.waiting)(sorted(self.waiting, key=lambda s: s.arrival_time))
        return out


# --- wrong packing, static batching and metrics ------------------------------------------------------

def pack_positions_from_zero(chunks, manager, device="cpu"):
    batch = pack_chunks(chunks, manager, device)
    batch.positions = torch.cat([torch.arange(len(t)) for _, t, _, _ in chunks])[None]
    return batch


def pack_wrong_seq_lens(chunks, manager, device="cpu"):
    batch = pack_chunks(chunks, manager, device)
    batch.seq_lens = torch.tensor([len(t) for _, t, _, _ in chunks])
    return batch


def static_attends_to_padding(model, prompts, max_new_tokens, batch_size):
    """Left-pads prompts with token 0 to the longest and treats the padding as part of the prompt."""
    longest = max(len(p) for p in prompts)
    padded = [[0] * (longest - len(p)) + list(p) for p in prompts]
    return static_generate(model, padded, max_new_tokens, batch_size)


def metrics_tpot_over_n(seq):
    m = request_metrics(seq)
    n = m.num_output_tokens
    return type(m)(m.request_id, m.ttft, m.tpot * (n - 1) / n if n > 1 else 0.0, m.itls, m.e2e, n)


def metrics_ttft_from_start(seq):
    m = request_metrics(seq)
    return type(m)(m.request_id, m.ttft - 0.0 if False else seq.first_token_time - 0.0, m.tpot, m.itls, m.e2e,
                   m.num_output_tokens)


def goodput_either(ms, ttft_limit, tpot_limit):
    return sum(m.ttft <= ttft_limit or m.tpot <= tpot_limit for m in ms) / len(ms)


def goodput_count(ms, ttft_limit, tpot_limit):
    return sum(m.ttft <= ttft_limit and m.tpot <= tpot_limit for m in ms)


# --- tests --------------------------------------------------------------------------------------------

def test_reference_passes_every_check():
    lab03.check_pack_chunks(pack_chunks)
    lab03.check_scheduler(Scheduler, max_examples=EXAMPLES)
    lab03.check_greedy_outputs(Scheduler, pack_chunks)
    lab03.check_static_batching(static_generate)
    lab03.check_metrics(request_metrics, goodput)
    result = lab03.check_continuous_speedup(Scheduler)
    assert result["ratio"] == result["reference_ratio"] > 2


@pytest.mark.parametrize("wrong", [StubScheduler, NoFreeOnFinish, LosesTokensOnPreempt, OverBudget, RestartsChunkAtZero,
                                   LifoAdmission])
def test_scheduler_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_scheduler(wrong, max_examples=EXAMPLES)


@pytest.mark.parametrize("wrong", [StubScheduler, RestartsChunkAtZero])
def test_greedy_check_rejects_scheduler(wrong):
    with pytest.raises(AssertionError):
        lab03.check_greedy_outputs(wrong)


@pytest.mark.parametrize("wrong", [_stub, pack_positions_from_zero, pack_wrong_seq_lens])
def test_pack_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_pack_chunks(wrong)


def test_greedy_check_rejects_positions_restarting_at_zero():
    with pytest.raises(AssertionError, match="differs from generating it alone"):
        lab03.check_greedy_outputs(Scheduler, pack_positions_from_zero)


@pytest.mark.parametrize("wrong", [_stub, static_attends_to_padding])
def test_static_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_static_batching(wrong)


@pytest.mark.parametrize("metrics_fn, goodput_fn", [(_stub, goodput), (metrics_tpot_over_n, goodput),
                                                    (metrics_ttft_from_start, goodput), (request_metrics, _stub),
                                                    (request_metrics, goodput_either), (request_metrics, goodput_count)])
def test_metrics_check_rejects(metrics_fn, goodput_fn):
    with pytest.raises(AssertionError):
        lab03.check_metrics(metrics_fn, goodput_fn)


@pytest.mark.parametrize("wrong", [StubScheduler, RefillOnlyWhenEmpty])
def test_speed_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_continuous_speedup(wrong)


def test_interview_questions():
    lab03.check_q1_continuous_vs_static(256 / 46)
    batch, gib = lab03._q2_numbers()
    lab03.check_q2_compute_bound_batch(batch)
    lab03.check_q3_kv_memory(gib)
    for check, wrong in [(lab03.check_q1_continuous_vs_static, 16.0), (lab03.check_q2_compute_bound_batch, 295),
                         (lab03.check_q3_kv_memory, gib * 2**30 / 1e9)]:
        with pytest.raises(AssertionError, match="Likely mistake"):
            check(wrong)


def test_gpu_speed_check_code_path_on_cpu():
    """The GPU-tier check's code runs on CPU with a small model (a threshold pinned: the CPU does not grade it)."""
    from autograder.thresholds import fixed
    from minigpt.timing import fixed_threads
    with fixed_threads(1), fixed(0.5):
        res = lab03.check_continuous_speedup_gpu(Scheduler, pack_chunks, device="cpu", repeats=1,
                                                 config=lab03.SMALL_CONFIG)
    assert res["reference_speedup"] > 0 and res["threshold"] == 0.5 * res["reference_speedup"]
    with pytest.raises(AssertionError, match="needs a CUDA GPU"):
        if not torch.cuda.is_available():
            lab03.check_continuous_speedup_gpu(Scheduler)
        else:
            raise AssertionError("needs a CUDA GPU (skipped: this machine has one)")
