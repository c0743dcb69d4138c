"""Interview questions with fresh numbers, each drawn from a seeded `random.Random`.

    q = kv_cache_question(random.Random(3))
    print(q.text)                     # a published model shape, a context, a batch, a precision
    verdict = q.grade("2.5")          # Verdict(correct=False, message="... Likely mistake: ...")
    print(q.solution)                 # the worked solution with the numbers

Every expected value comes from the course's own calculators (`minigpt.costmodel.*`), the functions the labs
grade, so a question and the lab that teaches it can never disagree. Each family lists the wrong answers a
candidate is likely to give, with a diagnosis; `harness.check_answer` matches them, as in the labs' checks.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Callable

from autograder.harness import check_answer
from minigpt.costmodel.calculators import (GB, GiB, ModelShape, PRESETS, count_parameters, critical_batch_size,
                                          decode_bytes, decode_flops, decode_tokens_per_second, kv_bytes_per_token,
                                          kv_cache_bytes, weight_bytes, weight_bytes_read)
from minigpt.costmodel.hardware import ACCELERATORS, Accelerator
from minigpt.costmodel.offload import LINKS, load_seconds, recompute_seconds
from minigpt.costmodel.parallel_cost import tp_allreduce_bytes_per_token
from minigpt.costmodel.speculative_calculator import expected_tokens_per_round

# Published shapes (each model's config.json on its Hugging Face card). The course's PRESETS hold Llama-3-8B,
# Llama-3-70B and Llama-2-7B; the interview adds three more so the numbers vary.
MODELS: dict[str, ModelShape] = {
    "Llama-3-8B": PRESETS["Llama-3-8B"],
    "Llama-3-70B": PRESETS["Llama-3-70B"],
    "Llama-2-7B": PRESETS["Llama-2-7B (MHA)"],
    # meta-llama/Llama-3.2-1B and -3B: tied embeddings, GQA with 8 KV heads.
    "Llama-3.2-1B": ModelShape("Llama-3.2-1B", n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, head_dim=64,
                               d_ff=8192, vocab_size=128256, tie_embeddings=True),
    "Llama-3.2-3B": ModelShape("Llama-3.2-3B", n_layers=28, d_model=3072, n_heads=24, n_kv_heads=8, head_dim=128,
                               d_ff=8192, vocab_size=128256, tie_embeddings=True),
    # mistralai/Mistral-7B-v0.1 (its sliding window does not change these full-attention figures).
    "Mistral-7B": ModelShape("Mistral-7B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                             d_ff=14336, vocab_size=32000),
}
GPUS: dict[str, Accelerator] = {name: ACCELERATORS[name] for name in
                                ("H100-SXM", "H200", "A100-SXM-80GB", "L4", "RTX-4090")}
ELEMENT_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Verdict:
    """The grade of one answer: right or not, and what to tell the candidate."""

    correct: bool
    message: str


@dataclass(frozen=True)
class NumericQuestion:
    """A question answered with one number in `unit`; `mistakes` pairs a likely wrong value with its diagnosis."""

    topic: str
    lab: str
    text: str
    expected: float | int
    unit: str
    mistakes: tuple[tuple[float, str], ...]
    solution: str
    rel: float = 0.01          # interview answers are rounded by hand: 1% unless the answer is an exact count

    def grade(self, answer: str | float | int) -> Verdict:
        """Grade a typed answer ("2.5", "2.5 GiB", "1,024") or a number; never raises."""
        value = parse_number(answer) if isinstance(answer, str) else answer
        if value is None:
            return Verdict(False, f"could not read a number from {answer!r}; answer in {self.unit}")
        try:
            check_answer(value, self.expected, self.topic, self.mistakes, unit=self.unit, rel=self.rel)
        except AssertionError as err:
            return Verdict(False, str(err))
        return Verdict(True, f"{_fmt(self.expected)} {self.unit}.")


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def parse_number(text: str) -> int | float | None:
    """The first number in `text` ("1,024 blocks" -> 1024, "2.5 GiB" -> 2.5, "3e9" -> 3e9); an int when it has
    no decimal point or exponent; None when there is none."""
    match = _NUMBER.search(text.replace(",", "").replace("_", ""))
    if match is None:
        return None
    token = match.group()
    return float(token) if any(c in token for c in ".eE") else int(token)


def _fmt(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.4g}"


def _question(topic: str, lab: str, text: str, expected: float | int, unit: str,
              mistakes: list[tuple[float, str]], solution: str, rel: float = 0.01) -> NumericQuestion:
    """Drop mistakes that cannot be told from the right answer (they would be accepted anyway)."""
    tol = max(rel, 1e-3)
    kept = tuple((float(v), msg) for v, msg in mistakes
                 if math.isfinite(v) and not math.isclose(v, expected, rel_tol=tol))
    return NumericQuestion(topic, lab, text, expected, unit, kept, solution, rel)


def _pick(rng: random.Random, names: dict) -> str:
    return rng.choice(sorted(names))


def _fits(shape: ModelShape, gpu: Accelerator, context: int, batch: int, kv_bytes: int = 2) -> bool:
    """Weights (bf16) and the batch's KV cache fit in 90% of the GPU's memory."""
    need = weight_bytes(shape, 2) + kv_cache_bytes(shape, context, batch, kv_bytes)
    return need <= 0.9 * gpu.memory_bytes


def _model_and_gpu(rng: random.Random, context: int, batch: int) -> tuple[ModelShape, Accelerator]:
    """A (model, GPU) pair on which the model and the batch's cache fit in one GPU."""
    pairs = [(m, g) for m in sorted(MODELS) for g in sorted(GPUS)
             if _fits(MODELS[m], GPUS[g], context, batch)]
    m, g = rng.choice(pairs)
    return MODELS[m], GPUS[g]


