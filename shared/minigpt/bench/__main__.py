"""python -m minigpt.bench [--quick] [--only decode,batching,serving,speculative,structured,overheads,kv_hierarchy,
kv_engine] [--out data/bench] [--readme]: see minigpt/bench/__init__.py."""

from __future__ import annotations

import argparse
import datetime
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

from minigpt.bench import batching, kv_engine, kv_hierarchy, ledger, overheads, serving, speculative, structured
from minigpt.bench.bandwidth import matmul_peak, memory_bandwidth
from minigpt.bench.decode import (BATCH1, decode_runs, matmul_passes, model_steps, per_token_seconds,
                                  profile_steps, step_cost)
from minigpt.timing import compare
from minigpt.paths import REPO_ROOT, data_dir

COURSE = ("lab 01 generate_kv_cache", "fused decode step", "serving engine")     # held to the goals
EAGER, COMPILED = "transformers generate (eager)", "transformers generate (static cache, compiled)"
MBU_GOAL, EAGER_GOAL, COMPILED_GOAL = 50.0, 1.3, 1.0
PARTS = {"decode": 4, "batching": 2, "serving": 1, "speculative": 1, "structured": 1, "overheads": 1,
         "kv_hierarchy": 1, "kv_engine": 1}                                   # what to run: progress steps


def _progress(total: int, quiet: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc="make bench", unit="part", disable=quiet, file=sys.stderr)


@cache
def _model(name: str) -> Any:
    from minigpt.checkpoint import load_model
    return load_model(name)


def _command(quick: bool, parts: tuple[str, ...]) -> str:
    only = "" if set(parts) == set(PARTS) else " --only " + ",".join(parts)
    return "python -m minigpt.bench" + (" --quick" if quick else "") + only


