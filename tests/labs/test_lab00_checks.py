"""Lab 00 checks: the solution's functions pass, the released stubs and common wrong answers fail.

The "learner" functions below mirror the solution notebook (positional signatures as in the lab).
Each wrong implementation is one plausible mistake; the check must reject it with a message that
names the mistake.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from autograder import lab00
from minigpt.costmodel.calculators import PRESETS
from minigpt.costmodel.hardware import ACCELERATORS
from tests.labs.judged import learner_process

GiB = 2**30


# ---------------------------------------------------------------- correct learner-style implementations

def count_parameters(s):
    d, q, kv = s.d_model, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    per_layer = 2 * d * q + 2 * d * kv + 3 * d * s.d_ff + 2 * d
    embed = s.vocab_size * d
    return embed + s.n_layers * per_layer + d + (0 if s.tie_embeddings else embed)


def kv_cache_bytes(s, context_len, batch, bytes_per_element):
    return 2 * s.n_layers * s.n_kv_heads * s.head_dim * context_len * batch * bytes_per_element


def _matmul_params(s):
    d, q, kv = s.d_model, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    return s.n_layers * (2 * d * q + 2 * d * kv + 3 * d * s.d_ff) + s.vocab_size * d


def prefill_flops(s, seq_len, batch):
    pairs = seq_len * (seq_len + 1) // 2
    return batch * (2 * _matmul_params(s) * seq_len + 4 * s.n_layers * s.n_heads * s.head_dim * pairs)


def decode_flops(s, context_len, batch):
    return batch * (2 * _matmul_params(s) + 4 * s.n_layers * s.n_heads * s.head_dim * context_len)


def weights_read(s, tokens, wb):
    """Matmul weights + norms + one embedding row per token (the table itself only through the output projection)."""
    return math.ceil((_matmul_params(s) + (2 * s.n_layers + 1) * s.d_model + tokens * s.d_model) * wb)


def prefill_bytes(s, seq_len, batch, wb, kb):
    return weights_read(s, batch * seq_len, wb) + kv_cache_bytes(s, seq_len, batch, kb)


def decode_bytes(s, context_len, batch, wb, kb):
    return weights_read(s, batch, wb) + kv_cache_bytes(s, context_len, batch, kb)


def whole_table(s, wb):
    """The old rule: every stored weight, the whole embedding table included."""
    return math.ceil(count_parameters(s) * wb)


def attainable_flops(ai, peak, bw):
    return min(peak, ai * bw)


def max_concurrent_requests(s, context_len, memory_bytes, wb, kb, util):
    free = int(memory_bytes * util) - math.ceil(count_parameters(s) * wb)
    return max(0, free // kv_cache_bytes(s, context_len, 1, kb))


def decode_step_time(s, context_len, batch, peak, bw, wb, kb):
    weights = max(decode_flops(s, 0, batch) / peak, weights_read(s, batch, wb) / bw)
    attention = max((decode_flops(s, context_len, batch) - decode_flops(s, 0, batch)) / peak,
                    kv_cache_bytes(s, context_len, batch, kb) / bw)
    return weights + attention


def lumped_time(s, context_len, batch, peak, bw, wb, kb):
    return max(decode_flops(s, context_len, batch) / peak, decode_bytes(s, context_len, batch, wb, kb) / bw)


def step_terms(s, context_len, peak, bw, wb, kb):
    """(ridge, W, f, k): the ridge point, the bytes a step reads at batch 0, and the FLOPs and bytes each sequence adds."""
    w = decode_bytes(s, context_len, 0, wb, kb)
    return peak / bw, w, decode_flops(s, context_len, 1), decode_bytes(s, context_len, 1, wb, kb) - w


def critical_batch_size(s, context_len, peak, bw, wb, kb):
    ridge, w, f, k = step_terms(s, context_len, peak, bw, wb, kb)
    if f <= ridge * k:
        return None
    b = max(1, math.ceil(ridge * w / (f - ridge * k)))
    while b > 1 and (b - 1) * f >= ridge * (w + (b - 1) * k):
        b -= 1
    while b * f < ridge * (w + b * k):
        b += 1
    return b


@torch.inference_mode()
def greedy_generate(model, prompt_ids, max_new_tokens):
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids], device=model.device))[:, -1]
        ids.append(int(logits.argmax(-1)))
    return ids[len(prompt_ids):]


def climbs_from_one(s, context_len, peak, bw, wb, kb, *, strict=False):
    """Right, but it walks from batch 1: where the answer is 2.4e14 it never arrives. strict: a batch exactly on
    the ridge counted as memory-bound (> instead of >=)."""
    ridge, w, f, k = step_terms(s, context_len, peak, bw, wb, kb)
    if f <= ridge * k:
        return None
    b = 1
    while b * f < ridge * (w + b * k) or (strict and b * f == ridge * (w + b * k)):
        b += 1
    return b


@torch.inference_mode()
def tokens_on_the_default_device(model, prompt, n):     # right on a CPU machine; a GPU model refuses them
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[:, -1].argmax(-1)))
    return ids[len(prompt):]


def stub(*args, **kwargs):
    raise NotImplementedError()


def _answers():
    s8, s70 = PRESETS["Llama-3-8B"], PRESETS["Llama-3-70B"]
    h100, h200, l4 = ACCELERATORS["H100-SXM"], ACCELERATORS["H200"], ACCELERATORS["L4"]
    mha = dataclasses.replace(s70, n_kv_heads=s70.n_heads)
    knobs = {1: max_concurrent_requests(s8, 8192, h100.memory_bytes, 2, 1, 0.9),
             2: max_concurrent_requests(s8, 8192, h100.memory_bytes, 2, 2, 0.95),
             3: max_concurrent_requests(s8, 8192, h100.memory_bytes, 1, 2, 0.9),
             4: max_concurrent_requests(s8, 8192, h100.memory_bytes, 2, 2, 0.9)}
    return {
        "q1": kv_cache_bytes(s8, 3000, 64, 1) / GiB,
        "q2": (max_concurrent_requests(s70, 8192, h200.memory_bytes, 1, 2, 0.9)
               - max_concurrent_requests(mha, 8192, h200.memory_bytes, 1, 2, 0.9)),
        "q3": critical_batch_size(s70, 0, h100.peak("bf16"), h100.memory_bandwidth, 1, 2),
        "q4": decode_step_time(s70, 4096, 1, h200.peak("fp8"), h200.memory_bandwidth, 1, 2) * 1e3,
        "q5": (max_concurrent_requests(s8, 8192, h100.memory_bytes, 2, 2, 0.9),
               max_concurrent_requests(s8, 8192, h100.memory_bytes, 2, 1, 0.9)),
        "q6": 16 / decode_step_time(s8, 2048, 16, l4.peak("bf16"), l4.memory_bandwidth, 2, 2),
        "q7": max(knobs, key=knobs.get),
    }


# ---------------------------------------------------------------- the solution passes (hidden-test inputs too)

@pytest.mark.parametrize("extra", [0, 7])
def test_solution_passes_every_check(extra):
    lab00.check_count_parameters(count_parameters, extra)
    lab00.check_kv_cache_bytes(kv_cache_bytes, extra)
    lab00.check_flops(prefill_flops, decode_flops, extra)
    lab00.check_bytes(prefill_bytes, decode_bytes, extra)
    lab00.check_attainable_flops(attainable_flops, extra)
    lab00.check_max_concurrent_requests(max_concurrent_requests, extra)
    lab00.check_decode_step_time(decode_step_time, extra)
    lab00.check_critical_batch_size(critical_batch_size, extra)


def test_solution_greedy_loop_passes():
    lab00.check_greedy_generate(greedy_generate, extra=2)


def test_solution_interview_answers_pass():
    a = _answers()
    assert a["q1"] == 11.71875               # 2 * 32 * 8 * 128 * 3000 * 64 * 1 bytes / 2**30
    lab00.check_q1_kv_gib(a["q1"])
    lab00.check_q2_gqa_extra_requests(a["q2"])
    lab00.check_q3_critical_batch(a["q3"])
    lab00.check_q4_tpot_ms(a["q4"])
    lab00.check_q5_max_requests(*a["q5"])
    lab00.check_q6_tokens_per_s(a["q6"])
    lab00.check_q7_knob(a["q7"])


def test_the_embedding_rule_figures_for_llama3_8b():
    """The figures issue 21 gives for the one-row-per-token rule, recomputed by the learner-style functions."""
    s8, h100, l4 = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"], ACCELERATORS["L4"]
    assert whole_table(s8, 2) - weights_read(s8, 1, 2) == 1_050_673_152 - 2 * 4096      # the table less one row
    assert decode_bytes(s8, 2048, 1, 2, 2) / h100.memory_bandwidth * 1e3 == pytest.approx(4.5607, abs=1e-4)
    assert critical_batch_size(s8, 0, h100.peak("bf16"), h100.memory_bandwidth, 2, 2) == 296
    assert _answers()["q4"] == pytest.approx(14.7594, abs=1e-4)
    assert 16 / decode_step_time(s8, 2048, 16, l4.peak("bf16"), l4.memory_bandwidth, 2, 2) == pytest.approx(248.64, abs=0.01)
    # Per kernel at context 1,024 and batch 512: the lumped point hides the matmuls' compute time.
    lumped = lumped_time(s8, 1024, 512, h100.peak("bf16"), h100.memory_bandwidth, 2, 2)
    per_kernel = decode_step_time(s8, 1024, 512, h100.peak("bf16"), h100.memory_bandwidth, 2, 2)
    assert (round(lumped * 1e3, 1), round(per_kernel * 1e3, 1)) == (25.0, 28.3)


def test_llama3_8b_has_about_8_billion_parameters():
    assert count_parameters(PRESETS["Llama-3-8B"]) == 8_030_261_248


# ---------------------------------------------------------------- the released stubs score zero

@pytest.mark.parametrize("check, n_fns", [
    (lab00.check_count_parameters, 1), (lab00.check_kv_cache_bytes, 1), (lab00.check_flops, 2),
    (lab00.check_bytes, 2), (lab00.check_attainable_flops, 1), (lab00.check_max_concurrent_requests, 1),
    (lab00.check_decode_step_time, 1), (lab00.check_critical_batch_size, 1), (lab00.check_greedy_generate, 1)])
def test_stub_fails(check, n_fns):
    with pytest.raises(NotImplementedError):
        check(*([stub] * n_fns))


@pytest.mark.parametrize("check, args", [
    (lab00.check_q1_kv_gib, (None,)), (lab00.check_q2_gqa_extra_requests, (None,)), (lab00.check_q3_critical_batch, (None,)),
    (lab00.check_q4_tpot_ms, (None,)), (lab00.check_q5_max_requests, (None, None)), (lab00.check_q6_tokens_per_s, (None,)),
    (lab00.check_q7_knob, (None,))])
def test_unanswered_interview_question_fails(check, args):
    with pytest.raises(AssertionError):
        check(*args)


# ---------------------------------------------------------------- wrong implementations fail with the right hint

def _fails(match, check, *fns):
    with pytest.raises(AssertionError, match=match):
        check(*fns)


def test_kv_cache_wrong_answers():
    _fails("factor 2", lab00.check_kv_cache_bytes, lambda s, c, b, e: s.n_layers * s.n_kv_heads * s.head_dim * c * b * e)
    _fails("query heads", lab00.check_kv_cache_bytes, lambda s, c, b, e: 2 * s.n_layers * s.n_heads * s.head_dim * c * b * e)
    _fails("layers", lab00.check_kv_cache_bytes, lambda s, c, b, e: 2 * s.n_kv_heads * s.head_dim * c * b * e)
    _fails("batch", lab00.check_kv_cache_bytes, lambda s, c, b, e: 2 * s.n_layers * s.n_kv_heads * s.head_dim * c * e)
    _fails("bytes_per_element", lab00.check_kv_cache_bytes, lambda s, c, b, e: 2 * s.n_layers * s.n_kv_heads * s.head_dim * c * b)
    _fails("exact int", lab00.check_kv_cache_bytes, lambda s, c, b, e: float(kv_cache_bytes(s, c, b, e)))


def test_count_parameters_wrong_answers():
    _fails("untied", lab00.check_count_parameters,
           lambda s: count_parameters(dataclasses.replace(s, tie_embeddings=True)))
    _fails("n_kv_heads", lab00.check_count_parameters,
           lambda s: count_parameters(dataclasses.replace(s, n_kv_heads=s.n_heads)))
    _fails("THREE matrices", lab00.check_count_parameters,
           lambda s: count_parameters(s) - s.n_layers * s.d_model * s.d_ff)
    _fails("RMSNorm", lab00.check_count_parameters, lambda s: count_parameters(s) - (2 * s.n_layers + 1) * s.d_model)


def test_flops_wrong_answers():
    _fails("2 FLOPs", lab00.check_flops, lambda s, L, B: prefill_flops(s, L, B) // 2, decode_flops)
    _fails("causal", lab00.check_flops, lambda s, L, B: B * (2 * _matmul_params(s) * L + 4 * s.n_layers * s.n_heads * s.head_dim * L * L),
           decode_flops)
    _fails("forgot attention", lab00.check_flops, prefill_flops, lambda s, c, B: B * 2 * _matmul_params(s))
    _fails("all parameters", lab00.check_flops, prefill_flops,
           lambda s, c, B: B * (2 * count_parameters(s) + 4 * s.n_layers * s.n_heads * s.head_dim * c))
    _fails("batch", lab00.check_flops, prefill_flops, lambda s, c, B: decode_flops(s, c, 1))


def test_bytes_wrong_answers():
    w = weights_read
    _fails("ONCE per step", lab00.check_bytes, prefill_bytes,
           lambda s, c, B, wb, kb: B * w(s, B, wb) + kv_cache_bytes(s, c, B, kb))
    _fails("forgot the KV cache", lab00.check_bytes, prefill_bytes, lambda s, c, B, wb, kb: w(s, B, wb))
    _fails("forgot the weights", lab00.check_bytes, lambda s, c, B, wb, kb: kv_cache_bytes(s, c, B, kb), decode_bytes)
    _fails("precision for the KV", lab00.check_bytes, prefill_bytes,
           lambda s, c, B, wb, kb: w(s, B, wb) + kv_cache_bytes(s, c, B, wb))


def test_bytes_that_read_the_whole_embedding_table_fail():
    """The old rule, "a pass reads every weight once", on the first (untied) shape: a lookup reads rows, not the table."""
    _fails("table lookup", lab00.check_bytes, prefill_bytes,
           lambda s, c, B, wb, kb: whole_table(s, wb) + kv_cache_bytes(s, c, B, kb))


def test_bytes_that_skip_a_tied_output_projection_fail():
    """Stored parameters less the table plus the rows: right for untied models, wrong for a TIED one (minigpt-target),
    whose output projection still multiplies by the whole shared matrix."""
    def stored_less_table(s, c, B, wb, kb):
        return math.ceil((count_parameters(s) - s.vocab_size * s.d_model + B * s.d_model) * wb) + kv_cache_bytes(s, c, B, kb)
    _fails("TIED", lab00.check_bytes, prefill_bytes, stored_less_table)


def test_bytes_without_the_looked_up_rows_or_norms_fail():
    _fails("embedding rows", lab00.check_bytes, prefill_bytes, lambda s, c, B, wb, kb: w_no_rows(s, wb) + kv_cache_bytes(s, c, B, kb))
    _fails("RMSNorm", lab00.check_bytes, prefill_bytes,
           lambda s, c, B, wb, kb: math.ceil((_matmul_params(s) + B * s.d_model) * wb) + kv_cache_bytes(s, c, B, kb))
    _fails("EVERY sequence", lab00.check_bytes,
           lambda s, L, B, wb, kb: weights_read(s, L, wb) + kv_cache_bytes(s, L, B, kb), decode_bytes)


def w_no_rows(s, wb):
    return weights_read(s, 0, wb)


def test_roofline_wrong_answers():
    _fails("MINIMUM", lab00.check_attainable_flops, lambda ai, p, bw: max(p, ai * bw))
    _fails("compute ceiling", lab00.check_attainable_flops, lambda ai, p, bw: ai * bw)
    _fails("memory slope", lab00.check_attainable_flops, lambda ai, p, bw: p)


def test_max_requests_wrong_answers():
    _fails("memory_utilization", lab00.check_max_concurrent_requests,
           lambda s, c, m, wb, kb, u: max_concurrent_requests(s, c, m, wb, kb, 1.0))
    _fails("subtract the weights", lab00.check_max_concurrent_requests,
           lambda s, c, m, wb, kb, u: int(m * u) // kv_cache_bytes(s, c, 1, kb))
    _fails("factor 2", lab00.check_max_concurrent_requests,
           lambda s, c, m, wb, kb, u: max(0, (int(m * u) - w8(s, wb)) // (kv_cache_bytes(s, c, 1, kb) // 2)))
    _fails("round DOWN", lab00.check_max_concurrent_requests,
           lambda s, c, m, wb, kb, u: max(0, math.ceil((int(m * u) - w8(s, wb)) / kv_cache_bytes(s, c, 1, kb))))


def w8(s, wb):
    return math.ceil(count_parameters(s) * wb)


def test_decode_step_time_wrong_answers():
    _fails("SECONDS", lab00.check_decode_step_time, lambda *a: decode_step_time(*a) * 1e3)
    _fails("ONE roofline point", lab00.check_decode_step_time, lumped_time)
    _fails("bandwidth bound alone", lab00.check_decode_step_time,
           lambda s, c, B, p, bw, wb, kb: decode_bytes(s, c, B, wb, kb) / bw)
    _fails("LARGER of the two", lab00.check_decode_step_time,
           lambda s, c, B, p, bw, wb, kb: decode_flops(s, c, B) / p + decode_bytes(s, c, B, wb, kb) / bw)

    def whole_table_per_kernel(s, c, B, p, bw, wb, kb):
        return (max(decode_flops(s, 0, B) / p, whole_table(s, wb) / bw)
                + max((decode_flops(s, c, B) - decode_flops(s, 0, B)) / p, kv_cache_bytes(s, c, B, kb) / bw))
    _fails("whole input-embedding table", lab00.check_decode_step_time, whole_table_per_kernel)


def closed_form_only(s, context_len, peak, bw, wb, kb):
    """ceil(ridge * w / (f - ridge * k)) and nothing else: in floats it lands one off where a batch sits on the ridge
    (issue 57: the fix-up loops' mutants survived until the check tried such batches)."""
    ridge, w, f, k = step_terms(s, context_len, peak, bw, wb, kb)
    return None if f <= ridge * k else max(1, math.ceil(ridge * w / (f - ridge * k)))


def strict_ridge(s, context_len, peak, bw, wb, kb):
    """A batch exactly on the ridge counted as memory-bound (> instead of >=)."""
    return climbs_from_one(s, context_len, peak, bw, wb, kb, strict=True)


def test_critical_batch_on_the_ridge():
    _fails("off by one|critical_batch_size", lab00.check_critical_batch_size, closed_form_only)
    _fails("critical_batch_size", lab00.check_critical_batch_size, strict_ridge)


def test_critical_batch_that_climbs_one_batch_at_a_time_is_stopped(monkeypatch):
    """Right, but it walks from a poor start: at a batch of 2.4e14 it never answers (issue 57's climbing mutants)."""
    monkeypatch.setattr(lab00, "CRITICAL_BATCH_DEADLINE", 1.0)

    _fails("no answer within 1 s", lab00.check_critical_batch_size, climbs_from_one)


def test_device_and_deadline_hold_when_the_learners_code_runs_in_another_process(monkeypatch):
    """Judged, the learner's code runs in the kernel: the judge asks it to move the default device and to keep the
    deadline there (autograder/checking/call_conditions.py)."""
    monkeypatch.setattr(lab00, "CRITICAL_BATCH_DEADLINE", 1.0)
    names = ["greedy_generate", "tokens_on_the_default_device", "critical_batch_size", "climbs_from_one"]
    with learner_process("tests.labs.test_lab00_checks", names) as learner:
        lab00.check_greedy_generate(learner["greedy_generate"])
        _fails("default device", lab00.check_greedy_generate, learner["tokens_on_the_default_device"])
        lab00.check_critical_batch_size(learner["critical_batch_size"])
        _fails("no answer within 1 s", lab00.check_critical_batch_size, learner["climbs_from_one"])


def test_critical_batch_wrong_answers():
    _fails("ignored the KV cache", lab00.check_critical_batch_size,
           lambda s, c, p, bw, wb, kb: max(1, math.ceil(p / bw * w_no_rows(s, wb) / decode_flops(s, c, 1))))
    _fails("off by one", lab00.check_critical_batch_size,
           lambda *a: None if critical_batch_size(*a) is None else max(0, critical_batch_size(*a) - 1))
    _fails("expected None|ignored the context", lab00.check_critical_batch_size,
           lambda s, c, p, bw, wb, kb: critical_batch_size(s, 0, p, bw, wb, kb))

    def whole_table_rule(s, c, p, bw, wb, kb):
        ridge, f, k, w = p / bw, decode_flops(s, c, 1), kv_cache_bytes(s, c, 1, kb), whole_table(s, wb)
        if f <= ridge * k:
            return None
        b = 1
        while b * f < ridge * (w + b * k):
            b += 1
        return b
    _fails("whole input-embedding table", lab00.check_critical_batch_size, whole_table_rule)


def test_greedy_loop_wrong_answers():
    @torch.inference_mode()
    def first_position(model, prompt, n):          # reads logits[:, 0] instead of the last position
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[:, 0].argmax(-1)))
        return ids[len(prompt):]

    @torch.inference_mode()
    def never_appends(model, prompt, n):           # forgets to feed the new token back
        return [int(model(torch.tensor([prompt]))[:, -1].argmax(-1)) for _ in range(n)]

    @torch.inference_mode()
    def returns_prompt_too(model, prompt, n):
        return list(prompt) + greedy_generate(model, prompt, n)

    _fails("default device", lab00.check_greedy_generate, tokens_on_the_default_device)
    _fails("LAST position", lab00.check_greedy_generate, first_position)
    _fails("appended", lab00.check_greedy_generate, never_appends)
    _fails("exactly", lab00.check_greedy_generate, returns_prompt_too)


