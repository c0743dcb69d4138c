"""`make gpu-check`: says plainly when there is no GPU, finds the GPU-tier cells, reads their outcomes,
and collects what the speed checks measured."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest
import torch

from autograder.gpu_tier import gpu_check
from autograder.harness import check_speedup, gpu_available


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU; the no-GPU message is for machines without one")
def test_without_a_gpu_it_says_so_and_checks_nothing(repo_root):
    proc = subprocess.run([sys.executable, "-m", "autograder", "gpu-check"], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode == gpu_check.NO_GPU_EXIT, proc.stdout + proc.stderr
    assert "no CUDA GPU here" in proc.stdout and "nothing was run" in proc.stdout


def test_finds_the_gpu_tier_cells_of_the_solutions(repo_root):
    nb = nbformat.read(str(repo_root / "solutions" / "01_kv_cache" / "01_kv_cache.ipynb"), as_version=4)
    cells = gpu_check.gpu_tier_cells(nb)
    assert cells, "lab 01 has a GPU-tier graded cell (the CUDA-graph decode step)"
    assert all("require_gpu(" in nb.cells[i].source for i in cells.values())


def test_cell_outcomes():
    ran = nbformat.v4.new_code_cell("x", execution_count=3,
                                    outputs=[nbformat.v4.new_output("stream", name="stdout", text="a\nspeedup 2.0x\n")])
    broke = nbformat.v4.new_code_cell("x", execution_count=4, outputs=[
        nbformat.v4.new_output("error", ename="AssertionError", evalue="too slow", traceback=[])])
    assert gpu_check.cell_outcome(ran) == {"status": "passed", "detail": "speedup 2.0x"}
    assert gpu_check.cell_outcome(broke) == {"status": "failed", "detail": "AssertionError: too slow"}
    assert gpu_check.cell_outcome(nbformat.v4.new_code_cell("x"))["status"] == "not run"


def test_speed_checks_log_their_measurements(tmp_path, monkeypatch):
    log = tmp_path / "m.jsonl"
    monkeypatch.setenv("COURSE_CALIBRATION_LOG", str(log))
    work = lambda n: (lambda: sum(range(n)))          # noqa: E731
    check_speedup(work(2000), work(20000), work(2000), what="toy", min_fraction={"cpu": 0.01}, repeats=3)
    [record] = gpu_check.read_measurements(log)
    assert record["what"] == "toy" and record["passed"] and record["speedup"] > 1
    assert json.loads(log.read_text())["threshold"] == pytest.approx(0.01 * record["reference_speedup"])


# --- resumable parts, the report, the memory cap (fakes on the CPU) ------------------------------------------------

def _parts(calls, fail=()):
    def part(name):
        def run(ctx):
            calls.append(name)
            if name in fail:
                raise RuntimeError(f"{name} broke")
            return {"figures": [gpu_check._row(name, f"{name} figure", 2.0, target="1.5x (course)")]}
        return run
    return {n: part(n) for n in ("machine", "lab01", "lab04")}


def test_a_second_run_resumes_with_the_part_that_failed(tmp_path):
    path = tmp_path / "gpu_check.cuda-sm90.json"
    calls = []
    report = gpu_check.run_parts(_parts(calls, fail={"lab01"}), {}, path, {}, log=lambda line: None)
    assert calls == ["machine", "lab01", "lab04"]
    assert report["parts"]["lab01"]["status"] == "failed" and "lab01 broke" in report["parts"]["lab01"]["error"]
    calls.clear()
    saved = json.loads(path.read_text())
    gpu_check.run_parts(_parts(calls), saved, path, {}, log=lambda line: None)
    assert calls == ["lab01"]
    assert all(p["status"] == "done" for p in json.loads(path.read_text())["parts"].values())


def test_a_killed_run_leaves_the_unfinished_part_to_the_next(tmp_path):
    path = tmp_path / "gpu_check.cuda-sm90.json"
    calls = []
    parts = _parts(calls)
    parts["lab01"] = lambda ctx: (_ for _ in ()).throw(KeyboardInterrupt())      # the process dies mid-part
    with pytest.raises(KeyboardInterrupt):
        gpu_check.run_parts(parts, {"device_class": "cuda-sm90"}, path, {}, log=lambda line: None)
    saved = gpu_check.load_report(path, "cuda-sm90", fresh=False)
    assert set(saved["parts"]) == {"machine"}
    calls.clear()
    gpu_check.run_parts(_parts(calls), saved, path, {}, log=lambda line: None)
    assert calls == ["lab01", "lab04"]
    assert gpu_check.load_report(path, "cuda-sm80", fresh=False) == {}, "another GPU class starts afresh"
    assert gpu_check.load_report(path, "cuda-sm90", fresh=True) == {}


def test_markdown_report_puts_figures_next_to_targets_and_grading(tmp_path):
    report = {"device_name": "NVIDIA H100 80GB HBM3", "device_class": "cuda-sm90", "date": "2026-11-24",
              "versions": {"torch": "2.11", "triton": "3.6", "cuda": "12.8", "driver": "570"},
              "parts": {"lab04": {"status": "done", "figures": [gpu_check._row(
                  "lab04", "flash forward over naive", 6.2, target=gpu_check.TARGETS["flash_vs_naive"][1],
                  check={"status": "not graded", "why": "uncalibrated on NVIDIA H100; run `make calibrate`"})]},
                        "lab05": {"status": "failed", "error": "RuntimeError: out of memory", "figures": []}}}
    md = gpu_check.markdown(report)
    assert "NVIDIA H100 80GB HBM3" in md and "| lab04 | flash forward over naive | 6.2 x | flash forward >= 5x" in md
    assert "not graded (uncalibrated on NVIDIA H100; run `make calibrate`)" in md
    assert "| lab05 | FAILED: RuntimeError: out of memory" in md


def test_graded_check_without_calibration_still_measures(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CALIBRATION_DIR", str(tmp_path))
    work = lambda n: (lambda: sum(range(n)))          # noqa: E731
    run = lambda: check_speedup(work(200), work(2000), work(200), what="toy", check="toy_gpu", repeats=2)  # noqa: E731
    c = gpu_check.graded(["toy_gpu"], run, "cpu")
    assert c["status"] == "not graded" and "make calibrate" in c["why"] and c["result"]["reference_speedup"] > 0
    (tmp_path / "toy_gpu.cpu.json").write_text(json.dumps({"graded": True, "threshold": 1e6}))
    assert gpu_check.graded(["toy_gpu"], run, "cpu")["status"] == "failed"


def test_naive_attention_sweep_stops_where_its_scores_would_not_fit():
    from autograder.gpu_bench import HEADROOM, flash_forward_sweep, naive_attention_bytes
    free = naive_attention_bytes(1, 2, 32, 32) / HEADROOM + 1          # room for T = 32, not T = 64
    timed = []

    def bench(fn, device):
        timed.append(fn)
        return 1e-3
    sweep = flash_forward_sweep([16, 32, 64, 128], batch=1, heads=2, head_dim=16, device="cpu", free=lambda: free,
                                bench=bench)
    naive = {r["T"]: r["naive_ms"] for r in sweep["rows"]}
    assert naive[16] and naive[32] and naive[64] is None and naive[128] is None
    assert sweep["naive_stopped"].startswith("naive attention stopped at T=64") and "free" in sweep["naive_stopped"]
    assert len(timed) == 4 * 2 + 2, "reference and SDPA at every T, naive only where it fits"
    assert naive_attention_bytes(4, 32, 8192, 8192) == 3 * 34_359_738_368     # the 34 GB score tensor, three times


@pytest.mark.parametrize("free_gb, runs, stops", [
    (85.0, [512, 1024, 2048, 4096], 8192),            # an 80 GB H100 (about 85e9 bytes free): 3 x 34.4 GB at T=8192
    (24.0, [512, 1024, 2048], 4096),                  # a 24 GB card
    (150.0, [512, 1024, 2048, 4096, 8192], 16384),    # an H200
    (2000.0, [512, 1024, 2048, 4096, 8192, 16384], None),
])
def test_naive_attention_plan_caps_the_notebook_sweep_by_free_memory(free_gb, runs, stops):
    from autograder.gpu_bench import naive_attention_plan
    got, note = naive_attention_plan([512, 1024, 2048, 4096, 8192, 16384], batch=4, heads=32, free=int(free_gb * 1e9))
    assert got == runs
    if stops is None:
        assert note is None
    else:
        assert note.startswith(f"naive attention stopped at T={stops}:") and f"{free_gb:.3g} GB free" in note


def test_benchmarks_run_on_the_cpu_on_small_shapes():
    from autograder import gpu_bench
    peaks = gpu_bench.machine_peaks("cpu", copy_mib=4, matmul_n=64)
    assert peaks["bandwidth_GBps"] > 0 and peaks["matmul_TFLOPs"] > 0
    [row] = gpu_bench.paged_decode_sweep([32], batch=2, heads=4, kv_heads=2, head_dim=16, device="cpu",
                                         bench=lambda fn, d: (fn(), 1e-3)[1])
    assert row["speedup"] == pytest.approx(1.0)
    [g] = gpu_bench.gemv_table([128], device="cpu", bench=lambda fn, d: (fn(), 1e-3)[1])
    assert g["int4_GBps"] < g["int8_GBps"], "INT4 moves half the bytes in the same (fake) time"
    r = gpu_bench.engine_throughput(config=dict(vocab_size=128, max_seq_len=48, d_model=32, n_layers=1, n_heads=2,
                                                n_kv_heads=1, d_ff=64), requests=3, prompt_len=4, max_tokens=4,
                                    device="cpu", dtype=torch.bfloat16, bandwidth_GBps=10.0)
    assert r["batch_tokens_per_s"] > 0 and 0 < r["alone_fraction_of_roofline"] < 1


def test_engine_batch1_modes_run_on_the_cpu_on_a_small_shape():
    """Lab 12's GPU-tier row, on the CPU (torch.compile's eager backend: no CUDA graph here): every mode serves one
    request on one engine, compiles its bucket in the warm-up and never after."""
    from autograder import gpu_bench
    modes = {name: {**fields, "compile_backend": "eager"} for name, fields in gpu_bench.BATCH1_MODES.items()}
    r = gpu_bench.engine_batch1_modes(config=dict(vocab_size=128, max_seq_len=48, d_model=32, n_layers=1, n_heads=2,
                                                  n_kv_heads=1, d_ff=64), prompt_len=4, max_tokens=6, device="cpu",
                                      dtype=torch.bfloat16, bandwidth_GBps=10.0, modes=modes, repeats=2)
    assert list(r["modes"]) == list(gpu_bench.BATCH1_MODES)
    for name, m in r["modes"].items():
        assert m["tokens_per_s"] > 0 and 0 < m["fraction_of_roofline"] < 1, name
        assert m["compilations_after_warm_up"] == 0, name
        assert (m["compilations"] >= 1) == ("static_decode" in gpu_bench.BATCH1_MODES[name]), name


def test_the_lab12_part_reports_each_mode_against_the_roofline(monkeypatch):
    from autograder import gpu_bench
    modes = {"default step": {"tokens_per_s": 400.0, "fraction_of_roofline": 0.2, "compilations_after_warm_up": 0},
             "static shapes, compiled": {"tokens_per_s": 1200.0, "fraction_of_roofline": 0.6,
                                         "compilations_after_warm_up": 0}}
    monkeypatch.setattr(gpu_bench, "engine_batch1_modes",
                        lambda **kw: {"decode_step_floor_ms": 0.5, "modes": modes, "kw": kw})
    out = gpu_check.part_lab12({"peaks": {"bandwidth_GBps": 4800.0}})
    assert out["details"]["kw"] == {"bandwidth_GBps": 4800.0} and "ok" not in out
    targets = [row["target"] for row in out["figures"]]
    assert targets[0].startswith("20% of the roofline (2000 tok/s): not met")
    assert targets[1].startswith("60% of the roofline (2000 tok/s): met")


def test_main_resumes_and_calibrates_when_asked(tmp_path, monkeypatch):
    """main() on a pretend GPU with fake parts: report files written, finished parts skipped on the second run,
    calibration run first only when asked."""
    import autograder.gpu_tier.calibrate as calibrate_mod
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Pretend GPU")
    monkeypatch.setattr("minigpt.timing.device_class", lambda device=None: "cuda-sm00")
    monkeypatch.setattr(calibrate_mod, "versions", lambda device: {"torch": torch.__version__})
    monkeypatch.setattr(calibrate_mod, "main", lambda **kw: calls.append(("calibrate", kw)) or 0)
    monkeypatch.setattr(gpu_check, "PART_FUNCTIONS", _parts(calls, fail={"lab04"}))
    monkeypatch.setattr(gpu_check, "PARTS", ["machine", "lab01", "lab04"])
    assert gpu_check.main(tmp_path, tmp_path) == 1                        # lab04 failed
    assert calls == ["machine", "lab01", "lab04"]
    assert (tmp_path / "gpu_check.cuda-sm00.md").read_text().count("| lab04 | FAILED") == 1
    calls.clear()
    monkeypatch.setattr(gpu_check, "PART_FUNCTIONS", _parts(calls))
    assert gpu_check.main(tmp_path, tmp_path, calibrate=True) == 0
    assert calls == [("calibrate", {"device": "cuda"}), "lab04"]
    report = json.loads((tmp_path / "gpu_check.cuda-sm00.json").read_text())
    assert report["device_name"] == "Pretend GPU" and list(report["parts"]) == ["machine", "lab01", "lab04", "calibrate"]
