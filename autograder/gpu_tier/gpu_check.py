"""The GPU tier in one command: `make gpu-check` (or `python -m autograder gpu-check`).

On a machine with a CUDA GPU it runs, part by part, and writes after each part
`autograder/calibration/gpu_check.<device class>.json` and a Markdown table beside it (`.md`):

    calibrate  (only with --calibrate / CALIBRATE=1) `python -m autograder calibrate` for this GPU class
    machine    measured memory bandwidth and bf16 matmul peak (the yardsticks of the table)
    lab01      CUDA-graph decode: the graded check on the reference
    lab03      continuous vs static batching, wall time: the graded check on the reference
    lab04      flash forward: graded check, and the sweep against SDPA-flash and naive attention (naive stops where
               its scores would not fit in free memory, and says so); the causal fast path against the single loop;
               forward + backward (the autograd Function, Triton backward): graded check against SDPA-flash, and the
               sweep over T 1k-16k, d 64/128, fp16/bf16; paged decode: graded check and sweep; peak-memory growth
    lab05      INT8 / INT4 dequantizing GEMV: graded checks and a table against a bf16 matmul
    lab08      LLMEngine throughput on a 1B-parameter Llama shape (random weights), against the bandwidth roofline
    lab12      LLMEngine, one request alone on the same shape, for each of lab 12's modes (default step; static
               shapes compiled, replayed from CUDA graphs; the same with overlap scheduling): against the roofline
    tests      `pytest -m gpu`
    notebooks  the GPU-tier cells of the solution notebooks, executed

Every `check_speedup` call also appends its figures to `gpu_check.<device class>.measurements.jsonl`, copied into the
report. A part that finished is not run again: a second `make gpu-check` resumes with the first part that did not finish
(crashed, timed out, or was killed), `--fresh` starts over. Each graded check runs with its calibrated threshold;
where the GPU class has none (or the calibration found the reference and slow implementations overlapping) the
check's figures are still measured and the row says "uncalibrated ...; run `make calibrate`".
Figures sit next to the course's targets (TARGETS): those are the course's expectations for an H100, not the
graded thresholds, which come from calibration. Without a GPU it says so and exits 2: nothing was checked.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import nbformat

from autograder.checking import thresholds
from autograder.paths import CALIBRATION_DIR, REPO_ROOT

NO_GPU_EXIT = 2
CELL_TIMEOUT_S = 600
PARTS = ["machine", "lab01", "lab03", "lab04", "lab05", "lab08", "lab12", "tests", "notebooks"]
GPU_NOTEBOOKS = ["01_kv_cache", "03_continuous_batching", "04_flash_attention", "05_quantization"]

# The course's expectations for the reference implementations on an H100 (what the labs' text states). They are
# reported next to the measured figures; the graded thresholds are the calibrated ones (autograder/checking/thresholds.py).
TARGETS = {
    "flash_vs_sdpa_flash": (0.8, "flash forward >= 0.8x SDPA-flash (T=4096, d=64, causal, fp16, H100)"),
    "flash_vs_naive": (5.0, "flash forward >= 5x naive attention (T=4096, d=64, causal, fp16, H100)"),
    "paged_vs_gather": (2.0, "paged decode >= 2x gather-then-SDPA (batch 32, context 8k, H100)"),
    "fwd_bwd_vs_sdpa_flash": (0.5, "flash fwd+bwd >= 0.5x SDPA-flash fwd+bwd (T=4096, d=64, causal, fp16, H100)"),
    "causal_fast_path": (1.0, "causal fast path >= 1.0x the single masked loop (T=4096, d=64, fp16)"),
    "memory_growth": (2.0, "peak extra memory ~2x per doubling of T (O(T)), naive 4x"),
    "gemv_int8": (1.6, "INT8 GEMV >= 1.6x bf16 matmul (8192 x 8192, batch 1, H100)"),
    "gemv_int4": (2.5, "INT4 GEMV >= 2.5x bf16 matmul (8192 x 8192, batch 1, H100)"),
    "engine_batch1_roofline": (0.5, "one request's decode >= 50% of the bandwidth roofline (1B Llama shape, bf16)"),
}


# ---------------------------------------------------------------------------------------------------------------
# Running graded checks: with the calibrated threshold when there is one, figures only when there is not
# ---------------------------------------------------------------------------------------------------------------

def graded(checks: list[str], run: Callable[[], dict], device_class: str, *, at_most: bool = False) -> dict[str, Any]:
    """Run one graded check on the reference: {"status": passed | failed | not graded, "why", "result"}."""
    whys = [why for c in checks for f, why in [thresholds.status(c, device_class)] if f is None]
    if whys:
        with thresholds.fixed(math.inf if at_most else 0.0):
            return {"status": "not graded", "why": "; ".join(whys), "result": run()}
    try:
        return {"status": "passed", "why": "", "result": run()}
    except AssertionError as err:
        return {"status": "failed", "why": str(err)[:500], "result": None}


def _row(part: str, figure: str, measured: float | None, *, target: str | None = None, unit: str = "x",
         check: dict | None = None) -> dict[str, Any]:
    graded_as = "-" if check is None else (check["status"] + (f" ({check['why']})" if check["why"] else ""))
    return {"part": part, "figure": figure, "measured": measured, "unit": unit, "target": target, "graded": graded_as}


# ---------------------------------------------------------------------------------------------------------------
# The parts (each returns {"figures": [rows], "details": {...}})
# ---------------------------------------------------------------------------------------------------------------

def part_machine(ctx: dict) -> dict:
    from autograder.gpu_bench import machine_peaks
    peaks = machine_peaks("cuda")
    ctx["peaks"] = peaks
    return {"figures": [_row("machine", "memory bandwidth (1 GiB copy)", peaks["bandwidth_GBps"], unit="GB/s"),
                        _row("machine", "bf16 matmul 8192^3", peaks["matmul_TFLOPs"], unit="TFLOP/s")],
            "details": peaks}


def part_lab01(ctx: dict) -> dict:
    from autograder.lab01 import GRAPH_SPEED_CHECK, check_graphed_decode
    from minigpt.engine.cuda_graph import GraphedDecodeStep
    c = graded([GRAPH_SPEED_CHECK], lambda: check_graphed_decode(GraphedDecodeStep), ctx["device_class"])
    r = c["result"] or {}
    return {"figures": [_row("lab01", "CUDA-graph decode over eager (64 steps, target shape)",
                             r.get("reference_speedup"), check=c)], "details": c}


def part_lab03(ctx: dict) -> dict:
    from autograder.lab03 import GPU_SPEED_CHECK, check_continuous_speedup_gpu
    from minigpt.engine.packed_batch import pack_chunks
    from minigpt.engine.scheduler import Scheduler
    c = graded([GPU_SPEED_CHECK], lambda: check_continuous_speedup_gpu(Scheduler, pack_chunks, allow_reference=True),
               ctx["device_class"])
    r = c["result"] or {}
    return {"figures": [_row("lab03", "continuous over static batching, wall time (skewed workload)",
                             r.get("reference_speedup"), target="2.59x fewer model steps (CPU tier's count)",
                             check=c)], "details": c}


def part_lab04(ctx: dict) -> dict:
    from autograder import lab04
    from autograder.gpu_bench import flash_backward_sweep, flash_forward_sweep, paged_decode_sweep
    from minigpt.kernels.flash_attention import FlashAttentionFunction, flash_attention_forward
    from minigpt.kernels.paged_decode import paged_decode

    dc = ctx["device_class"]
    flash = lambda q, k, v, c: flash_attention_forward(q, k, v, causal=c)        # noqa: E731
    speed = graded([lab04.FLASH_SPEED_CHECK], lambda: lab04.check_flash_speed(flash), dc)
    decode = graded([lab04.DECODE_SPEED_CHECK], lambda: lab04.check_paged_decode_speed(paged_decode), dc)
    memory = graded([lab04.MEMORY_CHECK], lambda: lab04.check_flash_memory(flash), dc, at_most=True)
    backward = graded([lab04.BACKWARD_SPEED_CHECK], lambda: lab04.check_flash_backward_speed(FlashAttentionFunction),
                      dc)
    fast_path = lab04.causal_fast_path_speedup()
    fast_path_128 = lab04.causal_fast_path_speedup(head_dim=128)      # more spills than the single loop (kernels_aot.md)
    backward_sweep = flash_backward_sweep([1024, 2048, 4096, 8192, 16384])
    bwd_4k = next(r for r in backward_sweep if r["T"] == 4096 and r["head_dim"] == 64 and r["dtype"] == "float16")
    sweep = flash_forward_sweep([512, 1024, 2048, 4096, 8192, 16384])
    at_4k = next(r for r in sweep["rows"] if r["T"] == 4096)
    decode_sweep = paged_decode_sweep([1024, 2048, 4096, 8192, 16384, 32768])
    at_8k = next(r for r in decode_sweep if r["context"] == 8192)
    figures = [
        _row("lab04", "flash forward over naive (graded check, T=4096)", (speed["result"] or {}).get("reference_speedup"),
             target=TARGETS["flash_vs_naive"][1], check=speed),
        _row("lab04", "flash forward vs SDPA-flash (sweep, T=4096)", at_4k["reference_vs_sdpa"],
             target=TARGETS["flash_vs_sdpa_flash"][1]),
        _row("lab04", "flash forward TFLOP/s (T=4096)", at_4k["reference_TFLOPs"], unit="TFLOP/s",
             target=_of_peak(at_4k["reference_TFLOPs"], ctx)),
        _row("lab04", "causal fast path over the single masked loop (T=4096, d=64, fp16)", fast_path["speedup"],
             target=TARGETS["causal_fast_path"][1]),
        _row("lab04", "causal fast path over the single masked loop (T=4096, d=128, fp16)", fast_path_128["speedup"],
             target=TARGETS["causal_fast_path"][1]),
        _row("lab04", "flash fwd+bwd over SDPA-flash fwd+bwd (graded check, T=4096)",
             (backward["result"] or {}).get("reference_speedup"), target=TARGETS["fwd_bwd_vs_sdpa_flash"][1],
             check=backward),
        _row("lab04", "flash fwd+bwd vs SDPA-flash (sweep, T=4096, d=64, fp16)", bwd_4k["reference_vs_sdpa"],
             target=TARGETS["fwd_bwd_vs_sdpa_flash"][1]),
        _row("lab04", "paged decode over gather-then-SDPA (graded check)", (decode["result"] or {}).get("reference_speedup"),
             target=TARGETS["paged_vs_gather"][1], check=decode),
        _row("lab04", "paged decode GB/s of K and V (context 8k)", at_8k["paged_decode_GBps"], unit="GB/s",
             target=_of_bandwidth(at_8k["paged_decode_GBps"], ctx)),
        _row("lab04", "flash forward peak-memory growth per doubling of T", (memory["result"] or {}).get("max_growth"),
             target=TARGETS["memory_growth"][1], check=memory),
    ]
    if sweep["naive_stopped"]:
        figures.append(_row("lab04", sweep["naive_stopped"], None))
    return {"figures": figures, "details": {"flash_speed": speed, "paged_decode_speed": decode, "memory": memory,
                                            "forward_sweep": sweep, "decode_sweep": decode_sweep,
                                            "causal_fast_path": [fast_path, fast_path_128], "backward_speed": backward,
                                            "backward_sweep": backward_sweep}}


def part_lab05(ctx: dict) -> dict:
    from autograder import lab05
    from autograder.gpu_bench import gemv_table
    from minigpt.kernels.dequant_gemv import dequant_gemv

    figures, details = [], {}
    for bits in (8, 4):
        c = graded([lab05.GEMV_SPEED_CHECKS[bits]], lambda: lab05.check_gemv_speed(dequant_gemv, bits=(bits,)),
                   ctx["device_class"])
        r = (c["result"] or {}).get(f"int{bits}", {})
        figures.append(_row("lab05", f"INT{bits} GEMV over bf16 matmul (graded check, 8192^2)",
                            r.get("reference_speedup"), target=TARGETS[f"gemv_int{bits}"][1], check=c))
        figures.append(_row("lab05", f"INT{bits} GEMV GB/s of weights", r.get("GB/s"), unit="GB/s",
                            target=_of_bandwidth(r.get("GB/s"), ctx)))
        details[f"int{bits}"] = c
    details["table"] = gemv_table([4096, 8192, 16384])
    return {"figures": figures, "details": details}


def part_lab08(ctx: dict) -> dict:
    from autograder.gpu_bench import engine_throughput
    r = engine_throughput(bandwidth_GBps=(ctx.get("peaks") or {}).get("bandwidth_GBps"))
    return {"figures": [
        _row("lab08", f"LLMEngine, {r['requests']} requests at once, 1B Llama shape", r["batch_tokens_per_s"],
             unit="tok/s"),
        _row("lab08", "LLMEngine, one request alone", r["alone_tokens_per_s"], unit="tok/s",
             target=(f"bandwidth roofline {1e3 / r['decode_step_floor_ms']:.0f} tok/s "
                     f"({r['alone_fraction_of_roofline']:.0%} reached)") if "decode_step_floor_ms" in r else None),
        _row("lab08", "batched over alone", r["batch_over_alone"])], "details": r}


def part_lab12(ctx: dict) -> dict:
    """One request alone on the 1B Llama shape, per engine mode, against the bandwidth roofline (a course target,
    reported with the figures: missing it is not a failure of the part)."""
    from autograder.gpu_bench import engine_batch1_modes
    r = engine_batch1_modes(bandwidth_GBps=(ctx.get("peaks") or {}).get("bandwidth_GBps"))
    goal, what = TARGETS["engine_batch1_roofline"]
    figures = []
    for mode, m in r["modes"].items():
        reached = m.get("fraction_of_roofline")
        target = what if reached is None else (f"{reached:.0%} of the roofline ({1e3 / r['decode_step_floor_ms']:.0f} "
                                               f"tok/s): {'met' if reached >= goal else 'not met'}; {what}")
        figures.append(_row("lab12", f"LLMEngine, one request alone, {mode} (compilations after warm-up: "
                                     f"{m['compilations_after_warm_up']})", m["tokens_per_s"], unit="tok/s",
                            target=target))
    return {"figures": figures, "details": r}


def part_tests(ctx: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        r = run_pytest_gpu(ctx["repo"], Path(tmp) / "junit.xml")
    return {"figures": [_row("tests", f"pytest -m gpu: {r['summary']}", None)], "details": r, "ok": r["exit_code"] in (0, 5)}


def part_notebooks(ctx: dict) -> dict:
    cells = {}
    for a in GPU_NOTEBOOKS:
        for nb_path in sorted((ctx["repo"] / "solutions" / a).glob("*.ipynb")):
            cells[a] = run_notebook(nb_path)
    figures = [_row("notebooks", f"{a}: {gid} {r['status']}: {r['detail'][:80]}", None)
               for a, cs in cells.items() for gid, r in cs.items()]
    return {"figures": figures, "details": cells, "ok": all(r["status"] == "passed" for cs in cells.values()
                                                            for r in cs.values())}


PART_FUNCTIONS: dict[str, Callable[[dict], dict]] = {
    "machine": part_machine, "lab01": part_lab01, "lab03": part_lab03, "lab04": part_lab04, "lab05": part_lab05,
    "lab08": part_lab08, "lab12": part_lab12, "tests": part_tests, "notebooks": part_notebooks}


def _of_peak(tflops: float | None, ctx: dict) -> str | None:
    peak = (ctx.get("peaks") or {}).get("matmul_TFLOPs")
    return f"{tflops / peak:.0%} of the measured matmul peak" if tflops and peak else None


def _of_bandwidth(gbps: float | None, ctx: dict) -> str | None:
    bw = (ctx.get("peaks") or {}).get("bandwidth_GBps")
    return f"{gbps / bw:.0%} of the measured bandwidth" if gbps and bw else None


# ---------------------------------------------------------------------------------------------------------------
# Resumable runs and the report
# ---------------------------------------------------------------------------------------------------------------

def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def run_parts(parts: dict[str, Callable[[dict], dict]], report: dict, path: Path, ctx: dict, *,
              log: Callable[[str], None] = print) -> dict:
    """Run each part not already "done" in `report`, writing the report (JSON and Markdown) after every part.

    A part that raises is recorded as "failed" with its traceback and the next part runs; a part that never returns
    (the process was killed) leaves no record, so the next call runs it again.
    """
    done = report.setdefault("parts", {})
    for name, fn in parts.items():
        if done.get(name, {}).get("status") == "done":
            log(f"{name}: done in an earlier run, skipped (--fresh runs it again)")
            continue
        log(f"{name} ...")
        started = time.perf_counter()
        try:
            out = fn(ctx)
            record = {"status": "done" if out.get("ok", True) else "failed", **out}
        except Exception as err:                              # record it and go on with the next part
            record = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:1000],
                      "traceback": traceback.format_exc()[-3000:], "figures": []}
        record["seconds"] = round(time.perf_counter() - started, 1)
        done[name] = record
        _write_json(path, report)
        path.with_suffix(".md").write_text(markdown(report))
        log(f"{name}: {record['status']} ({record['seconds']} s)")
    return report


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def markdown(report: dict) -> str:
    """The report as a Markdown table: each figure against the course's target, and how the graded check went."""
    lines = [f"# GPU tier on {report.get('device_name')} ({report.get('device_class')})", "",
             f"{report.get('date')}; torch {report.get('versions', {}).get('torch')}, "
             f"triton {report.get('versions', {}).get('triton')}, CUDA {report.get('versions', {}).get('cuda')}, "
             f"driver {report.get('versions', {}).get('driver')}.", "",
             "Targets are the course's expectations for an H100, not graded thresholds; graded thresholds are the "
             "calibrated ones (`make calibrate`).", "",
             "| part | figure | measured | course target / yardstick | graded check |", "|---|---|---|---|---|"]
    for name, part in report.get("parts", {}).items():
        if part.get("status") == "failed" and "error" in part:
            lines.append(f"| {name} | FAILED: {part['error'][:150]} | - | - | - |")
        for row in part.get("figures", []):
            measured = "-" if row["measured"] is None else f"{_fmt(row['measured'])} {row['unit']}"
            lines.append(f"| {row['part']} | {row['figure']} | {measured} | {row['target'] or '-'} | "
                         f"{row['graded'][:200]} |")
    return "\n".join(lines) + "\n"