def test_interview_wrong_units_and_mistakes():
    a = _answers()
    _fails("GB", lab00.check_q1_kv_gib, a["q1"] * GiB / 1e9)
    _fails("factor 2", lab00.check_q1_kv_gib, a["q1"] / 2)
    _fails("query heads", lab00.check_q1_kv_gib, a["q1"] * 4)
    _fails("1 byte", lab00.check_q1_kv_gib, a["q1"] * 2)
    _fails("how many fit with GQA", lab00.check_q2_gqa_extra_requests, 20)
    _fails("MHA minus GQA", lab00.check_q2_gqa_extra_requests, -a["q2"])
    _fails("ratio", lab00.check_q2_gqa_extra_requests, 10)
    _fails("off by one", lab00.check_q3_critical_batch, a["q3"] - 1)
    _fails("lumped", lab00.check_q3_critical_batch, None)
    _fails("bf16 peak|1 byte each", lab00.check_q3_critical_batch, 296)
    _fails("seconds", lab00.check_q4_tpot_ms, a["q4"] / 1e3)
    _fails("whole input-embedding table", lab00.check_q4_tpot_ms, 14.98)
    _fails("only 5%", lab00.check_q7_knob, 2)
    _fails("stays as large", lab00.check_q7_knob, 3)
    _fails("creates no memory", lab00.check_q7_knob, 4)
    _fails("answer 1, 2, 3 or 4", lab00.check_q7_knob, 104)
    _fails("whole input-embedding table", lab00.check_q6_tokens_per_s, 235.8)
    _fails("81,559 MiB", lab00.check_q5_max_requests,
           max_concurrent_requests(PRESETS["Llama-3-8B"], 8192, 80 * GiB, 2, 2, 0.9), a["q5"][1])
    _fails("90%", lab00.check_q5_max_requests,
           max_concurrent_requests(PRESETS["Llama-3-8B"], 8192, ACCELERATORS["H100-SXM"].memory_bytes, 2, 2, 1.0), a["q5"][1])
    _fails("steps per second", lab00.check_q6_tokens_per_s, a["q6"] / 16)