# ---------------------------------------------------------------------------------------------- families

def kv_cache_question(rng: random.Random) -> NumericQuestion:
    """KV cache of a published model for a context, a batch and a KV precision, in GiB (lab 00)."""
    shape = MODELS[_pick(rng, MODELS)]
    context = rng.choice([2048, 4096, 8192, 16384, 32768, 131072])
    batch = rng.choice([1, 1, 4, 8, 16, 32])
    precision = rng.choice(["bf16", "bf16", "fp8"])
    b = ELEMENT_BYTES[precision]
    n = kv_cache_bytes(shape, context, batch, b)
    text = (f"{shape.name} ({shape.n_layers} layers, {shape.n_heads} query heads, {shape.n_kv_heads} KV heads, "
            f"head_dim {shape.head_dim}) serves {batch} sequence(s) of {context:,} tokens with a {precision} KV "
            f"cache. How large is the KV cache, in GiB?")
    mistakes = [(n / GB, "that is in GB (10^9 bytes); the question asks GiB (2^30 bytes)."),
                (n, "that is bytes; divide by 2^30 for GiB."),
                (n / 2 / GiB, "forgot the factor 2 for K and V."),
                (n / shape.n_layers / GiB, "that is one layer; every layer keeps its own K and V."),
                (n * shape.n_heads // shape.n_kv_heads / GiB,
                 f"used the {shape.n_heads} query heads; the cache holds the {shape.n_kv_heads} KV heads."),
                (n * 2 / GiB, f"{precision} stores {b} byte(s) per element."),
                (n / batch / GiB, f"that is one sequence; there are {batch}.")]
    solution = (f"2 (K and V) x {shape.n_layers} layers x {shape.n_kv_heads} KV heads x {shape.head_dim} x "
                f"{context:,} tokens x {batch} x {b} byte(s) = {n:,} bytes = {n / GiB:.4g} GiB.")
    return _question("KV cache size", "00", text, n / GiB, "GiB", mistakes, solution)


