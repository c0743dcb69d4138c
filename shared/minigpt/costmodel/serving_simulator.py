"""The lab 03 scheduler at scale: a simulated clock whose step cost comes from lab 00's roofline.

    result = simulate("continuous", poisson_workload(200, rate=10, seed=0), "Llama-3-8B", "H100-SXM")

No model runs: every sampled token is a dummy (never a stop token), so a request produces exactly its
max_new_tokens. The SAME `Scheduler` (or `StaticBatchScheduler`) and `serve` loop as on the CPU decide
every step; `RooflineClock` then charges the step on lab 00's rule (`calculators.forward_kernels`, `kernels_time`),
kernel by kernel:

    time = max(F_w / peak, B_w / bandwidth) + max(F_a / peak, B_a / bandwidth) + step_overhead
    weight matmuls: F_w = 2 * P * rows, B_w = the weights a pass over `rows` positions reads (once per step)
    attention: F_a = 4 * layers * heads * head_dim * sum over chunks (n tokens from position s) of (n*s + n(n+1)/2),
               B_a = K/V of positions 0..s+n-1 of every chunk

(P = matmul parameters; rows = the chunks' tokens, or B * the longest chunk when padded, as static batching runs).
The KV pool gets the memory left after the stored weights within 90% of the GPU (vLLM's default for most of its
history; 0.92 in current releases).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from minigpt.cache.block_manager import BlockManager
from minigpt.engine.baselines import StaticBatchScheduler
from minigpt.engine.metrics import goodput, request_metrics
from minigpt.engine.request import Request
from minigpt.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from minigpt.engine.serving_loop import ServeResult, serve
from minigpt.costmodel.calculators import PRESETS, ModelShape, forward_kernels, kernels_time, kv_bytes_per_token, weight_bytes
from minigpt.costmodel.hardware import ACCELERATORS, Accelerator

__all__ = ["RooflineClock", "step_cost", "pool_blocks", "poisson_workload", "corpus_workload", "simulate", "GoodputPoint",
           "goodput_curve", "knee"]

Policy = Literal["static", "dynamic", "continuous"]
DUMMY_TOKEN = 1


def step_cost(output: SchedulerOutput, shape: ModelShape, gpu: Accelerator, *, precision: str = "bf16",
              padded: bool = False, step_overhead_s: float = 0.0) -> float:
    """Seconds for one step on the roofline, kernel by kernel (see the module docstring); bf16 weights and KV."""
    if not output.chunks:
        return 0.0
    lens = [len(c.tokens) for c in output.chunks]
    rows = len(lens) * max(lens) if padded else sum(lens)
    pairs = sum(n * c.start + n * (n + 1) // 2 for c, n in zip(output.chunks, lens))
    kv_tokens = sum(c.start + n for c, n in zip(output.chunks, lens))
    kernels = forward_kernels(shape, rows, pairs, kv_tokens)
    return kernels_time(kernels, gpu.peak(precision), gpu.memory_bandwidth) + step_overhead_s


class RooflineClock:
    """Simulated seconds: `after_step` advances by `step_cost`; waiting for an arrival jumps to it."""

    def __init__(self, shape: ModelShape, gpu: Accelerator, *, padded: bool = False, step_overhead_s: float = 0.0) -> None:
        self.shape, self.gpu, self.padded, self.step_overhead_s = shape, gpu, padded, step_overhead_s
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def after_step(self, output: SchedulerOutput) -> None:
        self.t += step_cost(output, self.shape, self.gpu, padded=self.padded, step_overhead_s=self.step_overhead_s)


def pool_blocks(shape: ModelShape, gpu: Accelerator, block_size: int = 16, memory_utilization: float = 0.9) -> int:
    """KV blocks that fit in the memory left after the bf16 weights."""
    free = int(gpu.memory_bytes * memory_utilization) - weight_bytes(shape, 2)
    blocks = free // (kv_bytes_per_token(shape, 2) * block_size)
    if blocks < 1:
        raise ValueError(f"{shape.name} does not fit on {gpu.name}: no memory left for the KV cache")
    return blocks


def poisson_workload(n: int, rate: float, *, prompt_len: int = 512, mean_output: int = 128, spread: float = 1.0,
                     seed: int = 0) -> list[Request]:
    """n synthetic requests: Poisson arrivals at `rate` req/s, prompt lengths uniform in [prompt_len/2, 3/2 prompt_len],
    output lengths lognormal with the given mean and sigma = `spread` (0: all equal), at least 1."""
    if n < 1 or rate <= 0 or prompt_len < 2 or mean_output < 1 or spread < 0:
        raise ValueError("need n >= 1, rate > 0, prompt_len >= 2, mean_output >= 1 and spread >= 0")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    prompts = rng.integers(prompt_len // 2, prompt_len * 3 // 2 + 1, n)
    outputs = np.maximum(1, np.round(mean_output * rng.lognormal(-spread ** 2 / 2, spread, n))).astype(int)
    return [Request(i, (DUMMY_TOKEN,) * int(p), int(o), arrival_time=float(a), stop_token_ids=())
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


def simulate(policy: Policy, requests: list[Request], model: str | ModelShape = "Llama-3-8B",
             gpu: str | Accelerator = "H100-SXM", *, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
             batch_size: int = 32, block_size: int = 16, max_model_len: int = 8192,
             step_overhead_s: float = 0.0) -> ServeResult:
    """Serve `requests` on the simulated GPU: static / dynamic batching (batches of `batch_size`) or continuous."""
    shape = PRESETS[model] if isinstance(model, str) else model
    gpu = ACCELERATORS[gpu] if isinstance(gpu, str) else gpu
    manager = BlockManager(pool_blocks(shape, gpu, block_size), block_size)
    if policy == "continuous":
        scheduler = Scheduler(manager, SchedulerConfig(max_num_seqs, max_num_batched_tokens), max_model_len=max_model_len)
    elif policy in ("static", "dynamic"):
        scheduler = StaticBatchScheduler(manager, batch_size, max_model_len=max_model_len,
                                         wait_for_full=policy == "static")
    else:
        raise ValueError(f"policy must be 'static', 'dynamic' or 'continuous', got {policy!r}")
    clock = RooflineClock(shape, gpu, padded=policy != "continuous", step_overhead_s=step_overhead_s)

    def execute(output: SchedulerOutput) -> dict:
        return {c.seq_id: DUMMY_TOKEN for c in output.chunks if c.samples}

    return serve(requests, scheduler, execute, clock)


@dataclass(frozen=True)
class GoodputPoint:
    rate: float                 # offered load, requests/s
    goodput: float              # share of requests meeting both limits
    tokens_per_second: float
    p99_ttft: float
    p99_tpot: float


def goodput_curve(policy: Policy, rates: list[float], *, n: int = 200, ttft_limit: float = 1.0,
                  tpot_limit: float = 0.05, seed: int = 0, prompt_len: int = 512, mean_output: int = 128,
                  spread: float = 1.0, **kwargs: object) -> list[GoodputPoint]:
    """Goodput and throughput at each offered load (same seeded workload shape at every rate)."""
    points = []
    for rate in rates:
        reqs = poisson_workload(n, rate, prompt_len=prompt_len, mean_output=mean_output, spread=spread, seed=seed)
        result = simulate(policy, reqs, **kwargs)
        ms = [request_metrics(s) for s in result.sequences]
        points.append(GoodputPoint(rate, goodput(ms, ttft_limit, tpot_limit), result.tokens_per_second,
                                   float(np.percentile([m.ttft for m in ms], 99)),
                                   float(np.percentile([m.tpot for m in ms], 99))))
    return points


def knee(points: list[GoodputPoint], target: float = 0.9) -> float | None:
    """Highest offered load whose goodput is still >= target (None if none is)."""
    ok = [p.rate for p in points if p.goodput >= target]
    return max(ok) if ok else None


def corpus_workload(n: int, rate: float, *, prompt_lens: tuple[int, int] = (16, 64), mean_output: int = 24,
                    spread: float = 1.0, max_output: int = 128, seed: int = 0) -> list[Request]:
    """n requests with real prompts (windows of the validation corpus), Poisson arrivals at `rate` req/s and
    long-tailed output lengths (lognormal, mean about `mean_output`, sigma `spread`, clipped to [1, max_output]).
    Stop tokens are off, so each request produces exactly its max_new_tokens (a length an EOS would have set)."""
    from minigpt.training.data import load_tokens

    tokens = load_tokens("val")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    lens = rng.integers(prompt_lens[0], prompt_lens[1] + 1, n)
    starts = rng.integers(0, len(tokens) - prompt_lens[1], n)
    outputs = np.clip(np.round(mean_output * rng.lognormal(-spread ** 2 / 2, spread, n)), 1, max_output).astype(int)
    return [Request(i, tokens[s:s + p].tolist(), int(o), arrival_time=float(a), stop_token_ids=())
            for i, (a, s, p, o) in enumerate(zip(arrivals, starts, lens, outputs))]
