"""Checks for Lab 00, the token factory: parameters, KV cache, FLOPs, bytes, roofline, interview answers.

Each check calls the learner's function on a few cases (more with `extra=N`, used by the hidden
tests), compares with the reference in `minigpt.costmodel.calculators`, and raises AssertionError naming the
case, the expected and the received value, and, when the received value matches a known mistake,
what that mistake probably was. Byte and FLOP counts must be exact ints; times are floats compared
with a relative tolerance.

* check_bytes: a pass reads the matmul and norm weights once and one embedding row per token (the whole
  table only through a tied output projection); the old "every weight once" rule is diagnosed.
* check_decode_step_time: each kernel of a decode step (weight matmuls, attention) on its own roofline,
  summed; one lumped roofline point, a bandwidth-only bound and compute + memory added are diagnosed.
* check_critical_batch_size: the lumped step's smallest compute-bound batch.
* Interview questions Q1-Q7; Q3 (the weight matmuls' critical batch at a context) and Q7 (one serving knob,
  each wrong choice diagnosed) need reasoning the notebook does not print.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import random
from typing import Any, Callable

from autograder.harness import check_answer, quiet, within
from autograder.checking.call_conditions import DEVICE_HINT, call_with_deadline, default_device_elsewhere
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.costmodel import calculators as ref
from minigpt.costmodel.calculators import PRESETS, ModelShape
from minigpt.costmodel.hardware import ACCELERATORS

__all__ = [
    "check_greedy_generate", "check_count_parameters", "check_kv_cache_bytes", "check_flops", "check_bytes",
    "check_attainable_flops", "check_max_concurrent_requests", "check_decode_step_time",
    "check_critical_batch_size", "check_q1_kv_gib", "check_q2_gqa_extra_requests", "check_q3_critical_batch",
    "check_q4_tpot_ms", "check_q5_max_requests", "check_q6_tokens_per_s", "check_q7_knob",
]

REL_TOL = 1e-6
# Decoy figures for the unit mistakes an answer could make.
GiB, GB = 2**30, 10**9

# Every Llama preset has n_heads * head_dim == d_model, which hides `head_dim = d_model // n_heads` and a d x d wq:
# the visible checks also get a shape whose attention width (12 heads of 128 = 1536) is not its d_model (1024).
WIDE_HEADS = ModelShape("wide-heads (n_heads*head_dim != d_model)", n_layers=6, d_model=1024, n_heads=12, n_kv_heads=4,
                        head_dim=128, d_ff=2816, vocab_size=32000, tie_embeddings=False)
BASE_SHAPES = [PRESETS["Llama-3-8B"], PRESETS["Llama-2-7B (MHA)"], PRESETS["Llama-3-8B-MQA (hypothetical)"],
               PRESETS["minigpt-target"], PRESETS["Llama-3-70B"], WIDE_HEADS]

# The package's calculators: a learner's function may call none of them (each is some exercise's reference).
REFERENCE_FUNCTIONS = tuple(f for _, f in inspect.getmembers(ref, inspect.isfunction) if f.__module__ == ref.__name__)


def random_shapes(seed: int, n: int) -> list[ModelShape]:
    """n seeded random Llama-style shapes (tied and untied, MHA / GQA / MQA)."""
    rng = random.Random(seed)
    shapes = []
    for i in range(n):
        n_kv = rng.choice([1, 2, 4, 8])
        n_heads = n_kv * rng.choice([1, 2, 4, 8])
        head_dim = rng.choice([32, 64, 80, 128])
        shapes.append(ModelShape(f"random-{seed}-{i}", n_layers=rng.randint(1, 48), d_model=rng.choice([256, 512, 2048, 3072]),
                                 n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, d_ff=rng.choice([688, 1024, 8192]),
                                 vocab_size=rng.choice([4096, 32000, 50257]), tie_embeddings=rng.random() < 0.5))
    return shapes


def _shapes(extra: int) -> list[ModelShape]:
    return BASE_SHAPES + (random_shapes(extra, extra) if extra else [])


def _call(fn: Callable[..., Any], *args: Any, watch: tuple[Any, ...] = REFERENCE_FUNCTIONS,
          deadline: float | None = None) -> Any:
    """fn(*args), quietly; calling one of the package's references (`watch`) from inside it is refused; stopped by
    TimeoutError after `deadline` seconds when one is given."""
    if fn is None or not callable(fn):
        raise AssertionError(f"expected your function, got {fn!r}")
    with quiet(), no_calls_into(*watch, what=getattr(fn, "__name__", "your function")):
        return fn(*args) if deadline is None else call_with_deadline(fn, *args, seconds=deadline)


def _own(fn: Any, reference: Any) -> None:
    """Refuse the package's reference (or any package code) handed in as the answer."""
    if callable(fn):
        own_work(fn, reference, what=getattr(reference, "__name__", "this exercise"))


def _describe(shape: ModelShape) -> str:
    return (f"{shape.name} (layers={shape.n_layers}, d_model={shape.d_model}, heads={shape.n_heads}, "
            f"kv_heads={shape.n_kv_heads}, head_dim={shape.head_dim}, d_ff={shape.d_ff}, vocab={shape.vocab_size}, "
            f"tied={shape.tie_embeddings})")


# ---------------------------------------------------------------- the autoregressive loop