# ---------------------------------------------------------------- the package's reference is not an answer

from minigpt.generate import generate_naive  # noqa: E402
from minigpt.costmodel import calculators  # noqa: E402
from autograder.checking.reference_guard import ReferenceHandedIn  # noqa: E402

CALCULATOR_CHECKS = [
    (lab00.check_count_parameters, ("count_parameters",)), (lab00.check_kv_cache_bytes, ("kv_cache_bytes",)),
    (lab00.check_flops, ("prefill_flops", "decode_flops")), (lab00.check_bytes, ("prefill_bytes", "decode_bytes")),
    (lab00.check_attainable_flops, ("attainable_flops",)),
    (lab00.check_max_concurrent_requests, ("max_concurrent_requests",)),
    (lab00.check_decode_step_time, ("decode_step_time",)),
    (lab00.check_critical_batch_size, ("critical_batch_size",)),
]


def _thin_wrapper(name):
    """A notebook-defined function that only forwards to the package's calculator (positional, like the lab)."""
    reference = getattr(calculators, name)

    def wrapper(*args):
        if name in ("prefill_bytes", "decode_bytes", "decode_step_time", "critical_batch_size"):
            *head, wb, kb = args
            return reference(*head, weight_bytes_per_element=wb, kv_bytes_per_element=kb)
        if name == "max_concurrent_requests":
            s, ctx, mem, wb, kb, util = args
            return reference(s, ctx, mem, weight_bytes_per_element=wb, kv_bytes_per_element=kb, memory_utilization=util)
        return reference(*args)
    return wrapper


