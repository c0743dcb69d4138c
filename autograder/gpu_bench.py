"""The GPU tier's benchmarks (`make gpu-check` runs them), each device-generic: on a CPU they run on small shapes.

    machine_peaks(device)             measured memory bandwidth (GB/s, a large copy) and bf16 matmul peak (TFLOP/s)
    flash_forward_sweep(...)          naive attention, SDPA (flash backend on a GPU), the reference Triton kernel
                                      over T; naive stops where its scores would not fit in free memory (and says so)
    paged_decode_sweep(...)           gather-then-SDPA vs the split-KV kernel over the context length
    gemv_table(...)                   bf16 matmul vs the INT8 / INT4 dequantizing GEMV, GB/s of weights
    engine_throughput(...)            lab 08's LLMEngine on a 1B-parameter Llama shape, random weights

Every baseline that materialises a T x T tensor is capped by memory: `naive_attention_bytes` is what naive
attention allocates (fp32 scores, the masked copy and softmax's output, 3 x B x H x Tq x Tk x 4 bytes) and
`fits` compares it with the free device memory, keeping `headroom` of it spare; `naive_attention_plan` says at which
lengths of a sweep naive attention runs, and where it stops.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

__all__ = ["naive_attention_bytes", "fits", "naive_attention_plan", "naive_stop_message", "free_bytes",
           "machine_peaks", "flash_forward_sweep", "paged_decode_sweep", "gemv_table", "LLAMA_1B", "engine_throughput", "attention_flops",
           "flash_backward_sweep", "sdpa_fwd_bwd", "fwd_bwd"]

HEADROOM = 0.9          # use at most 90% of the free memory for one baseline's temporaries


def naive_attention_bytes(batch: int, heads: int, q_len: int, k_len: int) -> int:
    """Bytes naive attention allocates beyond its inputs: fp32 scores, their masked copy and the softmax output."""
    return 3 * batch * heads * q_len * k_len * 4


def fits(need_bytes: int, free: int, headroom: float = HEADROOM) -> bool:
    return need_bytes <= headroom * free


def naive_stop_message(seq_len: int, need: int, free: int, headroom: float = HEADROOM) -> str:
    """The line a sweep prints where naive attention stops."""
    return (f"naive attention stopped at T={seq_len}: its fp32 scores, masked copy and softmax output need "
            f"{need / 1e9:.3g} GB, more than {headroom:.0%} of the {free / 1e9:.3g} GB free")


def naive_attention_plan(seq_lens: list[int], *, batch: int, heads: int, free: int,
                         headroom: float = HEADROOM) -> tuple[list[int], str | None]:
    """The lengths of `seq_lens` (ascending) at which naive attention runs, all of them up to the first whose
    temporaries (`naive_attention_bytes`) exceed `headroom` of `free` bytes, and the line saying where it stops
    (None when every length fits)."""
    runs = []
    for T in seq_lens:
        need = naive_attention_bytes(batch, heads, T, T)
        if not fits(need, free, headroom):
            return runs, naive_stop_message(T, need, free, headroom)
        runs.append(T)
    return runs, None


def free_bytes(device: str) -> int:
    """Free memory on the device (CUDA: cudaMemGetInfo; CPU: MemAvailable from /proc/meminfo)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info()[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def _bench(fn: Callable[[], Any], device: str) -> float:
    """Median seconds per call (do_bench on CUDA, a few perf_counter calls on the CPU)."""
    from minigpt.timing import bench_interleaved
    return bench_interleaved({"f": fn}, rounds=1 if torch.device(device).type == "cuda" else 3, device=device)["f"]


def machine_peaks(device: str = "cuda", *, copy_mib: int = 1024, matmul_n: int = 8192) -> dict[str, float]:
    """Measured bandwidth (a copy reads and writes `copy_mib` MiB) and bf16 matmul throughput (n x n x n)."""
    n_bytes = copy_mib * 2**20
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t_copy = _bench(lambda: dst.copy_(src), device)
    del src, dst
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    t_mm = _bench(lambda: a @ b, device)
    return {"bandwidth_GBps": 2 * n_bytes / t_copy / 1e9, "matmul_TFLOPs": 2 * matmul_n ** 3 / t_mm / 1e12,
            "matmul_dtype": str(dtype).replace("torch.", ""), "copy_MiB": copy_mib, "matmul_n": matmul_n}


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """4 T^2 D per (batch, head) for QK^T and PV, halved under a causal mask."""
    return 4 * batch * heads * seq_len ** 2 * head_dim * (0.5 if causal else 1.0)


def flash_forward_sweep(seq_lens: list[int], *, batch: int = 4, heads: int = 32, head_dim: int = 64,
                        causal: bool = True, device: str = "cuda", free: Callable[[], int] | None = None,
                        bench: Callable[[Callable[[], Any], str], float] = _bench) -> dict[str, Any]:
    """ms and TFLOP/s of naive attention, SDPA and the reference kernel per T, fp16; naive stops at the first T whose
    temporaries would not fit (`naive_attention_bytes` against `free()`), and the row says so."""
    from minigpt.attention import naive_attention
    from minigpt.kernels.flash_attention import flash_attention_forward

    free = free or (lambda: free_bytes(device))
    rows, naive_stopped = [], None
    for T in seq_lens:
        g = torch.Generator(device=device).manual_seed(T)
        q, k, v = (torch.randn(batch, heads, T, head_dim, device=device, generator=g).half() for _ in range(3))
        flops = attention_flops(batch, heads, T, head_dim, causal)
        row: dict[str, Any] = {"T": T}
        row["reference_ms"] = bench(lambda: flash_attention_forward(q, k, v, causal=causal), device) * 1e3
        row["sdpa_ms"] = bench(lambda: _sdpa(q, k, v, causal), device) * 1e3
        need = naive_attention_bytes(batch, heads, T, T)
        if naive_stopped is None and causal and fits(need, free()):
            row["naive_ms"] = bench(lambda: naive_attention(q, k, v), device) * 1e3
        elif causal:
            naive_stopped = naive_stopped or naive_stop_message(T, need, free())
            row["naive_ms"] = None
        for key in [k_ for k_ in row if k_.endswith("_ms") and row[k_]]:
            row[key.replace("_ms", "_TFLOPs")] = flops / (row[key] * 1e-3) / 1e12
        if row.get("naive_ms"):
            row["reference_over_naive"] = row["naive_ms"] / row["reference_ms"]
        row["reference_vs_sdpa"] = row["sdpa_ms"] / row["reference_ms"]
        rows.append(row)
        del q, k, v
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return {"batch": batch, "heads": heads, "head_dim": head_dim, "causal": causal, "dtype": "float16",
            "rows": rows, "naive_stopped": naive_stopped}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA with its flash backend on a GPU (fp16), the default backend elsewhere."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    f = torch.nn.functional.scaled_dot_product_attention
    if q.is_cuda:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return f(q, k, v, is_causal=causal)
    return f(q, k, v, is_causal=causal)


def sdpa_fwd_bwd(q, k, v, d_out, causal: bool):
    """A zero-argument callable: SDPA forward + backward (dq, dk, dv for d_out), with its flash backend on a GPU
    (the math backend on a CPU, for the tests)."""
    def run():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return torch.autograd.grad(out, (q, k, v), d_out)
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return run()
        return flash
    return run


def fwd_bwd(cls, q, k, v, d_out, causal: bool):
    """A zero-argument callable: cls.apply(q, k, v, causal) then its gradients (dq, dk, dv) for d_out."""
    return lambda: torch.autograd.grad(cls.apply(q, k, v, causal), (q, k, v), d_out)


def flash_backward_sweep(seq_lens: list[int], *, head_dims: tuple[int, ...] = (64, 128),
                         dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16), batch: int = 4,
                         heads: int = 32, causal: bool = True, device: str = "cuda",
                         free: Callable[[], int] | None = None) -> list[dict[str, Any]]:
    """Forward + backward (autograd.grad of q, k, v) of the reference FlashAttentionFunction against SDPA-flash's, per
    head_dim, dtype and T, timed interleaved (medians); the batch is halved while the 4 (B, H, T, D) inputs, their
    3 gradients and out would not fit. Rows: ms of each, reference_vs_sdpa (t_sdpa / t_reference), TFLOP/s (the
    backward counted as 2.5x the forward's 4 T^2 D: 5 matmuls against 2)."""
    from minigpt.kernels.flash_attention import FlashAttentionFunction
    from minigpt.timing import bench_interleaved

    free = free or (lambda: free_bytes(device))
    rows = []
    for d in head_dims:
        for dtype in dtypes:
            for T in seq_lens:
                b = batch
                while b > 1 and not fits(8 * b * heads * T * d * dtype.itemsize, free()):
                    b //= 2
                g = torch.Generator(device=device).manual_seed(T)
                q, k, v, d_out = (torch.randn(b, heads, T, d, device=device, generator=g).to(dtype) for _ in range(4))
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                times = bench_interleaved({"sdpa": sdpa_fwd_bwd(q, k, v, d_out, causal),
                                           "reference": fwd_bwd(FlashAttentionFunction, q, k, v, d_out, causal)},
                                          rounds=3, device=device)
                flops = 3.5 * attention_flops(b, heads, T, d, causal)
                rows.append({"head_dim": d, "dtype": str(dtype).replace("torch.", ""), "T": T, "batch": b,
                             "reference_ms": times["reference"] * 1e3, "sdpa_ms": times["sdpa"] * 1e3,
                             "reference_vs_sdpa": times["sdpa"] / times["reference"],
                             "reference_TFLOPs": flops / times["reference"] / 1e12,
                             "sdpa_TFLOPs": flops / times["sdpa"] / 1e12})
                del q, k, v, d_out
                if torch.device(device).type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def paged_decode_sweep(contexts: list[int], *, batch: int = 32, heads: int = 32, kv_heads: int = 8,
                       head_dim: int = 128, block_size: int = 16, device: str = "cuda",
                       bench: Callable[[Callable[[], Any], str], float] = _bench) -> list[dict[str, Any]]:
    """gather-then-SDPA vs the split-KV kernel, fp16; GB/s of K and V read by the kernel."""
    from minigpt.kernels.paged_decode import gather_then_sdpa, paged_decode, random_paged_inputs

    rows = []
    for ctx in contexts:
        args = random_paged_inputs([ctx] * batch, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
                                   block_size=block_size, dtype=torch.float16, device=device)
        row = {"context": ctx, "gather_sdpa_ms": bench(lambda: gather_then_sdpa(*args), device) * 1e3,
               "paged_decode_ms": bench(lambda: paged_decode(*args), device) * 1e3}
        kv_bytes = 2 * batch * ctx * kv_heads * head_dim * 2
        row["paged_decode_GBps"] = kv_bytes / (row["paged_decode_ms"] * 1e-3) / 1e9
        row["speedup"] = row["gather_sdpa_ms"] / row["paged_decode_ms"]
        rows.append(row)
        del args
    return rows