def decode_speed_question(rng: random.Random) -> NumericQuestion:
    """Bandwidth-bound decode tokens/s for a model, GPU, context and batch, bf16 (lab 00)."""
    context = rng.choice([1024, 2048, 4096, 8192])
    batch = rng.choice([1, 1, 8, 32])
    shape, gpu = _model_and_gpu(rng, context, batch)
    bw = gpu.memory_bandwidth
    want = decode_tokens_per_second(shape, context, batch, bw)
    w, kv = weight_bytes_read(shape, batch, 2), kv_cache_bytes(shape, context, batch, 2)
    tied = "tied: its output projection is the embedding matrix" if shape.tie_embeddings else "untied"
    text = (f"{shape.name} in bf16 ({count_parameters(shape):,} parameters, {shape.vocab_size:,} x {shape.d_model} "
            f"embedding, {tied}) decodes a batch of {batch} at context {context:,} on one {gpu.name} "
            f"({bw / 1e12:.4g} TB/s). Assuming each step reads once every weight a matmul or a norm uses, one "
            "embedding row per sequence for the lookup, and every sequence's KV cache (bf16), and nothing else "
            "limits it, what is the most tokens/s the batch can generate in total?")
    whole_table = weight_bytes(shape, 2) + (2 * batch * shape.d_model if shape.tie_embeddings else 0)
    mistakes = [(batch * bw / w, "left out the KV cache: every step also reads each sequence's cache."),
                (batch * bw / (weight_bytes(shape, 2) + kv) if not shape.tie_embeddings else -1.0,
                 "counted the whole input-embedding table; the lookup reads one row per sequence."),
                (batch * bw / (whole_table - 2 * shape.vocab_size * shape.d_model + kv) if shape.tie_embeddings else -1.0,
                 "the model is tied: its output projection still multiplies by the whole embedding matrix."),
                (batch * bw / (2 * w + kv), "weights in bf16 are 2 bytes each, not 4."),
                (batch * bw / (batch * w + kv), "the weights are read once per step for the whole batch, not "
                                               "once per sequence."),
                (batch * gpu.peak("bf16") / decode_flops(shape, context, batch),
                 "that is the compute bound; decode at this batch is limited by memory bandwidth."),
                (want / batch, "that is per sequence; the question asks the batch's total.")]
    solution = (f"bytes per step = weights read {w:,} (matmul and norm weights, plus {batch} embedding row(s)) + KV "
                f"{kv:,} = {w + kv:,}; step >= {w + kv:,} / {bw:.4g} B/s = "
                f"{(w + kv) / bw * 1e3:.4g} ms; {batch} token(s) per step -> {want:,.4g} tokens/s.")
    return _question("Decode tokens/s (memory-bound)", "00", text, want, "tokens/s", mistakes, solution)


def critical_batch_question(rng: random.Random) -> NumericQuestion:
    """Smallest decode batch that is compute-bound at a given context (lab 00/03's roofline)."""
    while True:
        context = rng.choice([0, 0, 256, 512, 1024])
        shape, gpu = _model_and_gpu(rng, context, 1)
        peak, bw = gpu.peak("bf16"), gpu.memory_bandwidth
        want = critical_batch_size(shape, context, peak, bw)
        if want is not None and _fits(shape, gpu, context, want):
            break
    ridge = peak / bw
    mistakes = [(want - 1, "off by one: the smallest batch that reaches the ridge, rounded up."),
                (math.ceil(ridge), "that is the ridge point itself in FLOP/byte, not the batch: norm weights and "
                                   "looked-up embedding rows are read without FLOPs, and the KV cache adds bytes."),
                (critical_batch_size(shape, 0, peak, bw) or -1,
                 "that ignores the KV cache; each sequence's cache adds bytes that no other sequence shares.")]
    fp8 = critical_batch_size(shape, context, gpu.peak("fp8"), bw) if "fp8" in gpu.peak_flops else None
    if fp8:
        mistakes.append((fp8, "that uses the fp8 peak; the model runs in bf16."))
    f, w = decode_flops(shape, context, 1), weight_bytes_read(shape, 0, 2)
    k = decode_bytes(shape, context, 1) - w
    old_w, old_k = weight_bytes(shape, 2), kv_cache_bytes(shape, context, 1, 2)
    if not shape.tie_embeddings and f > ridge * old_k:
        old = max(1, math.ceil(ridge * old_w / (f - ridge * old_k)))
        mistakes.append((old, "counted the whole input-embedding table in the weights; the lookup reads one row "
                              "per sequence."))
    text = (f"{shape.name} decodes in bf16 on an {gpu.name} ({peak / 1e12:.4g} dense bf16 TFLOP/s, "
            f"{bw / 1e12:.4g} TB/s) with every sequence at context {context:,}. Counting 2 FLOPs per matmul "
            "weight per token plus attention, and bytes as every matmul and norm weight once per step, one "
            "embedding row and the KV cache per sequence, and the whole step as one roofline point, what is the "
            "smallest batch at which one decode step is compute-bound?")
    solution = (f"per sequence f = {f:,} FLOP and k = {k:,} bytes (KV cache and embedding row); weights W = {w:,} "
                f"bytes; ridge "
                f"R = {ridge:.4g} FLOP/byte. B*f >= R*(W + B*k)  <=>  B >= R*W / (f - R*k) -> B = {want}.")
    return _question("Critical batch (roofline)", "00", text, want, "sequences", mistakes, solution)


