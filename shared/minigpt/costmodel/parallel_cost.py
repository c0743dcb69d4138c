"""A first-order cost model of tensor and pipeline parallelism for decoding (lab 07).

    plan = parallel_plan(PRESETS["Llama-3-70B"], ACCELERATORS["H100-SXM"], INTERCONNECTS["NVLink 4"], tp=8)
    plan.time_per_token_s, plan.memory_per_gpu_bytes, plan.tp_bytes_per_token, plan.fits

Per decode step of a batch of B sequences with `context_len` cached tokens, on tp * pp GPUs:

* Memory per GPU (the fullest pipeline stage): its n_layers/pp layers with 1/tp of every split weight
  (the KV projections once per local KV head: a head replicated when tp > n_kv_heads), replicated
  norms, and 1/tp of the embedding and/or LM head (vocabulary-parallel) on the first/last stage;
  plus its KV cache: 2 * layers/pp * local KV heads * head_dim * context * B * bytes.
* Compute, on lab 00's rule (`calculators.kernels_time`): each stage's GPU runs its weight matmuls (2 FLOPs
  per local weight per sequence; the weights it reads once per step: its layers' shards, the LM head's shard on
  the last stage, B embedding rows on the first, not the whole table) and its attention (its local query heads'
  FLOPs; its KV cache read), each kernel at max(FLOPs / peak, bytes / HBM bandwidth), the two added.
  A token runs through every stage in turn, so compute per token is the sum over the stages.
* Tensor-parallel communication: 2 all-reduces per layer of B * d_model * bytes (the layer's output).
  A ring all-reduce on n GPUs takes 2(n - 1) steps, each a latency alpha plus payload/n bytes over the
  link: t = 2(n - 1) * alpha + 2(n - 1)/n * payload / link_bandwidth.
  Without overlap it adds to compute; with perfect overlap a stage takes max(compute, communication).
* Pipeline: a token crosses pp - 1 stage boundaries (a send of B * d_model * bytes each); one token
  still runs every layer in sequence, so PP adds latency and memory headroom, never per-token speed.
  With m micro-batches the pipeline idles a bubble fraction (pp - 1) / (m + pp - 1) of the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minigpt.costmodel import calculators as calc
from minigpt.costmodel.calculators import ModelShape
from minigpt.costmodel.hardware import Accelerator

__all__ = ["Interconnect", "INTERCONNECTS", "pcie_bandwidth", "ring_allreduce_time", "tp_allreduce_bytes_per_token",
           "pipeline_bubble_fraction", "gpu_weight_bytes", "gpu_kv_bytes", "stage_kernels", "ParallelPlan", "parallel_plan"]


def pcie_bandwidth(gigatransfers_per_s: float, lanes: int) -> float:
    """Bytes/s one way over PCIe Gen 3+ (128b/130b encoding): GT/s * lanes * 128/130 / 8."""
    return gigatransfers_per_s * 1e9 * lanes * 128 / 130 / 8


@dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU link: bytes/s one way per GPU, and the latency of one ring step (an assumption)."""

    name: str
    bandwidth: float           # bytes/s, one direction, per GPU
    step_latency_s: float      # alpha: fixed cost of one send in a ring collective
    source: str


# Bandwidths from the specifications; the per-step latencies are assumed round figures of the order NCCL
# shows for small messages (a few microseconds), not datasheet numbers: change them and see.
INTERCONNECTS: dict[str, Interconnect] = {
    "NVLink 4": Interconnect("NVLink 4", 900e9 / 2, 2e-6,
                             "H100 SXM datasheet: NVLink 900 GB/s total (both directions), so 450 GB/s one way; "
                             "latency assumed"),
    "PCIe Gen5 x16": Interconnect("PCIe Gen5 x16", pcie_bandwidth(32, 16), 8e-6,
                                  "PCIe 5.0: 32 GT/s per lane, 16 lanes, 128b/130b encoding; latency assumed"),
}