def check_greedy_generate(greedy_generate: Callable[..., list[int]], extra: int = 0) -> None:
    """greedy_generate(model, prompt_ids, max_new_tokens) -> list of new ids, same as minigpt's greedy loop."""
    import torch

    from minigpt.config import ModelConfig
    from minigpt.engine.cached_generation import generate_kv_cache
    from minigpt.generate import generate_naive
    from minigpt.model import GPT

    _own(greedy_generate, generate_naive)

    # A small random model with untied, scaled-up weights, so that greedy output varies from step to step
    # (a freshly initialised tied model mostly repeats its last input token).
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=4096, max_seq_len=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                            d_ff=128, tie_embeddings=False)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)
    rng = random.Random(extra)
    prompts = [[1, 2, 3], [4095], [rng.randrange(4096) for _ in range(rng.randint(1, 20))]]
    for k in range(extra):
        prompts.append([rng.randrange(4096) for _ in range(rng.randint(1, 30))])
    for i, prompt in enumerate(prompts):
        n = 8 + i
        expected = generate_naive(model, prompt, n, stop_token_ids=()).tokens
        got = _call(greedy_generate, model, list(prompt), n, watch=(generate_naive, generate_kv_cache))
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        got = [int(t) for t in got] if isinstance(got, (list, tuple)) else got
        if got == expected:
            continue
        what = f"greedy_generate(model, prompt={prompt}, max_new_tokens={n})"
        if not isinstance(got, list):
            raise AssertionError(f"{what}: return a list of token ids, got {type(got).__name__}")
        if len(got) != n:
            raise AssertionError(f"{what}: expected exactly {n} new tokens, got {len(got)}. Return only the new "
                                 "tokens (not the prompt), and do not stop early at end-of-text.")
        if got[0] == expected[0] and len(set(got)) == 1 and len(set(expected)) > 1:
            hint = " All your tokens are the same: is each new token appended to the sequence the model sees next?"
        else:
            hint = " Take the logits of the LAST position (logits[:, -1]) and argmax over the vocabulary."
        raise AssertionError(f"{what}: expected {expected}, got {got}.{hint}")
    # The same on a model that is not on torch's default device: the tokens must be made on model.device.
    prompt, n = prompts[0], 8
    what = (f"greedy_generate(model, prompt={prompt}, max_new_tokens={n}) with torch's default device moved off the "
            "model's")
    try:
        with default_device_elsewhere():
            got = _call(greedy_generate, model, list(prompt), n, watch=(generate_naive, generate_kv_cache))
    except AssertionError:
        raise
    except Exception as err:
        raise AssertionError(f"{what}: your code raised {type(err).__name__}: {err}. {DEVICE_HINT}.") from None
    got = got.tolist() if isinstance(got, torch.Tensor) else got
    if [int(t) for t in got] != generate_naive(model, prompt, n, stop_token_ids=()).tokens:
        raise AssertionError(f"{what}: the tokens differ from the same call on the default device. {DEVICE_HINT}.")


# ---------------------------------------------------------------- parameters and KV cache

def check_count_parameters(count_parameters: Callable[[ModelShape], int], extra: int = 0) -> None:
    """count_parameters(shape) -> int, all distinct parameters (tied embedding counted once)."""
    _own(count_parameters, ref.count_parameters)
    for s in _shapes(extra):
        expected = ref.count_parameters(s)
        emb = s.vocab_size * s.d_model
        d_kv_wrong = s.n_layers * 2 * s.d_model * (s.n_heads - s.n_kv_heads) * s.head_dim
        q_width = s.n_heads * s.head_dim
        head_dim_from_d = s.d_model // s.n_heads
        diagnoses = {
            expected + 2 * s.n_layers * s.d_model * (s.d_model - q_width):
                "wq and wo are d_model x (n_heads * head_dim), not d_model x d_model: n_heads * head_dim need not "
                "equal d_model.",
            expected - s.n_layers * s.d_model * (2 * q_width + 2 * s.n_kv_heads * s.head_dim)
            + s.n_layers * s.d_model * (2 * s.n_heads + 2 * s.n_kv_heads) * head_dim_from_d:
                "head_dim is a field of the shape; d_model // n_heads is not always the head dimension.",
            expected - s.n_layers * s.d_model * s.d_ff: "the SwiGLU MLP has THREE matrices (gate, up, down), not two.",
            expected + d_kv_wrong: "wk and wv have n_kv_heads * head_dim outputs, not n_heads * head_dim (GQA).",
            expected - (2 * s.n_layers + 1) * s.d_model: "forgot the RMSNorm weights (2 per layer + 1 final).",
            expected - 2 * s.n_layers * s.d_model: "forgot the two RMSNorm weights per layer.",
            expected - s.d_model: "forgot the final RMSNorm weight.",
        }
        if s.tie_embeddings:
            diagnoses[expected + emb] = "tied embeddings: the output projection IS the embedding matrix, count it once."
        else:
            diagnoses[expected - emb] = "this model is untied: the output projection (lm_head) is a separate vocab x d_model matrix."
        diagnoses.setdefault(expected - emb * (1 if s.tie_embeddings else 2), "forgot the embedding / output matrices.")
        check_answer(_call(count_parameters, s), expected, f"count_parameters({_describe(s)})", diagnoses, unit="parameters", reveal=True)


KV_CASES = [(8192, 1, 2), (4096, 8, 1), (1, 1, 4), (1000, 3, 2), (0, 4, 2)]


