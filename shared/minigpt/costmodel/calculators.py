"""Inference arithmetic for Llama-style decoders: parameters, KV cache, FLOPs, bytes, roofline.

Pure functions of a model shape and a few numbers, so every figure in Lab 00 (and the interactive
calculators in `minigpt.teaching.widgets`) comes from one place and can be tested over its whole input range.

    shape = PRESETS["Llama-3-8B"]
    count_parameters(shape)                                   # 8_030_261_248
    kv_cache_bytes(shape, context_len=8192, batch=1, bytes_per_element=2)   # 2**30: 1 GiB
    decode_bytes(shape, context_len=8192, batch=8)            # weights once + 8 embedding rows + 8 caches

The cost model (the usual first-order one; it ignores activations, norms and softmax):

* A matmul with a (k x n) weight costs 2*k*n FLOP per token (a multiply and an add per weight).
  Per token: 2 * (linear weights in the layers + the output projection, vocab x d_model).
* Attention for one query over n keys: QK^T and PV, 2 * 2 * n_heads * head_dim * n FLOP per layer.
  Prefill of L tokens is causal: query i sees i keys, sum_i i = L(L+1)/2.
* Bytes: every weight that a matmul uses (the layers' projections and the output projection, which a tied
  model shares with the embedding) and every norm weight is read once per forward pass, whatever the batch.
  The input embedding is a table lookup: a pass reads one row of it per token, not the whole table (an
  untied Llama-3-8B's table is 1.05 GB of its 16.06 GB). The KV cache is written during prefill and read in
  full at every decode step (one cache per sequence).
* Per kernel: a decode step runs the weight matmuls (intensity grows with the batch) and attention over the
  cache (intensity fixed at about 2 * group size / KV bytes per element); `forward_kernels` splits any pass
  (decode step, prefill chunk, mixed batch) that way and `kernels_time` bounds each part by its own roofline and
  adds them: the one rule every cost model of the course uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minigpt.config import DRAFT_CONFIG, TARGET_CONFIG, ModelConfig

# Bytes per stored element. fp8 / int8 KV caches also keep small per-block scales, ignored here.
BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
GiB = 2**30
GB = 10**9


def bytes_per_element(precision: str) -> int:
    """Bytes of one stored number at `precision` ("fp32", "bf16", "fp16", "fp8", "int8")."""
    try:
        return BYTES_PER_ELEMENT[precision]
    except KeyError:
        raise KeyError(f"unknown precision {precision!r}; known: {sorted(BYTES_PER_ELEMENT)}") from None


@dataclass(frozen=True)
class ModelShape:
    """The shape facts of a Llama-style decoder (SwiGLU MLP, RMSNorm, no biases)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"ModelShape.{f} must be a positive int, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")

    @property
    def attention_kind(self) -> str:
        """"MHA" (one KV head per query head), "MQA" (one KV head) or "GQA" (in between)."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @classmethod
    def from_config(cls, config: ModelConfig, name: str) -> "ModelShape":
        return cls(name, config.n_layers, config.d_model, config.n_heads, config.n_kv_heads, config.head_dim,
                   config.d_ff, config.vocab_size, config.tie_embeddings)


# Shapes from the models' published config.json files (Hugging Face model cards):
# meta-llama/Meta-Llama-3-8B, meta-llama/Meta-Llama-3-70B, meta-llama/Llama-2-7b-hf.
PRESETS: dict[str, ModelShape] = {
    "Llama-3-8B": ModelShape("Llama-3-8B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                             d_ff=14336, vocab_size=128256),
    "Llama-3-70B": ModelShape("Llama-3-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128,
                              d_ff=28672, vocab_size=128256),
    "Llama-2-7B (MHA)": ModelShape("Llama-2-7B (MHA)", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32,
                                   head_dim=128, d_ff=11008, vocab_size=32000),
    # Not a released model: Llama-3-8B with multi-query attention (one KV head), to compare MQA/GQA/MHA.
    "Llama-3-8B-MQA (hypothetical)": ModelShape("Llama-3-8B-MQA (hypothetical)", n_layers=32, d_model=4096,
                                                n_heads=32, n_kv_heads=1, head_dim=128, d_ff=14336,
                                                vocab_size=128256),
    "minigpt-target": ModelShape.from_config(TARGET_CONFIG, "minigpt-target"),
    "minigpt-draft": ModelShape.from_config(DRAFT_CONFIG, "minigpt-draft"),
}


def get_preset(name: str) -> ModelShape:
    """PRESETS[name] with a clear error."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; known: {list(PRESETS)}") from None


