"""Lab 03 checks: the solution notebook's answers pass; the stub, each plausible wrong implementation and the package's
reference handed in (itself, a subclass inheriting schedule(), a thin wrapper) fail."""

from __future__ import annotations

import math

import pytest
import torch

from autograder import lab03
from autograder.checking.reference_guard import ReferenceHandedIn
from autograder.gpu_tier.slow_implementations import RefillOnlyWhenEmpty   # also measured by `make calibrate`
from minigpt.engine.baselines import static_generate
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.metrics import goodput, request_metrics
from minigpt.engine.packed_batch import pack_chunks
from minigpt.engine.scheduler import Scheduler, SchedulerOutput
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.request import SequenceStatus
from minigpt.costmodel.calculators import PRESETS, matmul_parameters, weight_bytes_read
from minigpt.costmodel.hardware import ACCELERATORS
from tests.labs.notebook_solutions import solution_cells

EXAMPLES = 40
SOLUTION_PREAMBLE = """
import torch
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.packed_batch import PackedBatch
from minigpt.engine.paged_generation import generate_paged_batch
from minigpt.engine.request import SequenceStatus
from minigpt.costmodel.calculators import PRESETS, matmul_parameters, weight_bytes_read
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.engine.scheduler import Scheduler, SchedulerOutput
from minigpt.engine import metrics as ref_metrics
"""
SOLUTION = solution_cells("03_continuous_batching", "ex1_code", "ex2_code", "ex3_code", "ex4_code",
                          preamble=SOLUTION_PREAMBLE)
Solution = SOLUTION["MyScheduler"]          # the notebook's scheduler: its own schedule(), the reference's helpers


class StubScheduler(Scheduler):
    def schedule(self):
        raise NotImplementedError()


def _stub(*args, **kwargs):
    raise NotImplementedError()


# --- wrong schedulers --------------------------------------------------------------------------------
# Each names schedule() itself, as a learner's class does (the notebook's, or an edit of it): one that inherits it is
# refused before any step runs, and would not show that the step checks catch its mistake.

class NoFreeOnFinish(Solution):
    """Finished sequences leave the batch but keep their blocks."""
    schedule = Solution.schedule

    def _finish(self, seq, reason, now):
        manager_free = self.manager.free
        self.manager.free = lambda seq_id: None
        try:
            super()._finish(seq, reason, now)
        finally:
            self.manager.free = manager_free


class LosesTokensOnPreempt(Solution):
    """Preemption drops the generated tokens: the request starts over from its prompt."""
    schedule = Solution.schedule

    def _preempt(self, seq):
        super()._preempt(seq)
        seq.stop.tokens.clear()


class OverBudget(Solution):
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


class RestartsChunkAtZero(Solution):
    """The second chunk of a prompt is scheduled at position 0 again."""
    schedule = Solution.schedule

    def _reserve(self, seq, n):
        chunk = super()._reserve(seq, n)
        if chunk.start > 0 and len(chunk.tokens) > 1:
            chunk.start = 0
        return chunk


class LifoAdmission(Solution):
    """Newest waiting request first: under a steady stream of arrivals the oldest waits."""
    def schedule(self):
        fresh = [s for s in self.waiting if not s.num_preemptions]
        resumed = [s for s in self.waiting if s.num_preemptions]
        self.waiting = type(self.waiting)(resumed + fresh[::-1])
        out = super().schedule()
        self.waiting = type(self.waiting)(sorted(self.waiting, key=lambda s: s.arrival_time))
        return out


class ChunksWhenDisabled(Solution):
    """Chunks prompts even when chunked prefill is disabled."""
    def schedule(self):
        saved = self.config
        self.config = type(saved)(saved.max_num_seqs, saved.max_num_batched_tokens, True)
        try:
            return super().schedule()
        finally:
            self.config = saved


class PreemptsOldest(Solution):
    """Preempts the oldest running sequence instead of the newest."""
    def schedule(self):
        original = self.running
        class Oldest(list):
            def __getitem__(self, i):
                return list.__getitem__(self, 0 if i == -1 else i)
        self.running = Oldest(original)
        try:
            return super().schedule()
        finally:
            self.running = list(self.running)