def speculative_question(rng: random.Random) -> NumericQuestion:
    """Expected tokens per speculative round for acceptance rate alpha and k drafts (lab 06)."""
    alpha = rng.choice([0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9])
    k = rng.randint(2, 8)
    want = expected_tokens_per_round(alpha, k)
    text = (f"A draft model proposes k = {k} tokens per round and each is accepted independently with "
            f"probability {alpha} (a rejection ends the round). Counting the token the target always adds "
            "(the resampled one after a rejection, or the bonus token when all are accepted), how many tokens "
            "does one round produce on average?")
    mistakes = [(want - 1, "that counts the accepted drafts only; every round also adds one target token."),
                (expected_tokens_per_round(alpha, k - 1), "off by one: the sum a^i for i = 0..k has k + 1 terms."),
                (alpha * k + 1, "drafts count only while no earlier one was rejected: not a * k."),
                (k + 1, "that assumes every draft is accepted."),
                (1 / (1 - alpha), "that is the limit for unbounded k; the round stops after k drafts.")]
    solution = f"E = sum_{{i=0..{k}}} {alpha}^i = (1 - {alpha}^{k + 1}) / (1 - {alpha}) = {want:.4g} tokens."
    return _question("Speculative tokens per round", "06", text, want, "tokens", mistakes, solution)


def tp_bytes_question(rng: random.Random) -> NumericQuestion:
    """Bytes each GPU sends for the tensor-parallel all-reduces of one token (lab 07)."""
    shape = MODELS[_pick(rng, MODELS)]
    tp = rng.choice([2, 4, 8])
    want = round(tp_allreduce_bytes_per_token(shape, tp, 2))
    payload = 2 * shape.n_layers * shape.d_model * 2
    text = (f"{shape.name} ({shape.n_layers} layers, d_model {shape.d_model}) runs with tensor parallelism "
            f"TP = {tp} in bf16, Megatron-style (one all-reduce after attention and one after the MLP in every "
            "layer), each all-reduce a ring. How many bytes does each GPU send for the all-reduces of one "
            "generated token?")
    mistakes = [(payload, "that is the payload; a ring all-reduce sends 2(n-1)/n of it from each GPU."),
                (want / 2, "that is half: either one all-reduce per layer (there are two, after attention and "
                           "after the MLP), or the factor (n-1)/n of an all-gather (an all-reduce is a "
                           "reduce-scatter plus an all-gather: 2(n-1)/n)."),
                (want * 2, "bf16 activations are 2 bytes per element.")]
    solution = (f"payload = 2 all-reduces x {shape.n_layers} layers x {shape.d_model} x 2 bytes = {payload:,}; "
                f"ring factor 2(n-1)/n = {2 * (tp - 1) / tp:.4g}; sent per GPU = {want:,} bytes.")
    return _question("TP all-reduce bytes per token", "07", text, want, "bytes", mistakes, solution)