def gemv_table(sizes: list[int], *, group_size: int = 128, device: str = "cuda",
               bench: Callable[[Callable[[], Any], str], float] = _bench) -> list[dict[str, Any]]:
    """Per n: a dense (bf16 on a GPU) n x n matrix-vector product vs the INT8 and INT4 reference GEMV kernels."""
    from minigpt.kernels.dequant_gemv import dequant_gemv
    from minigpt.quant.formats import pack_int4, quantize

    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    rows = []
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        w = torch.randn(n, n, generator=g)
        x = torch.randn(n, generator=g).to(device, dtype)
        dense = w.to(device, dtype)
        row: dict[str, Any] = {"n": n, "dense_ms": bench(lambda: dense @ x, device) * 1e3}
        for bits in (8, 4):
            qt = quantize(w, bits, group_size=group_size)
            qw = (pack_int4(qt.q) if bits == 4 else qt.q).to(device)
            scale = qt.scale.to(device)
            ms = bench(lambda: dequant_gemv(x, qw, scale, bits, group_size), device) * 1e3
            row[f"int{bits}_ms"] = ms
            row[f"int{bits}_speedup"] = row["dense_ms"] / ms
            row[f"int{bits}_GBps"] = (qw.nbytes + scale.nbytes) / (ms * 1e-3) / 1e9
        row["dense_GBps"] = dense.nbytes / (row["dense_ms"] * 1e-3) / 1e9
        rows.append(row)
    return rows


# Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 query / 8 KV heads, MLP 8192, vocab 128256, tied embeddings):
# about 1.24e9 parameters. Random weights: the engine's speed does not depend on their values.
LLAMA_1B = dict(vocab_size=128256, max_seq_len=2048, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192,
                rope_theta=500_000.0)


def _llama_like(config: dict[str, Any] | None, device: str, dtype: torch.dtype) -> Any:
    """A GPT of `config`'s shape (default LLAMA_1B), random weights (seed 0), on `device` in `dtype`, eval mode."""
    from minigpt.config import ModelConfig
    from minigpt.model import GPT

    torch.manual_seed(0)
    with torch.device(device):
        return GPT(ModelConfig(**(config or LLAMA_1B))).to(dtype).eval()


def _prompts(vocab_size: int, n: int, prompt_len: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (prompt_len,), generator=g).tolist() for _ in range(n)]


def _engine(model: Any, *, requests: int, prompt_len: int, max_tokens: int, max_num_seqs: int, **fields: Any) -> Any:
    """An LLMEngine for `requests` prompts of `prompt_len` tokens and `max_tokens` outputs at once (no prefix cache);
    `fields`: more EngineConfig fields."""
    from minigpt.serving.engine import EngineConfig, LLMEngine

    blocks_per_seq = math.ceil((prompt_len + max_tokens) / 16) + 1
    return LLMEngine(model, EngineConfig(num_blocks=blocks_per_seq * requests + 2,
                                         max_num_seqs=min(requests, max_num_seqs),
                                         max_num_batched_tokens=max(512, prompt_len), enable_prefix_caching=False,
                                         **fields))