def ring_allreduce_time(payload_bytes: float, n: int, link: Interconnect) -> float:
    """Seconds for one ring all-reduce of `payload_bytes` over n GPUs: 2(n-1) * alpha + 2(n-1)/n * payload / bw."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.step_latency_s + 2 * (n - 1) / n * payload_bytes / link.bandwidth


def tp_allreduce_bytes_per_token(shape: ModelShape, tp: int, bytes_per_element: int = 2, *, wire: bool = True) -> float:
    """Bytes of the tensor-parallel all-reduces for one token: 2 * n_layers * d_model * bytes,
    times the ring factor 2(tp-1)/tp when `wire` (what each GPU sends). Zero for tp = 1."""
    payload = 2 * shape.n_layers * shape.d_model * bytes_per_element
    if tp <= 1:
        return 0 if wire else payload
    return payload * 2 * (tp - 1) / tp if wire else payload


def pipeline_bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle share of a pipeline's time with `micro_batches` micro-batches: (p - 1) / (m + p - 1)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages and micro_batches must be >= 1, got {stages}, {micro_batches}")
    return (stages - 1) / (micro_batches + stages - 1)


def _check_split(shape: ModelShape, tp: int, pp: int) -> None:
    if tp < 1 or pp < 1:
        raise ValueError(f"tp and pp must be >= 1, got tp={tp}, pp={pp}")
    if shape.n_heads % tp:
        raise ValueError(f"tp={tp} does not divide {shape.name}'s {shape.n_heads} query heads")
    if shape.n_kv_heads % tp and tp % shape.n_kv_heads:
        raise ValueError(f"tp={tp} and {shape.n_kv_heads} KV heads: one must divide the other")
    if shape.n_layers % pp:
        raise ValueError(f"pp={pp} does not divide {shape.name}'s {shape.n_layers} layers")


def local_kv_heads(shape: ModelShape, tp: int) -> int:
    """KV heads each rank holds: n_kv_heads / tp, or 1 (replicated) when tp > n_kv_heads."""
    return max(1, shape.n_kv_heads // tp)


def _local_layer_weights(shape: ModelShape, tp: int) -> int:
    """Projection weights of one layer on one rank: 1/tp of wq, wo, gate, up, down; wk, wv per local KV head."""
    d, hd = shape.d_model, shape.head_dim
    return (2 * d * shape.n_heads * hd // tp            # wq, wo
            + 2 * d * local_kv_heads(shape, tp) * hd    # wk, wv (replicated heads counted per copy)
            + 3 * d * shape.d_ff // tp)                 # gate, up, down


def gpu_weight_bytes(shape: ModelShape, tp: int, pp: int = 1, bytes_per_element: float = 2) -> int:
    """Weight bytes STORED on the fullest GPU (see the module docstring): memory, not what a step reads."""
    _check_split(shape, tp, pp)
    d = shape.d_model
    per_layer = _local_layer_weights(shape, tp) + 2 * d                  # + the two RMSNorm weights, replicated
    vocab = shape.vocab_size * d // tp
    ends = vocab if (shape.tie_embeddings or pp > 1) else 2 * vocab       # embedding and LM head on one stage?
    params = shape.n_layers // pp * per_layer + ends + d
    return math.ceil(params * bytes_per_element)


def stage_kernels(shape: ModelShape, tp: int, pp: int, stage: int, context_len: int, batch: int,
                  bytes_per_element: float = 2) -> dict[str, tuple[int, int]]:
    """One GPU of pipeline stage `stage` (0 .. pp-1) in a decode step, as lab 00's two kernels (FLOPs, bytes).

    weights: 2 * batch * (layers/pp * local layer weights + vocab * d_model / tp on the last stage) FLOPs;
             bytes read once: those weights, the replicated norms, and batch embedding rows on the first stage.
    attention: 4 * layers/pp * (n_heads/tp) * head_dim * context * batch FLOPs; the rank's KV cache (gpu_kv_bytes).
    With tp = pp = 1 this is `calculators.decode_kernels`.
    """
    _check_split(shape, tp, pp)
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in 0..{pp - 1}, got {stage}")
    d, layers, last = shape.d_model, shape.n_layers // pp, stage == pp - 1
    matmul = layers * _local_layer_weights(shape, tp) + (shape.vocab_size * d // tp if last else 0)
    read = matmul + 2 * layers * d + (d if last else 0) + (batch * d if stage == 0 else 0)
    attention_flops = 4 * layers * (shape.n_heads // tp) * shape.head_dim * context_len * batch
    return {"weights": (2 * matmul * batch, math.ceil(read * bytes_per_element)),
            "attention": (attention_flops, gpu_kv_bytes(shape, tp, pp, context_len, batch, int(bytes_per_element)))}


def gpu_kv_bytes(shape: ModelShape, tp: int, pp: int, context_len: int, batch: int, bytes_per_element: int = 2) -> int:
    """KV-cache bytes on one GPU: 2 * (n_layers/pp) * local KV heads * head_dim * context * batch * bytes."""
    _check_split(shape, tp, pp)
    return 2 * (shape.n_layers // pp) * local_kv_heads(shape, tp) * shape.head_dim * context_len * batch * bytes_per_element


@dataclass(frozen=True)
class ParallelPlan:
    tp: int
    pp: int
    memory_per_gpu_bytes: int
    weight_bytes_per_gpu: int
    kv_bytes_per_gpu: int
    fits: bool
    compute_s: float               # per token, all stages, no communication
    tp_comm_s: float               # per token, all stages: the all-reduces
    pp_comm_s: float               # per token: the sends between stages
    time_per_token_s: float        # what one sequence waits per generated token
    tp_bytes_per_token: float      # what each GPU sends for the all-reduces (ring), per decode step
    pp_bytes_per_token: float      # activations sent between stages, per decode step (all boundaries)
    overlap: bool


def parallel_plan(shape: ModelShape, gpu: Accelerator, link: Interconnect, *, tp: int, pp: int = 1,
                  context_len: int = 4096, batch: int = 1, bytes_per_element: int = 2, overlap: bool = False,
                  memory_utilization: float = 0.9, precision: str = "bf16") -> ParallelPlan:
    """Time per token and memory per GPU of a decode step on tp * pp GPUs (see the module docstring)."""
    _check_split(shape, tp, pp)
    weights = gpu_weight_bytes(shape, tp, pp, bytes_per_element)
    kv = gpu_kv_bytes(shape, tp, pp, context_len, batch, bytes_per_element)
    peak, bandwidth = gpu.peak(precision), gpu.memory_bandwidth
    stage_compute = [calc.kernels_time(stage_kernels(shape, tp, pp, i, context_len, batch, bytes_per_element),
                                       peak, bandwidth) for i in range(pp)]
    payload = batch * shape.d_model * bytes_per_element
    stage_comm = 2 * (shape.n_layers // pp) * ring_allreduce_time(payload, tp, link)
    stages = [max(t, stage_comm) if overlap else t + stage_comm for t in stage_compute]
    hop = link.step_latency_s + payload / link.bandwidth
    pp_comm = (pp - 1) * hop
    return ParallelPlan(
        tp=tp, pp=pp, memory_per_gpu_bytes=weights + kv, weight_bytes_per_gpu=weights, kv_bytes_per_gpu=kv,
        fits=weights + kv <= gpu.memory_bytes * memory_utilization,
        compute_s=sum(stage_compute), tp_comm_s=pp * stage_comm, pp_comm_s=pp_comm,
        time_per_token_s=sum(stages) + pp_comm,
        tp_bytes_per_token=batch * tp_allreduce_bytes_per_token(shape, tp, bytes_per_element) / pp,
        pp_bytes_per_token=(pp - 1) * payload, overlap=overlap)