@pytest.mark.parametrize("check, names", CALCULATOR_CHECKS, ids=[c.__name__ for c, _ in CALCULATOR_CHECKS])
def test_the_reference_calculator_is_refused(check, names):
    with pytest.raises(ReferenceHandedIn, match="reference|not in your notebook"):
        check(*[getattr(calculators, n) for n in names])


@pytest.mark.parametrize("check, names", CALCULATOR_CHECKS, ids=[c.__name__ for c, _ in CALCULATOR_CHECKS])
def test_a_thin_wrapper_around_the_calculator_is_refused(check, names):
    with pytest.raises(ReferenceHandedIn, match="calls the course's reference"):
        check(*[_thin_wrapper(n) for n in names])


def test_a_partial_of_the_calculator_is_refused():
    import functools
    with pytest.raises(ReferenceHandedIn, match="course's reference"):
        lab00.check_kv_cache_bytes(functools.partial(calculators.kv_cache_bytes))


def test_bytes_calling_the_package_count_parameters_is_refused():
    """Exercise 5 built on the package's weight_bytes_read rather than the learner's own counts."""
    def prefill_bytes_ref(s, seq_len, batch, wb, kb):
        return calculators.weight_bytes_read(s, batch * seq_len, wb) + kv_cache_bytes(s, seq_len, batch, kb)
    with pytest.raises(ReferenceHandedIn, match=r"weight_bytes_read"):
        lab00.check_bytes(prefill_bytes_ref, decode_bytes)