def measure(*, quick: bool, threads: int = 1, quiet: bool = False, parts: tuple[str, ...] = tuple(PARTS),
            base: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run of `parts` (all by default); the ledger (figures included). With `base`, an earlier ledger, the parts
    measured replace its own and the rest is kept."""
    if unknown := set(parts) - set(PARTS):
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {list(PARTS)}")
    bar = _progress(sum(PARTS[p] for p in parts), quiet)
    command = _command(quick, parts)
    led = dict(base) if base is not None else {}
    if "decode" in parts or not led:
        led.update({"command": command, "date": datetime.date.today().isoformat(), "machine": ledger.machine(),
                    "versions": ledger.versions(), "settings": {"quick": quick, "threads": threads}})
        led["machine"]["load_before"] = led["machine"].pop("load_1min")
    if "decode" in parts:
        led.update(measure_decode(quick=quick, threads=threads, bar=bar))
    for part in parts:
        if part == "decode":
            continue
        before = ledger.machine()["load_1min"]
        if part == "batching":
            section = batching.measure_batching(_model("target"), quick=quick, threads=threads, progress=bar.update)
        elif part == "serving":
            section = serving.measure_serving(quick=quick, threads=threads)
            bar.update()
        elif part == "speculative":
            section = speculative.measure_speculative(_model("target"), _model("draft"), quick=quick, threads=threads)
            bar.update()
        elif part == "structured":
            section = structured.measure_structured(_model("target"), quick=quick, threads=threads)
            bar.update()
        elif part == "kv_hierarchy":
            section = kv_hierarchy.measure_kv_hierarchy(quick=quick)
            bar.update()
        elif part == "kv_engine":
            section = kv_engine.measure_kv_engine(_model("target"), quick=quick, threads=threads)
            bar.update()
        else:
            bandwidth = (led.get("bandwidth") or {}).get("bytes_per_s")
            section = overheads.measure_overheads(_model("target"), quick=quick, threads=threads, bandwidth=bandwidth)
            bar.update()
        module = {"batching": batching, "serving": serving, "speculative": speculative, "structured": structured,
                  "overheads": overheads, "kv_hierarchy": kv_hierarchy, "kv_engine": kv_engine}[part]
        section["notes"] = module.notes(section)
        section["measured"] = {"command": command, "date": datetime.date.today().isoformat(), "quick": quick,
                               "load_before": before, "load_after": ledger.machine()["load_1min"]}
        led[part] = section
    if "decode" in parts or base is None:
        led["machine"]["load_after"] = ledger.machine()["load_1min"]
    led["figures"] = figures(led)
    bar.close()
    return led


def measure_decode(*, quick: bool, threads: int, bar: Any) -> dict[str, Any]:
    """Bandwidth, matmul peak, batch-1 decode and the batched steps: the ledger's settings and decode sections."""
    from minigpt.training.data import load_tokens

    torch.manual_seed(0)
    model = _model("target")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())      # a tied matrix counts once
    short, long = (16, 48) if quick else (32, 160)
    repeats = 5 if quick else 9
    prompt_len = 64
    tokens = load_tokens("val")
    prompt = tokens[:prompt_len].tolist()
    settings = {"quick": quick, "threads": threads, "prompt_tokens": prompt_len, "short": short, "long": long,
                "repeats": repeats, "batched": [8, 32], "dtype": "float32", "model": "target"}
    led: dict[str, Any] = {"settings": settings}

    kernels = memory_bandwidth(weights, threads=threads)
    best = max(kernels, key=lambda k: kernels[k]["bytes_per_s"])
    bandwidth = kernels[best]["bytes_per_s"]
    peak, peak_samples = matmul_peak(threads=threads)
    led["bandwidth"] = {"working_set_bytes": weights, "bytes_per_s": bandwidth, "kernel": best, "kernels": kernels,
                        "how": "read (sum), copy and triad of float32 buffers as large as the weights; bytes moved / "
                               "median seconds; MBU against the highest"}
    led["matmul"] = {"n": 1024, "flop_per_s": peak, "samples_s": peak_samples}
    bar.update()

    runs = decode_runs(model, prompt, long)
    slopes, raw = per_token_seconds(runs, short, long, repeats=repeats, threads=threads)
    context = prompt_len + (short + long) / 2
    flops, nbytes = step_cost(model, context)
    mbu = {name: 100 * nbytes / s / bandwidth for name, s in slopes.items()}
    with torch.inference_mode():
        passes = compare(matmul_passes(model), warmup=3, repeats=4 * repeats, threads=threads)
    weights_read = sum(p.numel() * p.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear)
                       for p in m.parameters(recurse=False))
    profiles = profile_steps(model, prompt)
    led["batch1"] = {"profile": profiles, "seconds_per_token": slopes, "bytes_per_token": nbytes, "flops_per_token": flops,
                     "mean_context": context, "mbu_percent": mbu, "roofline_seconds": nbytes / bandwidth,
                     "samples_s": raw,
                     "matmuls_alone": {name: {"seconds": t.median, "bytes": weights_read,
                                              "mbu_percent": 100 * weights_read / t.median / bandwidth,
                                              "samples_s": t.samples} for name, t in passes.items()}}
    bar.update()

    batched = {}
    for batch in settings["batched"]:
        prompts = tokens[prompt_len:prompt_len * (batch + 1)].view(batch, prompt_len)
        per_step, samples = per_token_seconds({f"batch {batch}": lambda n, p=prompts: model_steps(model, p, n)},
                                              short, long, repeats=repeats, threads=threads)
        step_flops, step_bytes = step_cost(model, context, batch)
        seconds = per_step[f"batch {batch}"]
        batched[str(batch)] = {"seconds_per_step": seconds, "flops_per_step": step_flops, "bytes_per_step": step_bytes,
                               "flop_per_s": step_flops / seconds, "samples_s": samples[f"batch {batch}"]}
    led["batched"] = batched
    bar.update(2)
    return led