def paged_capacity_question(rng: random.Random) -> NumericQuestion:
    """Requests of L tokens that fit in a paged KV pool next to the weights (lab 02)."""
    block = rng.choice([16, 16, 32])
    length = rng.randrange(300, 6000)
    if length % block == 0:
        length += 1
    shape, gpu = _model_and_gpu(rng, length, 1)
    usable = int(gpu.memory_bytes * 0.9)
    w = weight_bytes(shape, 2)
    per_token = kv_bytes_per_token(shape, 2)
    per_request = math.ceil(length / block) * block * per_token
    want = (usable - w) // per_request
    text = (f"{shape.name} in bf16 ({w:,} bytes of weights) is served on one {gpu.name} with "
            f"{gpu.memory_bytes:,} bytes of memory, 90% of it usable (vLLM's gpu_memory_utilization), a bf16 "
            f"paged KV cache in blocks of {block} tokens, and every request holding {length:,} tokens. How many "
            "requests fit at once?")
    mistakes = [((usable - w) // (length * per_token), f"a request holds whole blocks: round {length:,} up to a "
                                                       f"multiple of {block}."),
                ((gpu.memory_bytes - w) // per_request, "only 90% of the memory is usable."),
                (usable // per_request, "the weights take their share of the memory first."),
                ((usable - w) // (per_request // 2), "forgot the factor 2 for K and V.")]
    solution = (f"free = 0.9 x {gpu.memory_bytes:,} - {w:,} = {usable - w:,} bytes; per request "
                f"ceil({length:,}/{block}) x {block} tokens x {per_token:,} B/token = {per_request:,} bytes; "
                f"{usable - w:,} // {per_request:,} = {want} requests.")
    return _question("Paged KV capacity", "02", text, int(want), "requests", mistakes, solution)


def quantized_weights_question(rng: random.Random) -> NumericQuestion:
    """Bytes of a model's weights at int4 with one bf16 scale per group (lab 05)."""
    shape = MODELS[_pick(rng, MODELS)]
    group = rng.choice([32, 64, 128])
    params = count_parameters(shape)
    bits = 4 + 16 / group
    want = params * bits / 8 / GB
    text = (f"{shape.name} has {params:,} parameters. Quantized to int4 with one bf16 scale per group of {group} "
            "weights (no zero points; every parameter quantized, for simplicity), how many GB (10^9 bytes) do "
            "its weights take?")
    mistakes = [(params * 0.5 / GB, "left out the scales: one bf16 scale per group adds 16/group bits per weight."),
                (params * bits / 8 / GiB, "that is GiB; the question asks GB (10^9 bytes)."),
                (params * 2 / GB, "that is the bf16 model."),
                (params * (4 + 32 / group) / 8 / GB, "the scales are bf16 (16 bits), not fp32."),
                (params * 4 / GB, "4 bits is half a byte, not 4 bytes.")]
    solution = (f"bits per weight = 4 + 16/{group} = {bits:.4g}; {params:,} x {bits:.4g} / 8 = "
                f"{params * bits / 8:,.0f} bytes = {want:.4g} GB.")
    return _question("Quantized weight bytes", "05", text, want, "GB", mistakes, solution)


def offload_question(rng: random.Random) -> NumericQuestion:
    """Recompute time over load time for a cached prefix kept in a slower tier (lab 13)."""
    shape, gpu = MODELS[_pick(rng, MODELS)], GPUS[_pick(rng, GPUS)]
    link_name = _pick(rng, LINKS)
    link = LINKS[link_name]
    tokens = rng.choice([512, 1024, 2048, 4096, 8192])
    mfu = rng.choice([0.4, 0.5, 0.6])
    want = recompute_seconds(shape, tokens, gpu, mfu=mfu) / load_seconds(shape, tokens, link)
    per_token = kv_bytes_per_token(shape, 2)
    text = (f"{shape.name} ({shape.n_layers} layers, {shape.n_kv_heads} KV heads of {shape.head_dim}) serves in "
            f"bf16 on one {gpu.name} ({gpu.peak('bf16') / 1e12:,.0f} TFLOP/s bf16 peak), its prefill at {mfu} of that "
            f"peak. An evicted {tokens:,}-token prefix waits behind {link_name} ({link.bandwidth / 1e9:.3g} GB/s, "
            f"{link.latency * 1e6:g} us a transfer). Recompute time over load time? (Prefill FLOPs as lab 00 counts "
            "them, attention included; above 1, loading wins.)")
    load = load_seconds(shape, tokens, link)
    k_only = link.latency + tokens * per_token / 2 / link.bandwidth
    mistakes = [(recompute_seconds(shape, tokens, gpu, mfu=mfu) / k_only,
                 "the cache holds K AND V: 2 x layers x KV heads x head_dim x 2 bytes a token."),
                (recompute_seconds(shape, tokens, gpu, mfu=1.0) / load, f"the prefill runs at {mfu} of the peak."),
                (1 / want, "the question asks recompute / load.")]
    solution = (f"KV = {per_token:,} B/token; load = {link.latency * 1e6:g} us + {tokens:,} x {per_token:,} B / "
                f"{link.bandwidth / 1e9:.3g} GB/s = {load * 1e3:.4g} ms; recompute = prefill FLOPs / "
                f"({gpu.peak('bf16') / 1e12:,.0f} TFLOP/s x {mfu}) = "
                f"{recompute_seconds(shape, tokens, gpu, mfu=mfu) * 1e3:.4g} ms; ratio {want:.4g}.")
    return _question("Offload or recompute a cached prefix", "13", text, want, "x", mistakes, solution)


FAMILIES: dict[str, Callable[[random.Random], NumericQuestion]] = {
    "kv-cache": kv_cache_question,
    "decode-speed": decode_speed_question,
    "critical-batch": critical_batch_question,
    "speculative": speculative_question,
    "tp-bytes": tp_bytes_question,
    "paged-capacity": paged_capacity_question,
    "quantized-weights": quantized_weights_question,
    "offload": offload_question,
}