class SkipsBlockedHead(Solution):
    """Admits a later request when the head of the queue does not fit the budget (skips the head)."""
    def schedule(self):
        out = super().schedule()
        budget = self.config.max_num_batched_tokens - out.num_batched_tokens
        if not out.preempted and budget > 0 and len(self.running) < self.config.max_num_seqs:
            for seq in list(self.waiting)[1:]:
                if seq.num_remaining <= budget and blocks_needed(seq.num_remaining, self.manager.block_size) <= \
                        self.manager.pool.num_free:
                    self.waiting.remove(seq)
                    seq.status = SequenceStatus.RUNNING
                    self.running.append(seq)
                    out.chunks.append(self._reserve(seq, seq.num_remaining))
                    break
        return out


class SlotsFromZero(Solution):
    """Reserves the right blocks, but each chunk's slots are those of positions 0 .. n - 1, not start .. start + n - 1:
    a later chunk (and every decode) writes its K/V over the first ones."""
    def schedule(self):
        out = super().schedule()
        for c in out.chunks:
            c.slots = self.manager.table(c.seq_id).slots(0, len(c.tokens))
        return out


class NeverReportsFinished(Solution):
    """update() finishes sequences (and frees their blocks) but returns no list of them."""
    schedule = Solution.schedule

    def update(self, output, sampled, now):
        super().update(output, sampled, now)
        return []


class SaysNothingIsLeft(Solution):
    """Schedules right, but its has_unfinished() always says False: a report about itself the judge does not read
    (it counts what is unfinished from the requests it added and the finished ones update() returned)."""
    schedule = Solution.schedule

    def has_unfinished(self):
        return False


class InheritsSchedule(Scheduler):
    """The reference's schedule(), inherited."""
    def update(self, output, sampled, now):
        return super().update(output, sampled, now)


class CallsSuperSchedule(Scheduler):
    """A thin wrapper: its own schedule() that only calls the reference's."""
    def schedule(self):
        return super().schedule()


def pack_wrapper(chunks, manager, device="cpu"):
    return pack_chunks(chunks, manager, device)


def static_wrapper(model, prompts, max_new_tokens, batch_size):
    return static_generate(model, prompts, max_new_tokens, batch_size)


def static_one_at_a_time(model, prompts, max_new_tokens, batch_size):
    """Right outputs, no batching: each prompt alone."""
    return [generate_kv_cache(model, list(p), n, stop_token_ids=()).tokens for p, n in zip(prompts, max_new_tokens)]


def metrics_wrapper(seq):
    return request_metrics(seq)


def goodput_wrapper(ms, ttft_limit, tpot_limit):
    return goodput(ms, ttft_limit, tpot_limit)


# --- wrong packing, static batching and metrics ------------------------------------------------------

def pack_positions_from_zero(chunks, manager, device="cpu"):
    batch = SOLUTION["pack_chunks"](chunks, manager, device)
    batch.positions = torch.cat([torch.arange(len(t)) for _, t, _, _ in chunks])[None]
    return batch


def pack_wrong_seq_lens(chunks, manager, device="cpu"):
    batch = SOLUTION["pack_chunks"](chunks, manager, device)
    batch.seq_lens = torch.tensor([len(t) for _, t, _, _ in chunks])
    return batch


def static_attends_to_padding(model, prompts, max_new_tokens, batch_size):
    """Left-pads prompts with token 0 to the longest and treats the padding as part of the prompt."""
    longest = max(len(p) for p in prompts)
    padded = [[0] * (longest - len(p)) + list(p) for p in prompts]
    return SOLUTION["static_generate"](model, padded, max_new_tokens, batch_size)


def metrics_tpot_over_n(seq):
    m = SOLUTION["request_metrics"](seq)
    n = m.num_output_tokens
    return type(m)(m.request_id, m.ttft, m.tpot * (n - 1) / n if n > 1 else 0.0, m.itls, m.e2e, n)


def metrics_e2e_to_last_token(seq):
    m = SOLUTION["request_metrics"](seq)
    return type(m)(m.request_id, m.ttft, m.tpot, m.itls, seq.token_times[-1] - seq.arrival_time, m.num_output_tokens)


def goodput_empty_nan(ms, ttft_limit, tpot_limit):
    return sum(m.ttft <= ttft_limit and m.tpot <= tpot_limit for m in ms) / max(len(ms), 1) if ms else float("nan")


def metrics_ttft_from_start(seq):
    m = SOLUTION["request_metrics"](seq)
    return type(m)(m.request_id, m.ttft - 0.0 if False else seq.first_token_time - 0.0, m.tpot, m.itls, m.e2e,
                   m.num_output_tokens)


