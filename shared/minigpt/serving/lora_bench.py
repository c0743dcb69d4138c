"""What serving many LoRA adapters costs (lab 08): adapter memory, computed, and batched-LoRA speed, measured.

Memory. An adapter of rank r on a projection d_in -> d_out stores r * (d_in + d_out) numbers (A and B):

    bytes per adapter = bytes_per_element * r * sum over layers and adapted projections of (d_in + d_out)

Speed (CPU, one process, interleaved medians, `minigpt.timing.compare`):
* one engine batch of 8 requests mixing four adapters against batches of the SAME size on one adapter (through
  the same LoRA matmuls, and with that adapter merged into the weights: the base model's cost), and against four
  batches of 2, one per adapter with merged weights (how one would serve them without multi-LoRA: that ratio is
  mostly the batching gain); output tokens/s of each;
* one model step with the batched LoRA matmuls against the same step of the base model alone, with the
  gathered BGMV (`delta_fn`, by default `lora.lora_delta`) and with rows grouped by adapter
  (`lora_delta_grouped`, SGMV-like);
* `lora_cost_vs_width`: one d x d projection, base matmul against the LoRA delta, as d grows: the delta's time
  hardly grows (per-operation overhead on a CPU) while the base matmul grows as d^2.

    figures = lora_serving_figures()          # about 15 s on a 2-core CPU with the target checkpoint
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from minigpt.cache.paged import PagedKVCache
from minigpt.engine.request import Request
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.runner import ModelRunner
from minigpt.engine.serving_loop import serve
from minigpt.model import GPT
from minigpt.serving.lora import PROJECTIONS, LoRAAdapters, lora_delta, merge_adapter, using_adapters, with_lora
from minigpt.serving.lora_runner import LoRAModelRunner
from minigpt.costmodel.calculators import ModelShape, weight_bytes
from minigpt.timing import compare

__all__ = ["projection_dims", "adapter_bytes", "hundred_adapters", "lora_delta_grouped", "lora_serving_figures",
           "lora_cost_vs_width"]


def projection_dims(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each projection of one layer."""
    d, q, kv, ff = shape.d_model, shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim, shape.d_ff
    return {"wq": (d, q), "wk": (d, kv), "wv": (d, kv), "wo": (q, d), "w_gate": (d, ff), "w_up": (d, ff),
            "w_down": (ff, d)}


def adapter_bytes(shape: ModelShape, rank: int, bytes_per_element: int = 2,
                  projections: Sequence[str] = PROJECTIONS) -> int:
    """Bytes of ONE adapter of rank `rank` on the given projections of every layer (bf16 by default)."""
    dims = projection_dims(shape)
    unknown = set(projections) - set(dims)
    if unknown:
        raise ValueError(f"unknown projections {sorted(unknown)}; known: {list(dims)}")
    return shape.n_layers * rank * sum(dims[p][0] + dims[p][1] for p in projections) * bytes_per_element


def hundred_adapters(shape: ModelShape, rank: int, n_adapters: int = 100, bytes_per_element: int = 2) -> dict[str, Any]:
    """Memory of `n_adapters` adapters next to the base weights (both at `bytes_per_element`)."""
    one = adapter_bytes(shape, rank, bytes_per_element)
    base = weight_bytes(shape, bytes_per_element)
    return {"model": shape.name, "rank": rank, "n_adapters": n_adapters, "bytes_per_adapter": one,
            "mib_per_adapter": one / 2**20, "total_bytes": n_adapters * one, "total_gib": n_adapters * one / 2**30,
            "base_weight_bytes": base, "percent_of_base": 100 * n_adapters * one / base}


def lora_delta_grouped(x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, adapter_idx: torch.Tensor,
                       scaling: float) -> torch.Tensor:
    """Same result as `lora.lora_delta`, rows grouped by adapter (Punica's SGMV, S-LoRA): one loop iteration per
    adapter in the batch, each reading its factors once. PyTorch's gather A[idx] instead COPIES the factors once
    per row, (N, r, d_in) + (N, d_out, r) bytes, which a BGMV kernel reading them in place never does."""
    out = x.new_zeros(x.shape[0], B.shape[1])
    for a in adapter_idx.unique().tolist():
        if a >= 0:
            rows = (adapter_idx == a).nonzero().squeeze(1)
            out.index_copy_(0, rows, (x[rows] @ A[a].T) @ B[a].T * scaling)
    return out