def _check_nonneg_int(**values: int) -> None:
    for k, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{k} must be a non-negative int, got {v!r}")


# ---------------------------------------------------------------- parameters and KV cache

def layer_linear_parameters(shape: ModelShape) -> int:
    """Weights of the projections in one layer: wq, wk, wv, wo (attention) and gate, up, down (SwiGLU)."""
    d, q, kv = shape.d_model, shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    return d * q + 2 * d * kv + q * d + 3 * d * shape.d_ff


def count_parameters(shape: ModelShape) -> int:
    """All distinct parameters: embedding + layers (projections + 2 RMSNorm weights) + final norm + lm_head.

    A tied model uses the embedding matrix as its output projection, so it is counted once.
    """
    embed = shape.vocab_size * shape.d_model
    per_layer = layer_linear_parameters(shape) + 2 * shape.d_model
    lm_head = 0 if shape.tie_embeddings else embed
    return embed + shape.n_layers * per_layer + shape.d_model + lm_head


def matmul_parameters(shape: ModelShape) -> int:
    """Weights that take part in a matmul for each token: the layers' projections and the output projection.

    (The input embedding is a table lookup, no FLOPs; norm weights are elementwise.)
    """
    return shape.n_layers * layer_linear_parameters(shape) + shape.vocab_size * shape.d_model


def weight_bytes(shape: ModelShape, bytes_per_element: float = 2) -> int:
    """Bytes to store every parameter once (int4 = 0.5 bytes per element is allowed; rounded up)."""
    return math.ceil(count_parameters(shape) * bytes_per_element)


def weight_bytes_read(shape: ModelShape, tokens: int, bytes_per_element: float = 2) -> int:
    """Bytes of weights one forward pass over `tokens` token positions reads (rounded up).

    matmul weights (layers + output projection, d_model x vocab even when tied) + norm weights
    + one embedding row (d_model) per token: the lookup gathers rows, it does not stream the table.
    Untied: count_parameters - (vocab - tokens) * d_model. Tied: count_parameters + tokens * d_model
    (the output projection reads the whole shared matrix; the lookup reads its rows again).
    """
    _check_nonneg_int(tokens=tokens)
    norms = (2 * shape.n_layers + 1) * shape.d_model
    return math.ceil((matmul_parameters(shape) + norms + tokens * shape.d_model) * bytes_per_element)


def kv_bytes_per_token(shape: ModelShape, bytes_per_element: int = 2) -> int:
    """K and V, for every layer and KV head: 2 * n_layers * n_kv_heads * head_dim * bytes."""
    return 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * bytes_per_element


def kv_cache_bytes(shape: ModelShape, context_len: int, batch: int = 1, bytes_per_element: int = 2) -> int:
    """Bytes of the KV cache holding `context_len` tokens for each of `batch` sequences.

    2 (K and V) * n_layers * n_kv_heads * head_dim * context_len * batch * bytes_per_element.
    """
    _check_nonneg_int(context_len=context_len, batch=batch)
    return kv_bytes_per_token(shape, bytes_per_element) * context_len * batch


def max_concurrent_requests(shape: ModelShape, context_len: int, memory_bytes: int, *,
                            weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2,
                            memory_utilization: float = 0.9) -> int:
    """How many requests of `context_len` tokens fit next to the weights.

    usable = floor(memory_bytes * memory_utilization) (vLLM's gpu_memory_utilization: 0.92 by default in current
    releases, 0.9 before);
    requests = (usable - weights) // kv_cache_bytes(one request), and 0 if the weights alone do not fit.
    """
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
    _check_nonneg_int(memory_bytes=memory_bytes)
    free = int(memory_bytes * memory_utilization) - weight_bytes(shape, weight_bytes_per_element)
    per_request = kv_cache_bytes(shape, context_len, 1, kv_bytes_per_element)
    if free <= 0:
        return 0
    if per_request == 0:
        raise ValueError("context_len is 0: an empty request needs no KV cache, so any number fits")
    return free // per_request


