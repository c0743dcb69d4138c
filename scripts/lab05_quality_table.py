"""Lab 05's full quality table: validation perplexity of the trained target under every format and method.

    .venv/bin/python scripts/lab05_quality_table.py          # ~15-30 min on a 2-core CPU

Too slow for the notebook (GPTQ and AWQ calibrate every layer; each perplexity is a full forward pass over
the subset), so the notebook reads the JSON this writes (data/lab05_quality_table.json) and recomputes a
few rows live on a smaller subset. Everything is seeded: the calibration windows (training split) and the
validation windows.
"""

from __future__ import annotations

import datetime
import json
import platform
import time
from pathlib import Path

import torch

from minigpt.checkpoint import load_model
from minigpt.quant.awq import awq_model
from minigpt.quant.calibration import calibration_tokens
from minigpt.quant.formats import fake_quantize
from minigpt.quant.gptq import gptq_model
from minigpt.quant.linear import quantize_fp8_weights, quantize_weight_only, weight_bytes
from minigpt.quant.quality import perplexity, validation_subset
from minigpt.quant.smoothquant import smoothquant_model

OUT = Path(__file__).resolve().parents[1] / "data" / "lab05_quality_table.json"
EVAL = {"n_windows": 48, "seq_len": 256, "seed": 0}
CALIB = {"n_sequences": 32, "seq_len": 256, "seed": 0}


def main() -> None:
    torch.set_num_threads(1)          # one thread: on a shared machine OpenMP threads oversubscribe the cores
    model = load_model("target").eval()
    x, y = validation_subset(**EVAL)
    calib = calibration_tokens(**CALIB)
    rows: list[dict] = []

    def add(name: str, bits_per_weight: float, build, kv_format: str | None = None) -> None:
        t0 = time.perf_counter()
        m = build()
        t1 = time.perf_counter()
        ppl = perplexity(m, x, y, kv_format=kv_format)
        rows.append({"name": name, "weight_bits": bits_per_weight, "kv_format": kv_format or "fp32",
                     "perplexity": ppl, "weight_bytes": weight_bytes(m), "build_s": round(t1 - t0, 1)})
        print(f"{name:28s} {ppl:8.4f}   build {t1 - t0:6.1f}s  eval {time.perf_counter() - t1:6.1f}s", flush=True)

    def int4_embeddings():
        m = load_model("target").eval()
        with torch.no_grad():
            m.tok_emb.weight.copy_(fake_quantize(m.tok_emb.weight, 4, group_size=128))
        return quantize_weight_only(m, 4, 128)

    add("fp32", 32, lambda: model)
    add("bf16", 16, lambda: load_model("target").to(torch.bfloat16).eval())
    add("FP8 E4M3 weights", 8, lambda: quantize_fp8_weights(model, "e4m3"))
    add("FP8 E5M2 weights", 8, lambda: quantize_fp8_weights(model, "e5m2"))
    add("INT8 RTN", 8, lambda: quantize_weight_only(model, 8))
    for g in (64, 128):
        add(f"INT4 RTN g{g}", 4, lambda: quantize_weight_only(model, 4, g))
        add(f"INT4 GPTQ g{g}", 4, lambda: gptq_model(model, calib, 4, g))
        add(f"INT4 AWQ g{g}", 4, lambda: awq_model(model, calib, 4, g))
    add("INT4 RTN g128 asym", 4, lambda: quantize_weight_only(model, 4, 128, symmetric=False))
    add("INT4 RTN g128 + INT4 embeddings/LM head", 4, int4_embeddings)
    add("W8A8 (no smoothing)", 8, lambda: smoothquant_model(model, None))
    add("W8A8 SmoothQuant a=0.5", 8, lambda: smoothquant_model(model, calib, 0.5))
    for fmt in ("int8", "fp8_e4m3", "fp8_e5m2"):
        add(f"KV {fmt}", 32, lambda: model, kv_format=fmt)
    OUT.write_text(json.dumps({
        "script": "scripts/lab05_quality_table.py", "eval": EVAL, "calibration": CALIB,
        "tokens_evaluated": int(y.numel()), "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "date": datetime.date.today().isoformat(), "rows": rows}, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