def _requests(n: int, prompt_len: int, new_tokens: int, vocab: int, seed: int) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    return [Request(i, torch.randint(0, vocab, (prompt_len,), generator=g).tolist(), new_tokens, stop_token_ids=())
            for i in range(n)]


def lora_serving_figures(model: GPT | None = None, *, delta_fn: Callable = lora_delta, n_adapters: int = 4,
                         rank: int = 8, requests_per_adapter: int = 2, prompt_len: int = 8, new_tokens: int = 16,
                         repeats: int = 3, seed: int = 0, threads: int = 1,
                         grouped_batch: bool = False) -> dict[str, Any]:
    """Measure multi-LoRA serving on `model` (default: the target checkpoint), about 15 s on 2 CPU cores.

    Returns tokens/s of one mixed batch (LoRA runner with `delta_fn`; with `grouped_batch` also with
    `lora_delta_grouped`), of a
    batch of the same size on ONE adapter (LoRA runner, and merged weights), of four one-adapter batches (merged
    weights), the median times of a decode-sized step (one row per request) with and without the LoRA matmuls,
    the adapters' bytes, and the workload. Random adapters (no trained adapter exists for the course model). One
    thread by default: steadier on a shared machine.
    """
    if model is None:
        from minigpt.checkpoint import load_model
        model = load_model("target")
    model = model.eval()
    adapters = LoRAAdapters.random(model, n_adapters, rank=rank, seed=seed)
    lora_model = with_lora(model, adapters, delta_fn=delta_fn)
    merged = [merge_adapter(model, adapters, a) for a in range(n_adapters)]
    n_req = n_adapters * requests_per_adapter
    reqs = _requests(n_req, prompt_len, new_tokens, model.config.vocab_size, seed)
    adapter_of = {r.request_id: i % n_adapters for i, r in enumerate(reqs)}          # interleaved: 0, 1, 2, 3, 0, ...
    only_first = {r.request_id: 0 for r in reqs}                                     # the same batch on adapter 0
    blocks = n_req * ((prompt_len + new_tokens) // 16 + 2)
    config = SchedulerConfig(max_num_seqs=n_req, max_num_batched_tokens=max(256, n_req))

    def run(m: GPT, batch: list[Request], lora: bool, adapters_of: dict = adapter_of) -> int:
        cache = PagedKVCache.for_model(m, blocks, 16)
        runner = (LoRAModelRunner(m, cache, adapter_of=lambda s: adapters_of[s.seq_id]) if lora
                  else ModelRunner(m, cache))
        res = serve(batch, Scheduler(cache.manager, config, max_model_len=m.config.max_seq_len), runner.execute)
        return sum(len(s.output_tokens) for s in res.sequences)

    grouped_model = with_lora(model, adapters, delta_fn=lora_delta_grouped)

    def mixed() -> int:
        return run(lora_model, reqs, True)

    def mixed_grouped() -> int:
        return run(grouped_model, reqs, True)

    def single_lora() -> int:
        return run(lora_model, reqs, True, only_first)

    def single_merged() -> int:
        return run(merged[0], reqs, False)

    def separate() -> int:
        return sum(run(merged[a], [r for r in reqs if adapter_of[r.request_id] == a], False) for a in range(n_adapters))

    g = torch.Generator().manual_seed(seed + 1)
    step_tokens = torch.randint(0, model.config.vocab_size, (1, n_req), generator=g)
    step_positions = torch.full((1, n_req), prompt_len)
    step_idx = torch.tensor([[adapter_of[r.request_id] for r in reqs]])

    @torch.inference_mode()
    def base_step() -> None:
        model(step_tokens, positions=step_positions)

    def lora_step_of(m: GPT) -> Callable[[], None]:
        @torch.inference_mode()
        def step() -> None:
            with using_adapters(m, step_idx):
                m(step_tokens, positions=step_positions)
        return step

    t0 = time.perf_counter()
    batches = {"mixed": mixed, "single_lora": single_lora, "single_merged": single_merged, "separate": separate}
    if grouped_batch:
        batches["mixed_grouped"] = mixed_grouped
    serving = compare(batches, warmup=1, repeats=repeats, threads=threads)
    steps = compare({"base": base_step, "lora": lora_step_of(lora_model), "grouped": lora_step_of(grouped_model)},
                    warmup=2, repeats=max(9, 3 * repeats), threads=threads)
    total = n_req * new_tokens
    grouped = ({"mixed_grouped_tokens_per_s": total / serving["mixed_grouped"].median,
                "mixed_grouped_over_separate": serving["separate"].median / serving["mixed_grouped"].median}
               if grouped_batch else {})
    return {**grouped,
        "n_adapters": n_adapters, "rank": rank, "requests": n_req, "prompt_len": prompt_len, "new_tokens": new_tokens,
        "mixed_tokens_per_s": total / serving["mixed"].median,
        "separate_tokens_per_s": total / serving["separate"].median,
        "single_lora_tokens_per_s": total / serving["single_lora"].median,
        "single_merged_tokens_per_s": total / serving["single_merged"].median,
        "mixed_over_single_lora": serving["single_lora"].median / serving["mixed"].median,
        "mixed_over_single_merged": serving["single_merged"].median / serving["mixed"].median,
        "mixed_over_separate": serving["separate"].median / serving["mixed"].median,
        "base_step_s": steps["base"].median, "lora_step_s": steps["lora"].median,
        "lora_step_overhead": steps["lora"].median / steps["base"].median - 1,
        "grouped_step_s": steps["grouped"].median,
        "grouped_step_overhead": steps["grouped"].median / steps["base"].median - 1,
        "adapter_bytes_fp32": adapters.nbytes_per_adapter(4), "adapter_bytes_bf16": adapters.nbytes_per_adapter(2),
        "model_parameters": model.num_parameters(), "n_layers": model.config.n_layers,
        "d_model": model.config.d_model, "threads": threads, "seconds": time.perf_counter() - t0,
    }


def lora_cost_vs_width(widths: Sequence[int] = (32, 128, 384, 1024, 2048), *, delta_fn: Callable = lora_delta,
                       rows: int = 8, rank: int = 8, n_adapters: int = 4, repeats: int = 15, seed: int = 0,
                       threads: int = 1) -> list[dict[str, float]]:
    """One d x d projection of `rows` token rows over `n_adapters` adapters (interleaved), for each width d: median
    seconds of the base matmul x W^T and of `delta_fn(x, A, B, idx, s)` (interleaved, warmed up, one thread).

    Per row the delta does 2rd (A) + 2dr (B) FLOPs against the base's 2d^2, a share of 2r/d, and an adapter holds
    2rd numbers against the base's d^2: at d = 384 and r = 8 about 4% of the base's work. Whatever its time is beyond that share is the
    fixed cost of its handful of small operations (gather, two batched matmuls, scale, mask)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for d in widths:
        x = torch.randn(rows, d, generator=g)
        W = torch.randn(d, d, generator=g) / d ** 0.5
        A = torch.randn(n_adapters, rank, d, generator=g) / d ** 0.5
        B = torch.randn(n_adapters, d, rank, generator=g) / rank ** 0.5
        idx = torch.arange(rows) % n_adapters

        @torch.inference_mode()
        def base() -> None:
            x @ W.T

        @torch.inference_mode()
        def delta() -> None:
            delta_fn(x, A, B, idx, 2.0)

        t = compare({"base": base, "delta": delta}, warmup=3, repeats=repeats, threads=threads)
        out.append({"d": d, "base_s": t["base"].median, "delta_s": t["delta"].median,
                    "delta_over_base": t["delta"].median / t["base"].median,
                    "flop_share": (2 * rank * d + 2 * d * rank) / (2 * d * d)})      # 2r/d
    return out