def goodput_either(ms, ttft_limit, tpot_limit):
    return sum(m.ttft <= ttft_limit or m.tpot <= tpot_limit for m in ms) / len(ms)


def goodput_count(ms, ttft_limit, tpot_limit):
    return sum(m.ttft <= ttft_limit and m.tpot <= tpot_limit for m in ms)


# --- wrong versions of the notebook's own cells, one edit each (what mutation testing found) ------------------

def _metrics_with(old: str, new: str) -> dict:
    return solution_cells("03_continuous_batching", "ex4_code", preamble=SOLUTION_PREAMBLE, replace={old: new})


def _solution_with(old: str, new: str) -> dict:
    return solution_cells("03_continuous_batching", "ex1_code", "ex2_code", preamble=SOLUTION_PREAMBLE,
                          replace={old: new})


ExactFitRefused = _solution_with("blocks_needed(n, self.manager.block_size) > self.manager.pool.num_free",
                                 "blocks_needed(n, self.manager.block_size) >= self.manager.pool.num_free")["MyScheduler"]
pack_tokens_on_cpu = _solution_with("torch.tensor([tokens], device=device)", "torch.tensor([tokens])")["pack_chunks"]
pack_table_on_cpu = _solution_with("for s in ids], device)", "for s in ids])")["pack_chunks"]
pack_no_ids = _solution_with("return PackedBatch(ids,", "return PackedBatch(None,")["pack_chunks"]
pack_ids_as_tensor = _solution_with("return PackedBatch(ids,", "return PackedBatch(torch.tensor(slots),")["pack_chunks"]
metrics_tpot_zero_for_two = _metrics_with("if len(t) > 1 else 0.0", "if len(t) > 2 else 0.0")["request_metrics"]
metrics_no_id = _metrics_with("RequestMetrics(seq.seq_id,", "RequestMetrics(None,")["request_metrics"]
goodput_strict = _metrics_with("m.tpot <= tpot_limit", "m.tpot < tpot_limit")["goodput"]
metrics_itls_missing = _metrics_with("itls = tuple(b - a for a, b in zip(t, t[1:]))", "itls = None")["request_metrics"]


def _static_with(old: str, new: str):
    return solution_cells("03_continuous_batching", "ex3_code", preamble=SOLUTION_PREAMBLE,
                          replace={old: new})["static_generate"]


static_stops_at_end_of_text = _static_with("max(budgets), stop_token_ids=())", "max(budgets))")
static_drops_a_short_last_group = _static_with("range(0, len(prompts), batch_size)",
                                               "range(0, len(prompts) - 1, batch_size)")
static_one_group_too_many = _static_with("range(0, len(prompts), batch_size)", "range(0, len(prompts) + 1, batch_size)")
static_budget_of_the_next_group = _static_with("max_new_tokens[i:i + batch_size]", "max_new_tokens[i:i + batch_size + 1]")


# --- tests --------------------------------------------------------------------------------------------

def test_solution_passes_every_check():
    lab03.check_pack_chunks(SOLUTION["pack_chunks"])
    lab03.check_scheduler(Solution, max_examples=EXAMPLES)
    lab03.check_greedy_outputs(Solution, SOLUTION["pack_chunks"])
    lab03.check_static_batching(SOLUTION["static_generate"])
    lab03.check_metrics(SOLUTION["request_metrics"], SOLUTION["goodput"])
    result = lab03.check_continuous_speedup(Solution)
    assert result["ratio"] == result["reference_ratio"] > 2


@pytest.mark.parametrize("wrong", [StubScheduler, NoFreeOnFinish, LosesTokensOnPreempt, OverBudget, RestartsChunkAtZero,
                                   LifoAdmission, ChunksWhenDisabled, PreemptsOldest, SkipsBlockedHead,
                                   ExactFitRefused, SlotsFromZero, NeverReportsFinished])
def test_scheduler_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_scheduler(wrong, max_examples=EXAMPLES)


@pytest.mark.parametrize("wrong, message", [(ChunksWhenDisabled, "chunked prefill is disabled"),
                                            (PreemptsOldest, "preempt the NEWEST"),
                                            (SkipsBlockedHead, "first come, first served"),
                                            (ExactFitRefused, "fills its blocks exactly"),
                                            (NoFreeOnFinish, "blocks of finished and preempted sequences freed"),
                                            (LosesTokensOnPreempt, "resumed without the tokens it had generated"),
                                            (RestartsChunkAtZero, "continue where the previous one ended"),
                                            (SlotsFromZero, "goes to (block|slot)"),
                                            (NeverReportsFinished, "did not return it as finished")])