# ---------------------------------------------------------------- FLOPs and bytes of one forward pass

def attention_flops(shape: ModelShape, n_queries_keys: int) -> int:
    """QK^T plus PV for `n_queries_keys` (query, key) pairs, all layers: 4 * n_heads * head_dim per pair."""
    return 4 * shape.n_layers * shape.n_heads * shape.head_dim * n_queries_keys


def prefill_flops(shape: ModelShape, seq_len: int, batch: int = 1) -> int:
    """FLOPs to prefill `seq_len` prompt tokens for each of `batch` sequences (causal attention).

    batch * (2 * matmul_parameters * L + 4 * n_layers * n_heads * head_dim * L(L+1)/2)
    """
    _check_nonneg_int(seq_len=seq_len, batch=batch)
    pairs = seq_len * (seq_len + 1) // 2
    return batch * (2 * matmul_parameters(shape) * seq_len + attention_flops(shape, pairs))


def decode_flops(shape: ModelShape, context_len: int, batch: int = 1) -> int:
    """FLOPs of one decode step: one new token per sequence, attending to `context_len` cached tokens.

    batch * (2 * matmul_parameters + 4 * n_layers * n_heads * head_dim * context_len)
    """
    _check_nonneg_int(context_len=context_len, batch=batch)
    return batch * (2 * matmul_parameters(shape) + attention_flops(shape, context_len))


