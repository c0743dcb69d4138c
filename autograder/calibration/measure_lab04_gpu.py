"""Lab 04 GPU measurements (run on a CUDA machine): TFLOP/s sweeps and the issue's targets.

    python autograder/calibration/measure_lab04_gpu.py [--quick] > lab04_gpu.cuda-smXX.json

Forward: fp16, batch 4, 32 heads, head_dim 64 and 128, causal and not, T = 512 .. 16k, for naive attention
(where it fits), SDPA's flash backend and the reference Triton kernel; plus the peak extra memory per T.
Decode: batch 32, contexts 1k .. 32k, 32 query / 8 KV heads, head_dim 128, block 16: gather-then-SDPA vs
the split-KV kernel. Times: triton.testing.do_bench(..., return_mode="median") in milliseconds.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from minigpt.attention import naive_attention
from minigpt.kernels.flash_attention import flash_attention_forward
from minigpt.kernels.paged_decode import gather_then_sdpa, paged_decode, random_paged_inputs
from minigpt.teaching.attention_traffic import attention_flops
from minigpt.timing import device_class


def _ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def forward_sweep(seq_lens, head_dims=(64, 128), batch=4, heads=32) -> list[dict]:
    rows = []
    for d in head_dims:
        for causal in (True, False):
            for T in seq_lens:
                q, k, v = (torch.randn(batch, heads, T, d, device="cuda", dtype=torch.float16) for _ in range(3))
                flops = attention_flops(batch, heads, T, d, causal=causal)
                row = {"head_dim": d, "causal": causal, "T": T}
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    row["sdpa_flash_ms"] = _ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
                row["reference_ms"] = _ms(lambda: flash_attention_forward(q, k, v, causal=causal))
                if causal and batch * heads * T * T * 4 < 20e9:       # naive keeps fp32 scores: skip what cannot fit
                    row["naive_ms"] = _ms(lambda: naive_attention(q, k, v))
                for key in [k_ for k_ in row if k_.endswith("_ms")]:
                    row[key.replace("_ms", "_tflops")] = flops / (row[key] * 1e-3) / 1e12
                rows.append(row)
                del q, k, v
                torch.cuda.empty_cache()
    return rows


def decode_sweep(contexts, batch=32, heads=32, kv_heads=8, head_dim=128, block=16) -> list[dict]:
    rows = []
    for ctx in contexts:
        args = random_paged_inputs([ctx] * batch, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
                                   block_size=block, dtype=torch.float16, device="cuda")
        row = {"context": ctx, "gather_sdpa_ms": _ms(lambda: gather_then_sdpa(*args)),
               "paged_decode_ms": _ms(lambda: paged_decode(*args))}
        kv_bytes = 2 * batch * ctx * kv_heads * head_dim * 2          # K and V, fp16
        row["paged_decode_GBps"] = kv_bytes / (row["paged_decode_ms"] * 1e-3) / 1e9
        row["speedup"] = row["gather_sdpa_ms"] / row["paged_decode_ms"]
        rows.append(row)
        del args
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    quick = "--quick" in sys.argv
    seq = [512, 1024, 2048, 4096] if quick else [512, 1024, 2048, 4096, 8192, 16384]
    ctx = [1024, 8192] if quick else [1024, 2048, 4096, 8192, 16384, 32768]
    out = {"device_class": device_class("cuda"), "device_name": torch.cuda.get_device_name(),
           "torch": torch.__version__, "forward": forward_sweep(seq), "decode": decode_sweep(ctx)}
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