def test_scheduler_check_names_the_mistake(wrong, message):
    with pytest.raises(AssertionError, match=message):
        lab03.check_scheduler(wrong, max_examples=EXAMPLES)


def test_scheduler_check_reads_no_report_of_the_scheduler_about_itself():
    """The verdict comes from what schedule() and update() return, held against the judge's own record: a scheduler
    that schedules right passes whatever it says about itself, so one that lies gains nothing."""
    lab03.check_scheduler(SaysNothingIsLeft, max_examples=EXAMPLES)


def test_greedy_check_rejects_slots_of_the_wrong_positions():
    with pytest.raises(AssertionError, match="goes to (block|slot)"):
        lab03.check_greedy_outputs(SlotsFromZero, SOLUTION["pack_chunks"])


@pytest.mark.parametrize("reference", [Scheduler, InheritsSchedule, CallsSuperSchedule])
def test_scheduler_checks_refuse_the_reference(reference):
    for check in (lambda: lab03.check_scheduler(reference, max_examples=2), lambda: lab03.check_greedy_outputs(reference),
                  lambda: lab03.check_continuous_speedup(reference)):
        with pytest.raises(ReferenceHandedIn):
            check()


@pytest.mark.parametrize("check, answers", [
    (lab03.check_pack_chunks, [(pack_chunks,), (pack_wrapper,)]),
    (lab03.check_static_batching, [(static_generate,), (static_wrapper,)]),
    (lab03.check_metrics, [(request_metrics, goodput), (metrics_wrapper, SOLUTION["goodput"]),
                           (SOLUTION["request_metrics"], goodput_wrapper)]),
])
def test_function_checks_refuse_the_reference(check, answers):
    for args in answers:
        with pytest.raises(ReferenceHandedIn):
            check(*args)


@pytest.mark.parametrize("wrong", [StubScheduler, RestartsChunkAtZero])
def test_greedy_check_rejects_scheduler(wrong):
    with pytest.raises(AssertionError):
        lab03.check_greedy_outputs(wrong)


@pytest.mark.parametrize("wrong", [_stub, pack_positions_from_zero, pack_wrong_seq_lens, pack_tokens_on_cpu,
                                   pack_table_on_cpu, pack_no_ids, pack_ids_as_tensor])
def test_pack_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_pack_chunks(wrong)


def test_greedy_check_rejects_positions_restarting_at_zero():
    with pytest.raises(AssertionError, match="differs from generating it alone"):
        lab03.check_greedy_outputs(Solution, pack_positions_from_zero)


@pytest.mark.parametrize("wrong", [_stub, static_attends_to_padding, static_one_at_a_time,
                                   static_stops_at_end_of_text, static_drops_a_short_last_group,
                                   static_one_group_too_many, static_budget_of_the_next_group])
def test_static_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_static_batching(wrong)


def test_static_check_names_one_at_a_time():
    with pytest.raises(AssertionError, match="not static batching"):
        lab03.check_static_batching(static_one_at_a_time)


@pytest.mark.parametrize("metrics_fn, goodput_fn", [
    (_stub, SOLUTION["goodput"]), (metrics_tpot_over_n, SOLUTION["goodput"]),
    (metrics_ttft_from_start, SOLUTION["goodput"]), (metrics_e2e_to_last_token, SOLUTION["goodput"]),
    (SOLUTION["request_metrics"], _stub), (SOLUTION["request_metrics"], goodput_either),
    (SOLUTION["request_metrics"], goodput_count), (SOLUTION["request_metrics"], goodput_empty_nan),
    (metrics_tpot_zero_for_two, SOLUTION["goodput"]), (metrics_no_id, SOLUTION["goodput"]),
    (SOLUTION["request_metrics"], goodput_strict), (metrics_itls_missing, SOLUTION["goodput"])])
def test_metrics_check_rejects(metrics_fn, goodput_fn):
    with pytest.raises(AssertionError):
        lab03.check_metrics(metrics_fn, goodput_fn)


@pytest.mark.parametrize("wrong", [StubScheduler, RefillOnlyWhenEmpty])
def test_speed_check_rejects(wrong):
    with pytest.raises(AssertionError):
        lab03.check_continuous_speedup(wrong)