def prefill_bytes(shape: ModelShape, seq_len: int, batch: int = 1,
                  weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> int:
    """Bytes moved by prefill: the weights a pass over batch * seq_len tokens reads + the prompt's KV cache written."""
    _check_nonneg_int(seq_len=seq_len, batch=batch)
    return (weight_bytes_read(shape, batch * seq_len, weight_bytes_per_element)
            + kv_cache_bytes(shape, seq_len, batch, kv_bytes_per_element))


def decode_bytes(shape: ModelShape, context_len: int, batch: int = 1,
                 weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> int:
    """Bytes moved by one decode step: the weights read ONCE (shared by the batch; `batch` embedding rows)
    + every sequence's KV cache."""
    _check_nonneg_int(context_len=context_len, batch=batch)
    return (weight_bytes_read(shape, batch, weight_bytes_per_element)
            + kv_cache_bytes(shape, context_len, batch, kv_bytes_per_element))


def forward_kernels(shape: ModelShape, rows: int, attention_pairs: int, kv_tokens: int, *,
                    weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> dict[str, tuple[int, int]]:
    """THE cost rule of the course: one forward pass (a decode step, a prefill chunk, or a mixed batch of both) as
    its two kinds of kernel, each (FLOPs, bytes). Every cost model (lab 00's calculators, lab 03's simulated GPU,
    lab 07's parallel plan, lab 09's chunked prefill) prices a pass with this function and `kernels_time`.

    "weights": the matmuls over `rows` token positions (with the lookup and norms that read weights):
        2 * matmul_parameters * rows FLOPs, weight_bytes_read(rows) bytes (each weight read once per pass).
    "attention": QK^T and PV over `attention_pairs` (query, key) pairs, reading or writing `kv_tokens` tokens' K/V:
        4 * n_layers * n_heads * head_dim * attention_pairs FLOPs, kv_tokens * kv_bytes_per_token bytes.

    A decode step of B sequences at context c: rows B, pairs B*c, kv_tokens B*c.
    A prefill chunk of n tokens after P cached: rows n, pairs n*P + n(n+1)/2, kv_tokens P + n (prefix read, chunk written).
    """
    _check_nonneg_int(rows=rows, attention_pairs=attention_pairs, kv_tokens=kv_tokens)
    return {"weights": (2 * matmul_parameters(shape) * rows, weight_bytes_read(shape, rows, weight_bytes_per_element)),
            "attention": (attention_flops(shape, attention_pairs), kv_tokens * kv_bytes_per_token(shape, kv_bytes_per_element))}


def decode_kernels(shape: ModelShape, context_len: int, batch: int = 1, *,
                   weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> dict[str, tuple[int, int]]:
    """One decode step split into its two kinds of kernel, each as (FLOPs, bytes): `forward_kernels` with
    rows = batch and batch * context_len (query, key) pairs and cached tokens. Their sums are decode_flops and
    decode_bytes."""
    _check_nonneg_int(context_len=context_len, batch=batch)
    return forward_kernels(shape, batch, batch * context_len, batch * context_len,
                           weight_bytes_per_element=weight_bytes_per_element, kv_bytes_per_element=kv_bytes_per_element)


# ---------------------------------------------------------------- roofline

def arithmetic_intensity(flops: float, n_bytes: float) -> float:
    """FLOP per byte moved."""
    if n_bytes <= 0:
        raise ValueError(f"bytes moved must be positive, got {n_bytes}")
    return flops / n_bytes


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Arithmetic intensity (FLOP/byte) above which a kernel is compute-bound: peak / bandwidth."""
    return peak_flops / bandwidth


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: min(peak, intensity * bandwidth) FLOP/s."""
    return min(peak_flops, intensity * bandwidth)


def time_lower_bound(flops: float, n_bytes: float, peak_flops: float, bandwidth: float) -> float:
    """Seconds, at least the larger of compute time and memory time: max(flops / peak, bytes / bandwidth)."""
    return max(flops / peak_flops, n_bytes / bandwidth)


def kernels_time(kernels: dict[str, tuple[int, int]], peak_flops: float, bandwidth: float) -> float:
    """Lower bound on the seconds of kernels that run one after another: sum of max(FLOPs / peak, bytes / bandwidth).

    Each kernel pays its own roofline; one lumped point, max(total FLOPs / peak, total bytes / bandwidth), would
    let attention's memory time hide the matmuls' compute time, which the hardware cannot do."""
    return sum(time_lower_bound(f, m, peak_flops, bandwidth) for f, m in kernels.values())


def decode_time_lower_bound(shape: ModelShape, context_len: int, batch: int, bandwidth: float, *,
                            weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> float:
    """Bandwidth-bound lower bound on the time per output token (one decode step): bytes / bandwidth."""
    return decode_bytes(shape, context_len, batch, weight_bytes_per_element=weight_bytes_per_element,
                        kv_bytes_per_element=kv_bytes_per_element) / bandwidth


def decode_step_time(shape: ModelShape, context_len: int, batch: int, peak_flops: float, bandwidth: float,
                     weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> float:
    """Lower bound on one decode step's seconds, kernel by kernel: `kernels_time` of `decode_kernels`."""
    return kernels_time(decode_kernels(shape, context_len, batch, weight_bytes_per_element=weight_bytes_per_element,
                                       kv_bytes_per_element=kv_bytes_per_element), peak_flops, bandwidth)


def decode_tokens_per_second(shape: ModelShape, context_len: int, batch: int, bandwidth: float, *,
                             weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> float:
    """Upper bound on generated tokens/s of the whole batch: batch / time per step."""
    return batch / decode_time_lower_bound(shape, context_len, batch, bandwidth,
                                           weight_bytes_per_element=weight_bytes_per_element,
                                           kv_bytes_per_element=kv_bytes_per_element)


def critical_batch_size(shape: ModelShape, context_len: int, peak_flops: float, bandwidth: float,
                        weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> int | None:
    """Smallest batch at which one decode step, taken as ONE roofline point, is compute-bound, or None if never.

    intensity(B) = B*f / (W + B*k) with f FLOPs and k bytes per sequence (its KV cache and its embedding row),
    W the weights every step reads. B*f >= R*(W + B*k)  <=>  B >= R*W / (f - R*k), possible only if f > R*k:
    at long contexts each sequence's attention alone sits below the ridge (about 2 * group_size / kv bytes
    FLOP per byte) and no batch is large enough. At context 0 the step is its weight matmuls alone, so
    critical_batch_size(shape, 0, ...) is where the weight matmuls turn compute-bound at ANY context.
    """
    ridge = ridge_point(peak_flops, bandwidth)
    kw = dict(weight_bytes_per_element=weight_bytes_per_element, kv_bytes_per_element=kv_bytes_per_element)
    f = decode_flops(shape, context_len, 1)
    w = weight_bytes_read(shape, 0, weight_bytes_per_element)
    k = decode_bytes(shape, context_len, 2, **kw) - decode_bytes(shape, context_len, 1, **kw)
    if f <= ridge * k:
        return None
    b = max(1, math.ceil(ridge * w / (f - ridge * k)))

    # Guard the float rounding at the boundary: return the exact smallest integer that qualifies.
    def bound(bb: int) -> bool:
        return decode_flops(shape, context_len, bb) >= ridge * decode_bytes(shape, context_len, bb, **kw)
    while b > 1 and bound(b - 1):
        b -= 1
    while not bound(b):
        b += 1
    return b


# ---------------------------------------------------------------- reports behind the widgets

@dataclass(frozen=True)
class MemoryPlan:
    """How one GPU's memory splits between weights and KV cache (all in bytes)."""

    memory_bytes: int
    usable_bytes: int
    weight_bytes: int
    kv_bytes: int             # for the requested batch
    kv_bytes_per_request: int
    max_requests: int

    @property
    def fits(self) -> bool:
        return self.weight_bytes + self.kv_bytes <= self.usable_bytes

    @property
    def free_bytes(self) -> int:
        """Usable memory left after weights and the batch's cache (negative when it does not fit)."""
        return self.usable_bytes - self.weight_bytes - self.kv_bytes

    @property
    def share_of_memory(self) -> float:
        """(weights + KV cache) / total memory."""
        return (self.weight_bytes + self.kv_bytes) / self.memory_bytes


def memory_plan(weight_bytes_total: int, kv_bytes_per_request: int, batch: int, memory_bytes: int,
                memory_utilization: float = 0.9) -> MemoryPlan:
    """Split `memory_bytes` into weights, the KV cache of `batch` requests, and what is left."""
    _check_nonneg_int(weight_bytes_total=weight_bytes_total, kv_bytes_per_request=kv_bytes_per_request, batch=batch)
    if memory_bytes <= 0:
        raise ValueError(f"memory_bytes must be positive, got {memory_bytes}")
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
    usable = int(memory_bytes * memory_utilization)
    free = usable - weight_bytes_total
    max_req = 0 if free <= 0 or kv_bytes_per_request == 0 else free // kv_bytes_per_request
    return MemoryPlan(memory_bytes, usable, weight_bytes_total, kv_bytes_per_request * batch,
                      kv_bytes_per_request, max_req)


@dataclass(frozen=True)
class RooflinePoint:
    """One phase (prefill or decode) placed on a roofline."""

    name: str
    flops: int
    bytes: int
    intensity: float           # FLOP / byte
    attainable: float          # FLOP/s the roofline allows at that intensity
    time_s: float              # max(compute time, memory time)
    compute_bound: bool
    tokens: int                # tokens produced or processed by this phase


def roofline_point(name: str, flops: int, n_bytes: int, tokens: int, peak: float, bandwidth: float,
                   kernels: dict[str, tuple[int, int]] | None = None) -> RooflinePoint:
    """The phase's lumped point (its place on the roofline plot) and its time: `kernels_time` of its kernels when
    given (the course's rule), else max(compute time, memory time) of the lumped point."""
    ai = arithmetic_intensity(flops, n_bytes)
    time_s = kernels_time(kernels, peak, bandwidth) if kernels else time_lower_bound(flops, n_bytes, peak, bandwidth)
    return RooflinePoint(name, flops, n_bytes, ai, attainable_flops(ai, peak, bandwidth), time_s,
                         ai >= ridge_point(peak, bandwidth), tokens)


def roofline_report(shape: ModelShape, peak: float, bandwidth: float, *, batch: int, seq_len: int,
                    weight_bytes_per_element: float = 2, kv_bytes_per_element: int = 2) -> dict[str, RooflinePoint]:
    """Prefill of `seq_len` tokens and one decode step at context `seq_len`, both at `batch`; times kernel by kernel."""
    kw = dict(weight_bytes_per_element=weight_bytes_per_element, kv_bytes_per_element=kv_bytes_per_element)
    prefill_kernels = forward_kernels(shape, batch * seq_len, batch * (seq_len * (seq_len + 1) // 2), batch * seq_len, **kw)
    return {
        "prefill": roofline_point("prefill", prefill_flops(shape, seq_len, batch),
                                  prefill_bytes(shape, seq_len, batch, **kw), batch * seq_len, peak, bandwidth,
                                  prefill_kernels),
        "decode": roofline_point("decode", decode_flops(shape, seq_len, batch),
                                 decode_bytes(shape, seq_len, batch, **kw), batch, peak, bandwidth,
                                 decode_kernels(shape, seq_len, batch, **kw)),
    }