def _serve(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    """Serve `prompts` at once (greedy, `max_tokens` each): (output tokens, seconds from the first step to the last)."""
    import time

    from minigpt.sampling import SamplingParams

    first = llm.num_finished                                  # ids not used before on this engine
    for i, p in enumerate(prompts):
        llm.add_request(f"r{first + i}", p, max_tokens=max_tokens, sampling=SamplingParams())
    cuda = llm.model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0, tokens = time.perf_counter(), 0
    while llm.has_unfinished():
        tokens += sum(len(out.new_token_ids) for out in llm.step())
    if cuda:
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - t0


def _decode_step_floor_s(model: Any, bandwidth_GBps: float) -> float:
    """Seconds a decode step needs at least: every weight read once at the measured bandwidth."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return weight_bytes / (bandwidth_GBps * 1e9)


def engine_throughput(*, config: dict[str, Any] | None = None, requests: int = 64, prompt_len: int = 128,
                      max_tokens: int = 128, max_num_seqs: int = 64, device: str = "cuda",
                      dtype: torch.dtype = torch.bfloat16, bandwidth_GBps: float | None = None) -> dict[str, Any]:
    """Output tokens/s of lab 08's LLMEngine serving `requests` at once, and of one request alone (batch 1), on a
    model of `config`'s shape (default LLAMA_1B) with random weights; against the bandwidth roofline of a decode step
    (every weight read once per step) when `bandwidth_GBps` is given."""
    model = _llama_like(config, device, dtype)
    prompts = _prompts(model.config.vocab_size, requests, prompt_len)

    def serve(n: int) -> tuple[int, float]:
        return _serve(_engine(model, requests=n, prompt_len=prompt_len, max_tokens=max_tokens,
                              max_num_seqs=max_num_seqs), prompts[:n], max_tokens)

    serve(min(2, requests))                                   # warm-up
    alone_tokens, alone_s = serve(1)
    batch_tokens, batch_s = serve(requests)
    out = {"shape": {k: v for k, v in (config or LLAMA_1B).items()},
           "parameters": sum(p.numel() for p in model.parameters()), "dtype": str(dtype)[6:],
           "requests": requests, "prompt_len": prompt_len, "max_tokens": max_tokens,
           "batch_tokens_per_s": batch_tokens / batch_s, "alone_tokens_per_s": alone_tokens / alone_s,
           "batch_over_alone": (batch_tokens / batch_s) / (alone_tokens / alone_s)}
    if bandwidth_GBps:
        step_floor_s = _decode_step_floor_s(model, bandwidth_GBps)
        out["decode_step_floor_ms"] = step_floor_s * 1e3
        out["alone_fraction_of_roofline"] = (alone_tokens / alone_s) * step_floor_s
    return out


# Lab 12's modes of the engine, each serving one request alone (batch 1): EngineConfig fields.
BATCH1_MODES: dict[str, dict[str, Any]] = {
    "default step": {},
    "static shapes, compiled": {"static_decode": "compiled"},
    "static shapes, compiled, overlap scheduling": {"static_decode": "compiled", "async_scheduling": True},
}


def engine_batch1_modes(*, config: dict[str, Any] | None = None, prompt_len: int = 128, max_tokens: int = 128,
                        device: str = "cuda", dtype: torch.dtype = torch.bfloat16, bandwidth_GBps: float | None = None,
                        modes: dict[str, dict[str, Any]] | None = None, repeats: int = 3) -> dict[str, Any]:
    """Lab 12's question on a GPU: how close one request's decode comes to the bandwidth roofline (every weight read
    once a step) on the 1B Llama shape, for each of the engine's modes (`BATCH1_MODES`; compiled steps replay CUDA
    graphs on a GPU). Per mode: a warm-up serve (compiles its bucket), then the median of `repeats` serves of one
    request on the same engine (prefill included): output tokens/s, the fraction of the roofline when `bandwidth_GBps`
    is given, and the compilations counted in the warm-up and after it (there should be none after)."""
    model = _llama_like(config, device, dtype)
    [prompt] = _prompts(model.config.vocab_size, 1, prompt_len)
    floor = _decode_step_floor_s(model, bandwidth_GBps) if bandwidth_GBps else None
    out: dict[str, Any] = {"shape": dict(config or LLAMA_1B), "dtype": str(dtype)[6:], "prompt_len": prompt_len,
                           "max_tokens": max_tokens, "modes": {}}
    if floor is not None:
        out["decode_step_floor_ms"] = floor * 1e3
    for name, fields in (modes or BATCH1_MODES).items():
        llm = _engine(model, requests=1, prompt_len=prompt_len, max_tokens=max_tokens, max_num_seqs=1, **fields)
        try:
            _serve(llm, [prompt], max_tokens)                         # warm-up: compiles the bucket of 1
            static = llm.runner.static
            before = static.compilations if static is not None else 0
            runs = []
            for _ in range(repeats):
                tokens, seconds = _serve(llm, [prompt], max_tokens)
                runs.append(tokens / seconds)
            after = static.compilations if static is not None else 0
        finally:
            llm.close()
        del llm
        rate = sorted(runs)[len(runs) // 2]
        out["modes"][name] = {"tokens_per_s": rate, "runs_tokens_per_s": runs, "compilations": before,
                              "compilations_after_warm_up": after - before,
                              **({"fraction_of_roofline": rate * floor} if floor is not None else {})}
        if device == "cuda":
            torch.cuda.empty_cache()
    return out