def test_fake_tokens_do_not_depend_on_the_process():
    """Python's hash() of a str changes with PYTHONHASHSEED; the driver's fake tokens must not."""
    assert [lab03._fake_token("short3", i) for i in range(3)] == [
        2 + __import__("zlib").crc32(repr(("short3", i)).encode()) % 50 for i in range(3)]


def test_interview_questions():
    # Q1 by hand: static = 16 steps of 8 (6 ms) + 240 of 1 (2.5 ms) = 696 ms for 368 tokens; continuous 8 per 6 ms
    lab03.check_q1_continuous_vs_static((8 / 6) / (368 / 696))
    # Q2 and Q3 by the rule written out here, not through the check's helpers
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    peak, bw = gpu.peak("bf16"), gpu.memory_bandwidth

    def mixed(chunk: int) -> float:
        weights = max(2 * matmul_parameters(shape) * (64 + chunk) / peak, weight_bytes_read(shape, 64 + chunk) / bw)
        pairs, kv_tokens = 64 * 257 + chunk * (chunk + 1) // 2, 64 * 257 + chunk
        attention = max(4 * 32 * 32 * 128 * pairs / peak, kv_tokens * 2 * 32 * 8 * 128 * 2 / bw)
        return weights + attention
    chunk = max(c for c in range(1000) if mixed(c) <= 1.25 * mixed(0))
    assert chunk == 315
    lab03.check_q2_chunk_budget(chunk)
    kv_per_token = 2 * 32 * 8 * 128 * 2
    matmuls = 2 * matmul_parameters(shape) * 512 / peak                   # compute-bound past the ridge
    crossover = math.ceil(matmuls * bw / (512 * kv_per_token))
    assert crossover == 388 and matmuls > weight_bytes_read(shape, 512) / bw
    lab03.check_q3_attention_crossover(crossover)
    lab03.check_q4_itl_knob(2)
    for check, wrong, why in [(lab03.check_q1_continuous_vs_static, 16.0, ""),
                              (lab03.check_q1_continuous_vs_static, 256 / 46, ""),
                              (lab03.check_q2_chunk_budget, 355, "ONE roofline point"),
                              (lab03.check_q2_chunk_budget, 340, "stored parameter"),
                              (lab03.check_q2_chunk_budget, 232, "riding for free"),
                              (lab03.check_q3_attention_crossover, 224, "past the ridge"),
                              (lab03.check_q3_attention_crossover, 776, "K and V"),
                              (lab03.check_q3_attention_crossover, 1790, "batch 64")]:
        with pytest.raises(AssertionError, match="Likely mistake: .*" + why):
            check(wrong)
    for check, near in [(lab03.check_q2_chunk_budget, 316), (lab03.check_q3_attention_crossover, 387)]:
        with pytest.raises(AssertionError, match="not right"):
            check(near)


@pytest.mark.parametrize("wrong, note", [(1, "does not shorten"), (3, "spike itself"), (4, "memory is not"),
                                         (5, "static batching")])
def test_q4_diagnoses_each_wrong_knob(wrong, note):
    with pytest.raises(AssertionError, match=note):
        lab03.check_q4_itl_knob(wrong)


def test_q1_flat_cost_answer_is_diagnosed():
    with pytest.raises(AssertionError, match="does not depend on B"):
        lab03.check_q1_continuous_vs_static(256 / 46)


def test_gpu_speed_check_code_path_on_cpu():
    """The GPU-tier check's code runs on CPU with a small model (a threshold pinned low: one timing sample on a CPU is
    not what the GPU tier grades, and at 0.5 it failed once under load, 1.12x against the reference's 2.59x)."""
    from autograder.checking.thresholds import fixed
    from minigpt.timing import fixed_threads
    with fixed_threads(1), fixed(0.05):
        res = lab03.check_continuous_speedup_gpu(Solution, SOLUTION["pack_chunks"], device="cpu", repeats=1,
                                                 config=lab03.SMALL_CONFIG)
    assert res["reference_speedup"] > 0 and res["threshold"] == 0.05 * res["reference_speedup"]
    with pytest.raises(AssertionError, match="needs a CUDA GPU"):
        if not torch.cuda.is_available():
            lab03.check_continuous_speedup_gpu(Solution)
        else:
            raise AssertionError("needs a CUDA GPU (skipped: this machine has one)")
