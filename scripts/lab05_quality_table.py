"""Lab 05's quality table: the trained target under every format and method, measured against fp32.

    .venv/bin/python scripts/lab05_quality_table.py             # 2 worker processes; the shipped table took 1,650 s
                                                                # with 3 on a shared 2-core CPU (load ~12)
    .venv/bin/python scripts/lab05_quality_table.py --jobs 1    # one process

Each row gives validation perplexity and two measures of how far the quantized model's next-token distribution
moved from the fp32 model's on the same tokens (`minigpt.quant.quality.fidelity`): the mean KL divergence
KL(p_fp32 || p_quant) in nats per token and the top-1 agreement.

Two parts:
* "rows": the formats at 8 and 4 bits (FP8, INT8, INT4 RTN / GPTQ / AWQ at groups of 64, W8A8, KV cache).
  At 4 bits this small model loses little, so there is little for GPTQ and AWQ to recover.
* "sweep": weights at 4, 3 and 2 bits, one scale per output channel and per group of 128, by round-to-nearest,
  GPTQ (plain and act-order) and AWQ (with and without its range clipping): the regime where the methods matter.
  4 and 3 bits are symmetric; 2 bits is asymmetric (a symmetric 2-bit grid has only the levels -1, 0, 1).

Too slow for the notebook (GPTQ and AWQ calibrate every layer), so the notebook reads the JSON this writes
(data/lab05_quality_table.json) and recomputes rows live to show they match. Everything is seeded: the
calibration windows (training split) and the validation windows; the rows do not depend on --jobs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from minigpt.checkpoint import load_model
from minigpt.quant.awq import awq_model
from minigpt.quant.calibration import calibration_tokens
from minigpt.quant.formats import fake_quantize
from minigpt.quant.gptq import gptq_model
from minigpt.quant.linear import quantize_fp8_weights, quantize_weight_only, weight_bytes
from minigpt.quant.quality import fidelity, perplexity, validation_subset
from minigpt.quant.smoothquant import smoothquant_model

OUT = Path(__file__).resolve().parents[1] / "data" / "lab05_quality_table.json"
EVAL = {"n_windows": 16, "seq_len": 256, "seed": 0}
CALIB = {"n_sequences": 32, "seq_len": 256, "seed": 0}
AWQ_GRID = 20
SWEEP_BITS = (4, 3, 2)
SWEEP_GROUPS = (None, 128)
SWEEP_METHODS = ("RTN", "GPTQ", "GPTQ act-order", "AWQ", "AWQ no clip")


def sweep_name(bits: int, group_size: int | None, method: str) -> str:
    """The row name of a sweep entry, e.g. 'INT3 per-channel GPTQ act-order' (the notebook builds names with this)."""
    return f"INT{bits} {'per-channel' if group_size is None else f'g{group_size}'} {method}"


def row_specs() -> list[dict]:
    """Every row to measure, as plain data (so worker processes can build it)."""
    rows = [dict(part="rows", name="fp32", kind="fp32", bits=32), dict(part="rows", name="bf16", kind="bf16", bits=16),
            dict(part="rows", name="FP8 E4M3 weights", kind="fp8", fmt="e4m3", bits=8),
            dict(part="rows", name="FP8 E5M2 weights", kind="fp8", fmt="e5m2", bits=8),
            dict(part="rows", name="INT8 RTN", kind="RTN", bits=8, group=None)]
    rows += [dict(part="rows", name="INT4 RTN g64", kind="RTN", bits=4, group=64),          # g128: in the sweep
             dict(part="rows", name="INT4 GPTQ g64", kind="GPTQ", bits=4, group=64),
             dict(part="rows", name="INT4 AWQ g64", kind="AWQ", bits=4, group=64)]
    rows += [dict(part="rows", name="INT4 RTN g128 asym", kind="RTN", bits=4, group=128, symmetric=False),
             dict(part="rows", name="INT4 RTN g128 + INT4 embeddings/LM head", kind="int4_emb", bits=4, group=128),
             dict(part="rows", name="W8A8 (no smoothing)", kind="w8a8", bits=8),
             dict(part="rows", name="W8A8 SmoothQuant a=0.5", kind="smoothquant", bits=8)]
    rows += [dict(part="rows", name=f"KV {fmt}", kind="fp32", bits=32, kv_format=fmt) for fmt in ("int8", "fp8_e4m3", "fp8_e5m2")]
    for bits in SWEEP_BITS:
        for g in SWEEP_GROUPS:
            for method in SWEEP_METHODS:
                if method == "AWQ no clip" and (bits == 4 or g is not None):     # the ablations: low bits only
                    continue
                if method == "GPTQ" and bits != 3:
                    continue
                kind, extra = {"RTN": ("RTN", {}), "GPTQ": ("GPTQ", {}), "GPTQ act-order": ("GPTQ", {"act_order": True}),
                               "AWQ": ("AWQ", {}), "AWQ no clip": ("AWQ", {"clip": False})}[method]
                rows.append(dict(part="sweep", name=sweep_name(bits, g, method), kind=kind, bits=bits, group=g,
                                 symmetric=bits > 2, method=method, **extra))
    return rows


_STATE: dict = {}


def _init_worker() -> None:
    torch.set_num_threads(1)          # one thread per process: on a shared machine OpenMP threads oversubscribe
    _STATE["model"] = load_model("target").eval()
    _STATE["xy"] = validation_subset(**EVAL)
    _STATE["calib"] = calibration_tokens(**CALIB)


def build(spec: dict, model, calib):
    """The quantized model a spec describes."""
    kind, bits, g, sym = spec["kind"], spec["bits"], spec.get("group"), spec.get("symmetric", True)
    if kind == "fp32":
        return model
    if kind == "bf16":
        return load_model("target").to(torch.bfloat16).eval()
    if kind == "fp8":
        return quantize_fp8_weights(model, spec["fmt"])
    if kind == "RTN":
        return quantize_weight_only(model, bits, g, symmetric=sym)
    if kind == "GPTQ":
        return gptq_model(model, calib, bits, g, symmetric=sym, act_order=spec.get("act_order", False))
    if kind == "AWQ":
        return awq_model(model, calib, bits, g, symmetric=sym, grid=AWQ_GRID, clip=spec.get("clip", True))
    if kind == "int4_emb":
        m = load_model("target").eval()
        with torch.no_grad():
            m.tok_emb.weight.copy_(fake_quantize(m.tok_emb.weight, 4, group_size=128))
        return quantize_weight_only(m, 4, 128)
    if kind == "w8a8":
        return smoothquant_model(model, None)
    if kind == "smoothquant":
        return smoothquant_model(model, calib, 0.5)
    raise ValueError(f"unknown row kind {kind!r}")


def measure(spec: dict) -> dict:
    model, (x, y), calib = _STATE["model"], _STATE["xy"], _STATE["calib"]
    t0 = time.perf_counter()
    m = build(spec, model, calib)
    t1 = time.perf_counter()
    kv = spec.get("kv_format")
    if kv is None:
        f = fidelity(m, model, x, y)
    else:
        f = {"perplexity": perplexity(m, x, y, kv_format=kv), "kl": None, "top1": None}
    row = {"name": spec["name"], "part": spec["part"], "weight_bits": spec["bits"], "group_size": spec.get("group"),
           "symmetric": spec.get("symmetric", True), "method": spec.get("method", spec["kind"]), "kv_format": kv or "fp32",
           "perplexity": f["perplexity"], "kl": f["kl"], "top1": f["top1"], "weight_bytes": weight_bytes(m),
           "build_s": round(t1 - t0, 1)}
    kl = "      -" if f["kl"] is None else f"{f['kl']:.4f}"
    print(f"{spec['name']:40s} ppl {f['perplexity']:8.4f}  KL {kl}  build {t1 - t0:6.1f}s  eval {time.perf_counter() - t1:5.1f}s",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "lab05_quality_rows",
                        help="each finished row is kept here, so an interrupted run resumes where it stopped")
    args = parser.parse_args()
    specs = row_specs()
    args.scratch.mkdir(parents=True, exist_ok=True)
    done = {}
    for f in args.scratch.glob("*.json"):
        saved = json.loads(f.read_text())
        if saved["spec"] in specs and saved["setup"] == {"eval": EVAL, "calibration": CALIB, "awq_grid": AWQ_GRID}:
            done[saved["spec"]["name"]] = saved["row"]
    todo = sorted((s for s in specs if s["name"] not in done), key=lambda s: s["kind"] not in ("GPTQ", "AWQ"))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs, initializer=_init_worker) as pool:   # slow rows first
        for spec, row in zip(todo, pool.map(measure, todo)):
            done[spec["name"]] = row
            file_name = "".join(c if c.isalnum() else "_" for c in spec["name"]) + ".json"
            (args.scratch / file_name).write_text(json.dumps(
                {"spec": spec, "setup": {"eval": EVAL, "calibration": CALIB, "awq_grid": AWQ_GRID}, "row": row}))
    rows = [done[s["name"]] for s in specs]
    OUT.write_text(json.dumps({
        "script": "scripts/lab05_quality_table.py", "eval": EVAL, "calibration": CALIB, "awq_grid": AWQ_GRID,
        "tokens_evaluated": EVAL["n_windows"] * EVAL["seq_len"],
        "metrics": "perplexity; kl = mean KL(p_fp32 || p_quant) in nats per token; top1 = share of positions where "
                   "the argmax matches fp32's (null for KV rows: the fp32 weights, only the cache changes)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "machine": {"processor": platform.processor() or platform.machine(), "system": platform.system(),
                    "cpus": os.cpu_count(), "workers": args.jobs, "threads_per_worker": 1,
                    "note": "timings (build_s) are from a shared machine and only indicative"},
        "total_s": round(time.perf_counter() - started), "date": datetime.date.today().isoformat(),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "rows": [r for r in rows if r["part"] == "rows"], "sweep": [r for r in rows if r["part"] == "sweep"]},
        indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