def test_greedy_generate_reference_and_wrapper_are_refused():
    with pytest.raises(ReferenceHandedIn, match="not in your notebook|course's reference"):
        lab00.check_greedy_generate(lambda m, p, n: generate_naive(m, p, n, stop_token_ids=()).tokens)
    with pytest.raises(ReferenceHandedIn):
        lab00.check_greedy_generate(generate_naive)


# ---------------------------------------------------------------- n_heads * head_dim != d_model, in the visible checks

def count_parameters_square_wq(s):
    """wq and wo as d_model x d_model: right only when n_heads * head_dim == d_model."""
    d, kv = s.d_model, s.n_kv_heads * s.head_dim
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * s.d_ff + 2 * d
    embed = s.vocab_size * d
    return embed + s.n_layers * per_layer + d + (0 if s.tie_embeddings else embed)


def count_parameters_head_dim_from_d_model(s):
    """head_dim = d_model // n_heads instead of the shape's head_dim."""
    return count_parameters(dataclasses.replace(s, head_dim=s.d_model // s.n_heads))


def kv_cache_bytes_head_dim_from_d_model(s, context_len, batch, bytes_per_element):
    return kv_cache_bytes(dataclasses.replace(s, head_dim=s.d_model // s.n_heads), context_len, batch, bytes_per_element)


@pytest.mark.parametrize("check, wrong, match", [
    (lab00.check_count_parameters, count_parameters_square_wq, "not d_model x d_model"),
    (lab00.check_count_parameters, count_parameters_head_dim_from_d_model, "d_model // n_heads"),
    (lab00.check_kv_cache_bytes, kv_cache_bytes_head_dim_from_d_model, "d_model // n_heads"),
], ids=["square-wq", "params-head-dim", "kv-head-dim"])
def test_visible_check_sees_heads_wider_than_d_model(check, wrong, match):
    """extra=0 (the visible cell) already has a shape with n_heads * head_dim != d_model."""
    with pytest.raises(AssertionError, match=match):
        check(wrong)