def kv_diagnoses(s: ModelShape, ctx: int, batch: int, bpe: int) -> list[tuple[int, str]]:
    expected = ref.kv_cache_bytes(s, ctx, batch, bpe)
    d = [(expected // 2, "forgot the factor 2: the cache stores K AND V."),
         (expected // s.n_kv_heads * s.n_heads, "used the query heads; only n_kv_heads heads are cached (GQA/MQA)."),
         (expected // s.n_layers, "forgot to multiply by the number of layers (every layer has its own cache)."),
         (expected // batch, "forgot the batch: every sequence has its own cache."),
         (expected // bpe, "counted elements, not bytes: multiply by bytes_per_element."),
         (2 * s.n_layers * s.d_model * ctx * batch * bpe, "used d_model instead of n_kv_heads * head_dim."),
         (2 * s.n_layers * s.n_kv_heads * (s.d_model // s.n_heads) * ctx * batch * bpe,
          "head_dim is a field of the shape; d_model // n_heads is not always the head dimension.")]
    return [(v, m) for v, m in d if v != expected]


def check_kv_cache_bytes(kv_cache_bytes: Callable[[ModelShape, int, int, int], int], extra: int = 0) -> None:
    """kv_cache_bytes(shape, context_len, batch, bytes_per_element) -> int bytes."""
    _own(kv_cache_bytes, ref.kv_cache_bytes)
    cases = [(s, *c) for s in _shapes(extra) for c in KV_CASES]
    rng = random.Random(extra)
    cases += [(s, rng.randint(1, 131072), rng.randint(1, 256), rng.choice([1, 2, 4])) for s in _shapes(extra)[:extra]]
    for s, ctx, batch, bpe in cases:
        check_answer(_call(kv_cache_bytes, s, ctx, batch, bpe), ref.kv_cache_bytes(s, ctx, batch, bpe),
               f"kv_cache_bytes({_describe(s)}, context_len={ctx}, batch={batch}, bytes_per_element={bpe})",
               kv_diagnoses(s, ctx, batch, bpe), unit="bytes", reveal=True)


# ---------------------------------------------------------------- FLOPs and bytes

FLOP_CASES = [(1, 1), (128, 1), (2048, 4), (513, 3)]


def check_flops(prefill_flops: Callable[[ModelShape, int, int], int],
                decode_flops: Callable[[ModelShape, int, int], int], extra: int = 0) -> None:
    """prefill_flops(shape, seq_len, batch) and decode_flops(shape, context_len, batch) -> int FLOPs."""
    _own(prefill_flops, ref.prefill_flops)
    _own(decode_flops, ref.decode_flops)
    for s in _shapes(extra):
        lin = 2 * ref.matmul_parameters(s)
        for L, B in FLOP_CASES:
            expected = ref.prefill_flops(s, L, B)
            attn_causal = ref.attention_flops(s, L * (L + 1) // 2)
            diagnoses = {
                expected // 2: "a multiply-add is 2 FLOPs: a (k x n) weight costs 2*k*n FLOPs per token.",
                B * (lin * L + ref.attention_flops(s, L * L)): "attention is causal: query i sees i keys, "
                                                               "L(L+1)/2 (query, key) pairs in all, not L*L.",
                B * lin * L: "forgot attention (QK^T and PV: 4 * n_heads * head_dim FLOPs per (query, key) pair per layer).",
                B * (2 * ref.count_parameters(s) * L + attn_causal): "used all parameters; only weights in matmuls count "
                                                                    "(layers' projections + output projection; the embedding is a lookup).",
                B * ((lin - 2 * s.vocab_size * s.d_model) * L + attn_causal): "forgot the output projection (d_model x vocab).",
            }
            if B > 1:
                diagnoses[expected // B] = "forgot the batch."
            check_answer(_call(prefill_flops, s, L, B), expected, f"prefill_flops({_describe(s)}, seq_len={L}, batch={B})", diagnoses, unit="FLOPs", reveal=True)
            expected = ref.decode_flops(s, L, B)
            diagnoses = {
                expected // 2: "a multiply-add is 2 FLOPs.",
                B * lin: "forgot attention over the cached context (4 * n_layers * n_heads * head_dim * context_len).",
                B * (2 * ref.count_parameters(s) + ref.attention_flops(s, L)): "used all parameters; only matmul weights count.",
                B * (lin + ref.attention_flops(s, L) // s.n_heads * s.n_kv_heads): "attention FLOPs use the query heads: "
                                                                                     "every query head does its own dot products.",
            }
            if B > 1:
                diagnoses[expected // B] = "forgot the batch: each sequence computes its own token."
            check_answer(_call(decode_flops, s, L, B), expected, f"decode_flops({_describe(s)}, context_len={L}, batch={B})", diagnoses, unit="FLOPs", reveal=True)


BYTES_CASES = [(1, 1, 2, 2), (2048, 8, 2, 2), (8192, 32, 2, 1), (512, 1, 1, 1), (100, 3, 4, 4)]


def whole_table_bytes(shape: ModelShape, bytes_per_element: float) -> int:
    """The old rule: every stored weight read once per pass, the whole input-embedding table included."""
    return ref.weight_bytes(shape, bytes_per_element)


def bytes_diagnoses(s: ModelShape, tokens: int, kv: int, wb: float, kb: int, batch: int, rows_per_seq: int) -> dict:
    """Wrong byte counts for a pass over `tokens` positions (batch * rows_per_seq) that also moves `kv` bytes."""
    right_w = ref.weight_bytes_read(s, tokens, wb)
    emb_rows = tokens * s.d_model * wb
    norms = (2 * s.n_layers + 1) * s.d_model * wb
    d = {}
    if s.tie_embeddings:
        d[whole_table_bytes(s, wb) + kv] = ("the lookup also reads one embedding row per token; the tied output "
                                            "projection reading the whole matrix does not replace it.")
        d[right_w - s.vocab_size * s.d_model * wb + kv] = (
            "this model is TIED: its output projection multiplies every token by the whole shared vocab x d_model "
            "matrix, so the matrix is read in full (besides the looked-up rows).")
    else:
        d[whole_table_bytes(s, wb) + kv] = (
            "the input embedding is a table lookup: a pass reads one d_model row per token, not the whole "
            "vocab x d_model table (only the output projection, a matmul, reads every row).")
    d.setdefault(right_w - emb_rows + kv, "forgot the looked-up embedding rows: one d_model row per token.")
    d.setdefault(right_w - norms + kv, "forgot the RMSNorm weights (2 per layer + 1 final): they are read too.")
    if batch > 1 and rows_per_seq > 1:
        d.setdefault(ref.weight_bytes_read(s, rows_per_seq, wb) + kv,
                     "one embedding row per token of EVERY sequence: batch * tokens rows.")
    d.setdefault(right_w, "forgot the KV cache.")
    d.setdefault(kv, "forgot the weights: each one a matmul uses is read once per forward pass.")
    if batch > 1:
        d.setdefault(right_w * batch + kv,
                     "the weights are read ONCE per step and shared by the whole batch, not once per sequence.")
    if kb != wb:
        d.setdefault(right_w + kv // kb * wb, "used the weights' precision for the KV cache.")
    return d


def check_bytes(prefill_bytes: Callable[..., int], decode_bytes: Callable[..., int], extra: int = 0) -> None:
    """prefill_bytes / decode_bytes(shape, tokens, batch, weight_bytes_per_element, kv_bytes_per_element) -> int."""
    _own(prefill_bytes, ref.prefill_bytes)
    _own(decode_bytes, ref.decode_bytes)
    for s in _shapes(extra):
        for L, B, wb, kb in BYTES_CASES:
            kv = ref.kv_cache_bytes(s, L, B, kb)
            args = f"({_describe(s)}, {L}, batch={B}, weight_bytes_per_element={wb}, kv_bytes_per_element={kb})"
            check_answer(_call(prefill_bytes, s, L, B, wb, kb), ref.prefill_bytes(s, L, B, weight_bytes_per_element=wb,
                         kv_bytes_per_element=kb), "prefill_bytes" + args, bytes_diagnoses(s, B * L, kv, wb, kb, B, L),
                         unit="bytes", reveal=True)
            check_answer(_call(decode_bytes, s, L, B, wb, kb), ref.decode_bytes(s, L, B, weight_bytes_per_element=wb,
                         kv_bytes_per_element=kb), "decode_bytes" + args, bytes_diagnoses(s, B, kv, wb, kb, B, 1),
                         unit="bytes", reveal=True)


# ---------------------------------------------------------------- roofline and serving limits

def check_attainable_flops(attainable_flops: Callable[[float, float, float], float], extra: int = 0) -> None:
    """attainable_flops(intensity, peak_flops, bandwidth) -> FLOP/s on the roofline."""
    _own(attainable_flops, ref.attainable_flops)
    cases = [(ai, g.peak("bf16"), g.memory_bandwidth) for g in ACCELERATORS.values() for ai in (0.5, 1.0, 60.0, 300.0, 1e4)]
    rng = random.Random(extra)
    cases += [(10 ** rng.uniform(-2, 5), 10 ** rng.uniform(11, 16), 10 ** rng.uniform(10, 13)) for _ in range(extra)]
    for ai, peak, bw in cases:
        expected = ref.attainable_flops(ai, peak, bw)
        check_answer(_call(attainable_flops, ai, peak, bw), expected,
               f"attainable_flops(intensity={ai:g}, peak_flops={peak:.4g}, bandwidth={bw:.4g})",
               [(max(peak, ai * bw), "the roofline is the MINIMUM of the peak and intensity * bandwidth."),
                (ai * bw, "forgot the compute ceiling (min with peak_flops)."),
                (peak, "forgot the memory slope: below the ridge point you get intensity * bandwidth."),
                (ai * peak / bw, "intensity (FLOP/byte) times bandwidth (byte/s) gives FLOP/s.")], unit="FLOP/s", rel=REL_TOL, reveal=True)


def check_max_concurrent_requests(max_concurrent_requests: Callable[..., int], extra: int = 0) -> None:
    """max_concurrent_requests(shape, context_len, memory_bytes, weight_bpe, kv_bpe, memory_utilization) -> int."""
    _own(max_concurrent_requests, ref.max_concurrent_requests)
    cases = [(PRESETS["Llama-3-8B"], 8192, ACCELERATORS["H100-SXM"].memory_bytes, 2, 2, 0.9),
             (PRESETS["Llama-3-8B"], 8192, ACCELERATORS["H100-SXM"].memory_bytes, 2, 1, 0.9),
             (PRESETS["Llama-2-7B (MHA)"], 4096, ACCELERATORS["A100-SXM-80GB"].memory_bytes, 2, 2, 0.9),
             (PRESETS["Llama-3-8B"], 2048, ACCELERATORS["L4"].memory_bytes, 2, 2, 0.95),
             (PRESETS["Llama-3-70B"], 4096, ACCELERATORS["H200"].memory_bytes, 1, 1, 0.9),
             (PRESETS["Llama-3-70B"], 4096, ACCELERATORS["H100-SXM"].memory_bytes, 2, 2, 0.9),   # does not fit: 0
             (PRESETS["minigpt-target"], 512, ACCELERATORS["T4"].memory_bytes, 4, 4, 1.0)]
    rng = random.Random(extra)
    cases += [(s, rng.randint(1, 32768), rng.choice([16, 24, 80, 141]) * GB, rng.choice([1, 2]), rng.choice([1, 2]),
               rng.choice([0.8, 0.9, 1.0])) for s in random_shapes(extra + 100, extra)]
    for s, ctx, mem, wb, kb, util in cases:
        expected = ref.max_concurrent_requests(s, ctx, mem, weight_bytes_per_element=wb, kv_bytes_per_element=kb,
                                               memory_utilization=util)
        per_req = ref.kv_cache_bytes(s, ctx, 1, kb)
        w = ref.weight_bytes(s, wb)
        diagnoses = {}
        if util < 1:
            diagnoses[max(0, (mem - w) // per_req)] = "forgot memory_utilization: only that fraction of memory is usable."
        diagnoses.setdefault(int(mem * util) // per_req, "forgot to subtract the weights from the memory.")
        if kb == 2:
            diagnoses.setdefault(max(0, (int(mem * util) - w) // (2 * per_req)), "used 4 bytes per element (fp32)?")
        diagnoses.setdefault(max(0, (int(mem * util) - w) // (per_req // 2)), "forgot the factor 2 for K and V.")
        diagnoses.setdefault(max(0, (int(mem * util) - w) // per_req + 1), "round DOWN: a partial request does not fit.")
        check_answer(_call(max_concurrent_requests, s, ctx, mem, wb, kb, util), expected,
               f"max_concurrent_requests({_describe(s)}, context_len={ctx}, memory_bytes={mem:,}, weight_bpe={wb}, "
               f"kv_bpe={kb}, memory_utilization={util})", diagnoses, unit="requests", reveal=True)


def _lumped_time(s: ModelShape, ctx: int, B: int, peak: float, bw: float, wb: float, kb: int) -> float:
    """The whole step as one roofline point: max(total FLOPs / peak, total bytes / bandwidth)."""
    kw = dict(weight_bytes_per_element=wb, kv_bytes_per_element=kb)
    return max(ref.decode_flops(s, ctx, B) / peak, ref.decode_bytes(s, ctx, B, **kw) / bw)


def check_decode_step_time(decode_step_time: Callable[..., float], extra: int = 0) -> None:
    """decode_step_time(shape, context_len, batch, peak_flops, bandwidth, weight_bpe, kv_bpe) -> seconds per step,
    each kernel (weight matmuls, attention) bounded by its own roofline, summed."""
    _own(decode_step_time, ref.decode_step_time)
    h100, h200, l4 = ACCELERATORS["H100-SXM"], ACCELERATORS["H200"], ACCELERATORS["L4"]
    cases = [(PRESETS["Llama-3-8B"], 1024, 512, h100.peak("bf16"), h100.memory_bandwidth, 2, 2),
             (PRESETS["Llama-3-8B"], 4096, 1, h100.peak("bf16"), h100.memory_bandwidth, 2, 2),
             (PRESETS["Llama-3-8B"], 2048, 16, l4.peak("bf16"), l4.memory_bandwidth, 2, 2),
             (PRESETS["Llama-3-70B"], 8192, 8, h200.peak("fp8"), h200.memory_bandwidth, 1, 1),
             (PRESETS["Llama-2-7B (MHA)"], 256, 1024, ACCELERATORS["RTX-4090"].peak("bf16"),
              ACCELERATORS["RTX-4090"].memory_bandwidth, 2, 2),
             (PRESETS["minigpt-target"], 256, 1, 1e12, 10e9, 4, 4),
             (WIDE_HEADS, 512, 2048, 1e14, 1e12, 2, 1)]
    rng = random.Random(extra)
    cases += [(s, rng.randint(0, 16384), rng.choice([1, 16, 256, 2048]), 10 ** rng.uniform(12, 15.5),
               10 ** rng.uniform(10, 12.7), 2, rng.choice([1, 2])) for s in random_shapes(extra + 200, extra)]
    for s, ctx, B, peak, bw, wb, kb in cases:
        kw = dict(weight_bytes_per_element=wb, kv_bytes_per_element=kb)
        expected = ref.decode_step_time(s, ctx, B, peak, bw, **kw)
        kernels = ref.decode_kernels(s, ctx, B, **kw)
        total_f, total_m = ref.decode_flops(s, ctx, B), ref.decode_bytes(s, ctx, B, **kw)
        (fw, mw), (fa, ma) = kernels["weights"], kernels["attention"]
        old_mw = whole_table_bytes(s, wb)
        check_answer(_call(decode_step_time, s, ctx, B, peak, bw, wb, kb), expected,
                     f"decode_step_time({_describe(s)}, context_len={ctx}, batch={B}, peak_flops={peak:.4g}, "
                     f"bandwidth={bw:.4g}, weight_bpe={wb}, kv_bpe={kb})",
                     [(expected * 1e3, "return SECONDS, not milliseconds."),
                      (_lumped_time(s, ctx, B, peak, bw, wb, kb),
                       "that is the whole step as ONE roofline point; the weight matmuls and attention are separate "
                       "kernels run one after the other, each bounded by its own FLOPs and bytes: add their bounds."),
                      (total_m / bw, "that is the bandwidth bound alone; a kernel also cannot beat FLOPs / peak "
                                     "(the weight matmuls at a large batch)."),
                      (total_f / peak + total_m / bw, "within a kernel, math and memory traffic overlap: its bound is "
                                                      "the LARGER of the two times, not their sum."),
                      (max(fw / peak, old_mw / bw) + max(fa / peak, ma / bw),
                       "counted the whole input-embedding table; a decode step looks up one row per sequence."),
                      (max(fw / peak, (mw + ma) / bw) + fa / peak,
                       "the KV cache is read by attention, not by the weight matmuls.")],
                     unit="seconds", rel=REL_TOL, reveal=True)


CRITICAL_BATCH_DEADLINE = 20.0     # seconds for one answer that takes microseconds (a climbing loop: years)


def check_critical_batch_size(critical_batch_size: Callable[..., int | None], extra: int = 0) -> None:
    """critical_batch_size(shape, context_len, peak_flops, bandwidth, weight_bpe, kv_bpe) -> smallest int batch or None."""
    _own(critical_batch_size, ref.critical_batch_size)
    h100, l4, a100 = ACCELERATORS["H100-SXM"], ACCELERATORS["L4"], ACCELERATORS["A100-SXM-80GB"]
    cases = [(PRESETS["Llama-3-8B"], 0, h100.peak("bf16"), h100.memory_bandwidth, 2, 2),
             (PRESETS["Llama-3-8B"], 128, h100.peak("fp8"), h100.memory_bandwidth, 1, 1),
             (PRESETS["Llama-3-70B"], 256, a100.peak("bf16"), a100.memory_bandwidth, 2, 2),
             (PRESETS["Llama-2-7B (MHA)"], 16, l4.peak("bf16"), l4.memory_bandwidth, 2, 2),
             (PRESETS["Llama-3-8B"], 8192, h100.peak("bf16"), h100.memory_bandwidth, 2, 2),     # never: None
             (PRESETS["minigpt-target"], 0, 1e12, 1e11, 4, 4)]
    rng = random.Random(extra)
    cases += [(s, rng.choice([0, 16, 256]), 10 ** rng.uniform(12, 15), 10 ** rng.uniform(11, 12.5), 2, 2)
              for s in random_shapes(extra + 300, extra)]
    # The boundary: a machine whose ridge equals one sequence's FLOPs per KV byte exactly (f == ridge * k): adding
    # sequences never raises the intensity past the ridge, so None (and never a division by f - ridge * k = 0).
    edge, edge_ctx = PRESETS["minigpt-target"], 128
    edge_w = ref.decode_bytes(edge, edge_ctx, 0, weight_bytes_per_element=2, kv_bytes_per_element=2)
    edge_k = ref.decode_bytes(edge, edge_ctx, 1, weight_bytes_per_element=2, kv_bytes_per_element=2) - edge_w
    cases.append((edge, edge_ctx, float(ref.decode_flops(edge, edge_ctx, 1)), float(edge_k), 2, 2))
    # Batches exactly on the ridge, or a few ulps off it, where the closed form ceil(ridge * w / (f - ridge * k)) in
    # floats lands one off the smallest compute-bound batch: 1001 for 1000, 7 for 8, 2 for 1 (found by the mutation
    # runs' differential tests, issue 57). A boundary test must compare the integer batches themselves.
    llama2 = PRESETS["Llama-2-7B (MHA)"]
    cases += [(llama2, 16, 1.322254336e13, 7500023808.0, 0.5, 1), (llama2, 16, 92557803520.00002, 3333046272.0, 0.5, 1),
              (llama2, 128, 3349863629130.4463, 3.35e12, 2, 2)]
    # The smallest shape the contract allows: one layer of width 1, where f - ridge / k would be 0 (and ridge == k).
    tiny = ModelShape("width 1", n_layers=1, d_model=1, n_heads=1, n_kv_heads=1, head_dim=1, d_ff=1, vocab_size=1)
    cases.append((tiny, 0, 1e9, 1e9, 0.5, 1))
    for s, ctx, peak, bw, wb, kb in cases:
        expected = ref.critical_batch_size(s, ctx, peak, bw, weight_bytes_per_element=wb, kv_bytes_per_element=kb)
        what = (f"critical_batch_size({_describe(s)}, context_len={ctx}, peak_flops={peak!r}, bandwidth={bw!r}, "
                f"weight_bpe={wb}, kv_bpe={kb})")
        got = _call(critical_batch_size, s, ctx, peak, bw, wb, kb)
        if expected is None:
            if got is not None:
                raise AssertionError(f"{what}: expected None (no batch makes this decode step compute-bound: each "
                                     f"sequence's KV reads grow as fast as its FLOPs), got {got!r}. Check whether "
                                     "f <= ridge * k before dividing.")
            continue
        if got is None:
            raise AssertionError(f"{what}: expected {expected}, got None; a large enough batch does reach the ridge here.")
        ridge = ref.ridge_point(peak, bw)
        w = ref.decode_bytes(s, ctx, 0, weight_bytes_per_element=wb, kv_bytes_per_element=kb)
        f = ref.decode_flops(s, ctx, 1)
        k = ref.decode_bytes(s, ctx, 1, weight_bytes_per_element=wb, kv_bytes_per_element=kb) - w
        check_answer(got, expected, what, {
            expected - 1: "off by one: the smallest integer batch with intensity >= ridge (round up, do not truncate).",
            max(1, math.ceil(ridge * w / f)): "ignored the KV cache reads, which grow with the batch.",
            ref.critical_batch_size(s, 0, peak, bw, weight_bytes_per_element=wb, kv_bytes_per_element=kb) or -1:
                "ignored the context: each sequence's KV reads (and attention FLOPs) grow with context_len.",
            max(1, math.ceil(ridge * w / (f / 2 - ridge * k))) if f / 2 > ridge * k else -1: "FLOPs are 2 per multiply-add.",
            _old_rule_critical_batch(s, ctx, ridge, wb, kb):
                "counted the whole input-embedding table in W; a decode step reads one row per sequence "
                "(use your decode_bytes from exercise 5).",
        }, unit="sequences", reveal=True)
    _check_astronomical_critical_batch(critical_batch_size)


def _check_astronomical_critical_batch(critical_batch_size: Callable[..., int | None]) -> None:
    """A bandwidth a hair (4e-12) above the boundary's, where the smallest compute-bound batch is about 2.4e14: the
    closed form answers at once, a loop that climbs (or starts again from 1) one batch at a time never does. At
    that size one batch more changes B*f by less than a float's spacing, so any answer within 1e-6 counts."""
    s, ctx, peak, bw = PRESETS["Llama-3-8B"], 128, 15076425728.0, 16785408.00006202
    expected = ref.critical_batch_size(s, ctx, peak, bw, weight_bytes_per_element=2, kv_bytes_per_element=2)
    what = (f"critical_batch_size({_describe(s)}, context_len={ctx}, peak_flops={peak!r}, bandwidth={bw!r}, "
            "weight_bpe=2, kv_bpe=2)")
    try:
        got = _call(critical_batch_size, s, ctx, peak, bw, 2, 2, deadline=CRITICAL_BATCH_DEADLINE)
    except TimeoutError:
        raise AssertionError(f"{what} gave no answer within {CRITICAL_BATCH_DEADLINE:g} s; the answer is about "
                             f"{expected:.4g}. A loop that moves one batch at a time from a poor start never gets that "
                             "far: solve B*f >= ridge*(W + B*k) for B in closed form, then correct the float rounding "
                             "by a step or two.") from None
    if not isinstance(got, int) or isinstance(got, bool) or not within(abs(got - expected), 1e-6 * expected):
        raise AssertionError(f"{what}: expected an int batch of about {expected:.6g}, got {got!r}")


def _old_rule_critical_batch(s: ModelShape, ctx: int, ridge: float, wb: float, kb: int) -> int:
    """The critical batch when every stored weight (the whole embedding table too) counts as read: -1 if none."""
    f, k, w = ref.decode_flops(s, ctx, 1), ref.kv_cache_bytes(s, ctx, 1, kb), whole_table_bytes(s, wb)
    if f <= ridge * k:
        return -1
    b = max(1, math.ceil(ridge * w / (f - ridge * k)))
    while b > 1 and (b - 1) * f >= ridge * (w + (b - 1) * k):
        b -= 1
    while b * f < ridge * (w + b * k):
        b += 1
    return b


# ---------------------------------------------------------------- interview questions

Q1_CONTEXT, Q1_BATCH = 3000, 64


def check_q1_kv_gib(answer: float) -> None:
    """Q1: KV cache of Llama-3-8B holding 64 requests of 3,000 tokens in fp8 (1 byte), in GiB."""
    b = ref.kv_cache_bytes(PRESETS["Llama-3-8B"], Q1_CONTEXT, Q1_BATCH, 1)
    check_answer(answer, b / GiB, "Q1 (KV cache of 64 Llama-3-8B requests of 3,000 tokens, fp8, GiB)",
                 [(b / GB, "that is in GB (1e9 bytes); the question asks GiB (2**30 bytes)."), (b, "that is bytes; convert to GiB."),
                  (b / 2 / GiB, "forgot the factor 2 for K and V."), (b * 4 / GiB, "used the 32 query heads instead of the 8 KV heads."),
                  (b * 2 / GiB, "fp8 is 1 byte per element, not 2."), (b / Q1_BATCH / GiB, "that is one request; there are 64.")],
                 unit="GiB")


def _q2_counts() -> tuple[int, int]:
    s, g = PRESETS["Llama-3-70B"], ACCELERATORS["H200"]
    mha = dataclasses.replace(s, n_kv_heads=s.n_heads)
    kw = dict(weight_bytes_per_element=1, kv_bytes_per_element=2, memory_utilization=0.9)
    return (ref.max_concurrent_requests(s, 8192, g.memory_bytes, **kw),
            ref.max_concurrent_requests(mha, 8192, g.memory_bytes, **kw))


def check_q2_gqa_extra_requests(answer: int) -> None:
    """Q2: how many more 8192-token requests (bf16 KV) fit on one H200 (fp8 weights, utilization 0.9) with Llama-3-70B's
    GQA (8 KV heads) than with an MHA variant (64 KV heads, whose wk and wv grow with them)."""
    gqa, mha = _q2_counts()
    s, g = PRESETS["Llama-3-70B"], ACCELERATORS["H200"]
    free = int(g.memory_bytes * 0.9) - ref.weight_bytes(s, 1)
    mha_same_weights = free // ref.kv_cache_bytes(dataclasses.replace(s, n_kv_heads=s.n_heads), 8192, 1, 2)
    with quiet():
        check_answer(answer, gqa - mha, "Q2 (extra 8192-token requests thanks to GQA, Llama-3-70B on H200)",
                     [(gqa, "that is how many fit with GQA; subtract how many fit with MHA."),
                      (-(gqa - mha), "that is MHA minus GQA; GQA fits more."),
                      (gqa - mha_same_weights if mha_same_weights != mha else -1,
                          "the MHA variant's wk and wv are 8x wider too: its weights are larger (count them with "
                          "dataclasses.replace and your functions)."),
                      (gqa // max(mha, 1) if mha else -1, "that is a ratio; the question asks for a number of requests.")],
                     unit="requests")


def check_q3_critical_batch(answer: int) -> None:
    """Q3: Llama-3-70B with fp8 weight-only quantization (1-byte weights, matmuls at the bf16 peak), bf16 KV cache, on an
    H100 SXM, 4,096-token contexts: the smallest batch at which the step's WEIGHT MATMULS are compute-bound
    (context-independent: the lumped step at context 0)."""
    s, g = PRESETS["Llama-3-70B"], ACCELERATORS["H100-SXM"]
    bf16, bw = g.peak("bf16"), g.memory_bandwidth
    expected = ref.critical_batch_size(s, 0, bf16, bw, weight_bytes_per_element=1, kv_bytes_per_element=2)
    lumped = ref.critical_batch_size(s, 4096, bf16, bw, weight_bytes_per_element=1, kv_bytes_per_element=2)
    if answer is None and lumped is None:
        raise AssertionError("Q3 (critical batch of the weight matmuls): None is the lumped step's answer at 4,096 "
                             "tokens, where attention's cache reads dominate. The question asks about the weight "
                             "matmuls alone: which part of the step do they leave out?")
    with quiet():
        check_answer(answer, expected, "Q3 (critical batch of Llama-3-70B's fp8-weight matmuls on H100 SXM)",
                     [(expected - 1, "off by one: round up to the smallest batch that reaches the ridge."),
                      (lumped if lumped is not None else -1,
                          "that is the lumped step at 4,096 tokens; the weight matmuls read no KV cache."),
                      (ref.critical_batch_size(s, 0, g.peak("fp8"), bw, weight_bytes_per_element=1),
                          "weight-only fp8 stores 1-byte weights but multiplies at the bf16 peak (the weights are "
                          "converted back to bf16), not the fp8 peak."),
                      (ref.critical_batch_size(s, 0, bf16, bw),
                          "the weights are stored in fp8: 1 byte each is what the step reads."),
                      (math.ceil(g.ridge_point("bf16")), "that is the ridge point itself; with 2 FLOPs per weight and "
                                                         "1 byte per weight the batch is not the ridge. Use your functions.")],
                     unit="sequences")


def check_q4_tpot_ms(answer: float) -> None:
    """Q4: lower bound on ms per output token, Llama-3-70B, fp8 weights, bf16 KV, one H200 (fp8 peak), batch 1, 4096 tokens."""
    s, g = PRESETS["Llama-3-70B"], ACCELERATORS["H200"]
    t = ref.decode_step_time(s, 4096, 1, g.peak("fp8"), g.memory_bandwidth, weight_bytes_per_element=1,
                             kv_bytes_per_element=2)
    check_answer(answer, t * 1e3, "Q4 (ms per output token, Llama-3-70B fp8 on H200)",
                 [(t, "that is seconds; the question asks milliseconds."),
                  (ref.decode_step_time(s, 4096, 1, g.peak("bf16"), g.memory_bandwidth) * 1e3, "the weights are fp8: 1 byte each."),
                  ((whole_table_bytes(s, 1) + ref.kv_cache_bytes(s, 4096, 1, 2)) / g.memory_bandwidth * 1e3,
                   "counted the whole input-embedding table; a decode step looks up one row of it."),
                  (ref.weight_bytes_read(s, 1, 1) / g.memory_bandwidth * 1e3, "forgot the KV cache read.")],
                 unit="milliseconds")


def check_q5_max_requests(answer_bf16_kv: int, answer_fp8_kv: int) -> None:
    """Q5: concurrent 8192-token requests for Llama-3-8B (bf16 weights) on an H100 SXM at 90% memory, bf16 and fp8 KV."""
    s, g = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    for got, kb in ((answer_bf16_kv, 2), (answer_fp8_kv, 1)):
        expected = ref.max_concurrent_requests(s, 8192, g.memory_bytes, kv_bytes_per_element=kb)
        with quiet():
            check_answer(got, expected, f"Q5 (max requests, {'bf16' if kb == 2 else 'fp8'} KV cache)",
                         {ref.max_concurrent_requests(s, 8192, g.memory_bytes, kv_bytes_per_element=kb, memory_utilization=1.0):
                          "forgot the 90% memory utilization.",
                          int(g.memory_bytes * 0.9) // ref.kv_cache_bytes(s, 8192, 1, kb): "forgot to subtract the weights.",
                          ref.max_concurrent_requests(s, 8192, 80 * GiB, kv_bytes_per_element=kb):
                          "the question fixes the memory at the datasheet's 80 GB = 80e9 bytes (ACCELERATORS' "
                          "memory_bytes). A real H100 reports 81,559 MiB, nearer 80 GiB than 80e9 bytes, so your "
                          "figure is closer to a real card, but answer with the question's convention."}, unit="requests")


def check_q6_tokens_per_s(answer: float) -> None:
    """Q6: upper bound on generated tokens/s, Llama-3-8B bf16 on one L4 (bf16 peak), batch 16, 2048-token contexts."""
    s, g = PRESETS["Llama-3-8B"], ACCELERATORS["L4"]
    t = ref.decode_step_time(s, 2048, 16, g.peak("bf16"), g.memory_bandwidth)
    check_answer(answer, 16 / t, "Q6 (tokens/s, Llama-3-8B on L4, batch 16)",
                 [(1 / t, "that is steps per second; each step yields one token per sequence: multiply by the batch."),
                  (16 / ((16 * ref.weight_bytes_read(s, 1) + ref.kv_cache_bytes(s, 2048, 16, 2)) / g.memory_bandwidth),
                   "the weights are read once per step, not once per sequence."),
                  (16 * g.memory_bandwidth / (whole_table_bytes(s, 2) + ref.kv_cache_bytes(s, 2048, 16, 2)),
                   "counted the whole input-embedding table; a decode step looks up 16 rows of it.")], unit="tokens/s")


# Q7: one knob, Llama-3-8B bf16 on one H100 SXM, 8,192-token requests, vLLM-like defaults (0.9, bf16 weights and KV).
Q7_KNOBS = {1: "kv_cache_dtype='fp8'", 2: "gpu_memory_utilization=0.95", 3: "fp8 weights", 4: "max_num_seqs=512"}


def q7_requests() -> dict[int, int]:
    """Concurrent 8,192-token requests that each knob of Q7 allows (the others left at their defaults)."""
    s, mem = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"].memory_bytes
    base = ref.max_concurrent_requests(s, 8192, mem)
    return {1: ref.max_concurrent_requests(s, 8192, mem, kv_bytes_per_element=1),
            2: ref.max_concurrent_requests(s, 8192, mem, memory_utilization=0.95),
            3: ref.max_concurrent_requests(s, 8192, mem, weight_bytes_per_element=1),
            4: base}


def check_q7_knob(answer: int) -> None:
    """Q7: which single knob fits the most concurrent 8,192-token Llama-3-8B requests on one H100 SXM."""
    n = q7_requests()
    best = max(n, key=n.get)
    if answer not in Q7_KNOBS:
        raise AssertionError(f"Q7 (one serving knob): answer 1, 2, 3 or 4, got {answer!r}.")
    why = {1: f"an fp8 KV cache halves every request's cache: {n[1]} requests.",
           2: f"0.95 instead of 0.9 adds only 5% of memory ({0.05 * ACCELERATORS['H100-SXM'].memory_bytes / GB:.0f} GB): "
              f"{n[2]} requests.",
           3: f"fp8 weights free about {ref.weight_bytes(PRESETS['Llama-3-8B'], 1) / GB:.0f} GB once, but each request's "
              f"cache stays as large: {n[3]} requests.",
           4: f"max_num_seqs only caps the batch; it creates no memory: still {n[4]} requests."}
    with quiet():
        check_answer(answer, best, "Q7 (the knob that fits the most 8,192-token requests)",
                     {k: why[k] for k in Q7_KNOBS if k != best}, unit="knob number (1-4)")