def gpu_tier_cells(notebook: nbformat.NotebookNode) -> dict[str, int]:
    """{grade_id: cell index} of the graded cells gated by require_gpu(...)."""
    found = {}
    for i, cell in enumerate(notebook.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and "require_gpu(" in cell.source:
            found[meta["grade_id"]] = i
    return found


def cell_outcome(cell: nbformat.NotebookNode) -> dict[str, str]:
    """{"status": "passed" | "failed" | "not run", "detail": error or last output line} of an executed cell."""
    if cell.get("execution_count") is None:
        return {"status": "not run", "detail": "an earlier cell failed"}
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return {"status": "failed", "detail": f"{out.get('ename')}: {out.get('evalue')}"}
    text = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[-1].startswith("SKIPPED"):
        return {"status": "skipped", "detail": lines[-1]}
    return {"status": "passed", "detail": lines[-1] if lines else ""}


def run_notebook(path: Path) -> dict[str, dict[str, str]]:
    """Execute one solution notebook (in its folder) and report its GPU-tier cells."""
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    cells = gpu_tier_cells(nb)
    if not cells:
        return {}
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except Exception as exc:                      # a dead kernel or a timeout: report it on every cell not run
        return {gid: {"status": "failed", "detail": f"notebook stopped: {exc.__class__.__name__}: {exc}"}
                for gid in cells}
    return {gid: cell_outcome(nb.cells[i]) for gid, i in cells.items()}


def run_pytest_gpu(repo: Path, junit: Path) -> dict[str, object]:
    """`pytest -m gpu`: the counts from its JUnit report and its exit code."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={junit}"], cwd=repo, capture_output=True, text=True)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in counts}
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    return {"exit_code": proc.returncode, **counts, "summary": tail[0] if tail else ""}


def read_measurements(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def load_report(path: Path, device_class: str, fresh: bool) -> dict:
    """The report to resume (same device class), or a new one."""
    if not fresh and path.exists():
        try:
            old = json.loads(path.read_text())
            if old.get("device_class") == device_class:
                return old
        except json.JSONDecodeError:
            pass
    return {}


def main(repo: Path = REPO_ROOT, out_dir: Path | None = None, *, calibrate: bool = False, fresh: bool = False,
         only: list[str] | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: the GPU tier (its checks, benchmarks, pytest -m gpu and the GPU-tier cells of "
              "solutions/) needs one; nothing was run. Run `make gpu-check` on a machine with a CUDA GPU.")
        return NO_GPU_EXIT
    from autograder.gpu_tier.calibrate import versions
    from minigpt.timing import device_class

    dc = device_class("cuda")
    out_dir = out_dir or repo / CALIBRATION_DIR.relative_to(REPO_ROOT)
    path = out_dir / f"gpu_check.{dc}.json"
    report = load_report(path, dc, fresh)
    report.update({"device_name": torch.cuda.get_device_name(), "device_class": dc, "versions": versions("cuda"),
                   "date": datetime.date.today().isoformat()})
    parts = {n: PART_FUNCTIONS[n] for n in PARTS if not only or n in only}
    if calibrate:
        from autograder.gpu_tier import calibrate as calibration

        def part_calibrate(ctx: dict) -> dict:
            code = calibration.main(device="cuda")
            return {"figures": [_row("calibrate", f"make calibrate on this GPU: exit {code}", None)], "ok": code == 0}
        report.get("parts", {}).pop("calibrate", None)          # asked for: always run again
        parts = {"calibrate": part_calibrate, **parts}
    ctx = {"repo": repo, "device_class": dc, "peaks": report.get("parts", {}).get("machine", {}).get("details")}
    log = out_dir / f"gpu_check.{dc}.measurements.jsonl"             # every check_speedup call appends one line
    os.environ["COURSE_CALIBRATION_LOG"] = str(log)                   # (inherited by pytest and notebook kernels)
    run_parts(parts, report, path, ctx)
    report["speed_measurements"] = read_measurements(log)
    _write_json(path, report)
    print(markdown(report))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    failed = [n for n, p in report["parts"].items() if p.get("status") != "done"]
    return 1 if failed else 0