def figures(led: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows, from the ledger's measurements: decode's, then those of each other part measured."""
    rows = decode_figures(led) if "batch1" in led else []
    for part, module in (("batching", batching), ("serving", serving), ("speculative", speculative),
                         ("structured", structured), ("overheads", overheads), ("kv_engine", kv_engine),
                         ("kv_hierarchy", kv_hierarchy)):
        if part in led:
            rows += module.figures(led[part])
    return rows


def decode_figures(led: dict[str, Any]) -> list[dict[str, Any]]:
    """The decode part's rows: bandwidth, peak, batch-1 decode against transformers, MBU, batched FLOP/s."""
    f = ledger.figure
    b1, bw = led["batch1"], led["bandwidth"]["bytes_per_s"]
    ms = {name: s * 1e3 for name, s in b1["seconds_per_token"].items()}
    mb = led["bandwidth"]["working_set_bytes"] / 1e6
    rows = [f(f"memory bandwidth, {mb:.0f} MB working set: {kernel}", entry["bytes_per_s"] / 1e9, "GB/s")
            for kernel, entry in led["bandwidth"]["kernels"].items()]
    rows += [
             f("matmul peak, 1024 x 1024 float32", led["matmul"]["flop_per_s"] / 1e9, "GFLOP/s"),
             f(f"batch-1 decode at the memory roofline ({b1['bytes_per_token'] / 1e6:.1f} MB per token at "
               f"{bw / 1e9:.1f} GB/s)", b1["roofline_seconds"] * 1e3, "ms/token")]
    for name in ms:
        rows.append(f(f"batch-1 decode: {name}", ms[name], "ms/token", against=EAGER if name != EAGER else None,
                      baseline=ms[EAGER] if name != EAGER else None, higher_is_better=False,
                      goal=EAGER_GOAL if name in COURSE else None))
    for name in COURSE:
        rows.append(f(f"batch-1 decode: {name}", ms[name], "ms/token", against=COMPILED, baseline=ms[COMPILED],
                      higher_is_better=False, goal=COMPILED_GOAL))
    for name, value in b1["mbu_percent"].items():
        rows.append(f(f"MBU: {name}", value, "%", goal=MBU_GOAL if name in COURSE else None, goal_of="value"))
    for name, entry in b1.get("matmuls_alone", {}).items():
        rows.append(f(f"MBU: {name} ({entry['seconds'] * 1e3:.2f} ms)", entry["mbu_percent"], "%"))
    peak = led["matmul"]["flop_per_s"]
    for batch, entry in led["batched"].items():
        rows.append(f(f"decode step at batch {batch} (model step)", entry["flop_per_s"] / 1e9, "GFLOP/s",
                      against="matmul peak", baseline=peak / 1e9))
    return rows


def plot(led: dict[str, Any], path: Path) -> None:
    """decode.png: batch-1 ms per token against the roofline (nothing without the decode part)."""
    if "batch1" not in led:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b1 = led["batch1"]
    names = list(b1["seconds_per_token"])
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.barh(names, [b1["seconds_per_token"][n] * 1e3 for n in names], color="#4c72b0")
    ax.axvline(b1["roofline_seconds"] * 1e3, color="#c44e52", linestyle="--",
               label=f"memory roofline ({led['bandwidth']['bytes_per_s'] / 1e9:.1f} GB/s, {led['bandwidth']['kernel']})")
    for name, entry in b1.get("matmuls_alone", {}).items():
        if "fused" in name:
            ax.axvline(entry["seconds"] * 1e3, color="#55a868", linestyle=":",
                       label="the fused step's 25 matmuls alone (the BLAS's one-row speed)")
    ax.set_xlabel("ms per token, batch 1, one thread (lower is better)")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.bench", description="The course's benchmark: one ledger.")
    ap.add_argument("--quick", action="store_true", help="fewer tokens, requests and repeats: a few minutes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run, of {','.join(PARTS)}; the others are kept from the ledger in "
                         "--out (if there is one)")
    ap.add_argument("--out", type=Path, default=data_dir() / "bench", help="folder of ledger.json, table.md, decode.png")
    ap.add_argument("--readme", action="store_true", help="only rewrite README's table (and the plot) from the ledger in --out")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.readme:
        plot(ledger.read(a.out), a.out / "decode.png")
        changed = ledger.sync_readme(REPO_ROOT / "README.md", ledger.render_table(ledger.read(a.out)))
        print("README's table " + ("rewritten" if changed else "already matches the ledger"))
        return 0
    parts = tuple(p.strip() for p in a.only.split(",") if p.strip())
    if not parts or set(parts) - set(PARTS):
        ap.error(f"--only takes a comma-separated list of {','.join(PARTS)}, got {a.only!r}")
    kept = (a.out / "ledger.json").exists() and set(parts) != set(PARTS)
    led = measure(quick=a.quick, threads=a.threads, quiet=a.quiet, parts=parts,
                  base=ledger.read(a.out) if kept else None)
    path = ledger.write(led, a.out)
    plot(led, a.out / "decode.png")
    print(ledger.render_table(led))
    plotted = f", {a.out / 'decode.png'}" if "batch1" in led else ""
    print(f"wrote {path}, {a.out / 'table.md'}{plotted}; `python -m minigpt.bench --readme` puts the table in README")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
