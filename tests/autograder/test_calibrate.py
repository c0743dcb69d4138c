"""`make calibrate`: how a threshold is chosen between the reference's runs and the slow implementations', the file it
writes, how the checks read it, and what an uncalibrated or ungraded device class does. Toy workloads and one real CPU
check on small shapes: a few seconds."""

from __future__ import annotations

import json

import pytest

from autograder.gpu_tier import calibrate
from autograder import harness
from autograder.checking import thresholds
from autograder.gpu_tier.calibrate import SpeedCheck, choose_threshold


def test_threshold_sits_between_reference_and_slow_runs_with_equal_margins():
    c = choose_threshold([0.9, 1.0, 1.1], {"slow": [0.2, 0.3]})
    assert c["graded"] and c["threshold"] == 0.52           # sqrt(0.9 * 0.3) = 0.5196, two digits
    assert 0.3 < c["threshold"] < 0.9
    assert c["margin_reference"] == pytest.approx(0.9 / 0.52 - 1, abs=1e-4)
    assert c["margin_slow"] == pytest.approx(0.52 / 0.3 - 1, abs=1e-4)


def test_overlapping_runs_leave_the_check_ungraded():
    c = choose_threshold([0.7, 1.0], {"slow a": [0.3], "slow b": [0.6]})
    assert not c["graded"] and c["threshold"] is None
    assert "overlap" in c["decision"] and c["separation"] == pytest.approx(0.7 / 0.6, abs=1e-4)


def test_memory_growth_is_bounded_from_above():
    c = choose_threshold([2.0, 2.1], {"naive": [4.0, 4.1]}, direction="at_most")
    assert c["graded"] and 2.1 < c["threshold"] < 4.0 and c["threshold"] == 2.9


def _toy_check(name: str) -> SpeedCheck:
    """A speed check on a clock of its own: baseline 4 units, reference 1 unit, a slow implementation 3 units (each
    call returns its cost, which `_costs_as_time` makes the measured time: no verdict depends on the machine's speed
    or load)."""
    unit = 2e-3

    def sleeper(n: float):
        return lambda: n * unit

    def measure(impl, small, device):
        r = harness.check_speedup(impl, sleeper(4), sleeper(1), what="toy", check=name, repeats=3)
        return r["speedup"] / r["reference_speedup"]
    return SpeedCheck(name, "99", "cpu", "toy", measure, lambda: sleeper(1), {"three_units": lambda: sleeper(3)})


@pytest.fixture
def _costs_as_time(monkeypatch):
    """compare() times each call with time_call: here a call's time is the cost it returns."""
    monkeypatch.setattr("minigpt.timing.time_call", lambda fn, device="cpu": fn())


def test_calibration_file_is_what_the_check_reads(tmp_path, monkeypatch, _costs_as_time):
    monkeypatch.setenv("COURSE_CALIBRATION_DIR", str(tmp_path))
    spec = _toy_check("toy_speed")
    with pytest.raises(thresholds.Uncalibrated, match=r"uncalibrated on .*run `make calibrate`"):
        spec.measure(spec.reference(), True, "cpu")
    result = calibrate.calibrate_check(spec, runs=3, log=lambda line: None)
    assert result["graded"], result
    assert len(result["measured"]["reference"]) == 3 and len(result["measured"]["three_units"]) == 3
    assert {"device_name", "versions", "date", "summary", "threshold", "decision"} <= set(result)
    path = thresholds.calibration_path("toy_speed", "cpu")
    path.write_text(json.dumps(result))
    assert thresholds.threshold("toy_speed", "cpu") == result["threshold"]
    spec.measure(spec.reference(), True, "cpu")                      # the reference passes at its own threshold
    with pytest.raises(AssertionError, match="speedup"):
        spec.measure(spec.slow["three_units"](), True, "cpu")      # the slow one fails


def test_ungraded_file_is_reported_not_guessed(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CALIBRATION_DIR", str(tmp_path))
    (tmp_path / "toy.cpu.json").write_text(json.dumps({"graded": False, "threshold": None, "decision": "overlap: ..."}))
    with pytest.raises(thresholds.Uncalibrated, match="ungraded on .*overlap"):
        thresholds.threshold("toy", "cpu")


def test_require_gpu_skips_an_uncalibrated_gpu_and_awards_nothing_under_autograde(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CALIBRATION_DIR", str(tmp_path))
    monkeypatch.setattr(harness, "gpu_available", lambda: True)
    monkeypatch.setattr("minigpt.timing.device_class", lambda device=None: "cuda-sm89")
    monkeypatch.setattr(thresholds, "device_name", lambda dc: "NVIDIA GeForce RTX 4090")
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert harness.require_gpu("flash speed", calibrated=["lab04_flash_speed"]) is False
    out = capsys.readouterr().out
    assert "SKIPPED" in out and "uncalibrated on NVIDIA GeForce RTX 4090" in out and "make calibrate" in out
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError, match="no points"):
        harness.require_gpu("flash speed", calibrated=["lab04_flash_speed"])
    (tmp_path / "lab04_flash_speed.cuda-sm89.json").write_text(json.dumps({"graded": True, "threshold": 0.6}))
    assert harness.require_gpu("flash speed", calibrated=["lab04_flash_speed"]) is True


def test_real_cpu_check_on_small_shapes(tmp_path):
    """`calibrate --small` on lab 05's INT4 CPU linear (512 x 512): a file with the device, versions and raw runs."""
    assert calibrate.main(check="lab05_int4_cpu_linear", runs=2, small=True, out_dir=tmp_path, device="cpu") == 0
    data = json.loads((tmp_path / "lab05_int4_cpu_linear.cpu.json").read_text())
    assert data["device_class"] == "cpu" and data["device_name"] and data["versions"]["torch"]
    assert len(data["measured"]["reference"]) == 2 and len(data["measured"]["dequantize_every_call"]) == 2
    assert data["shapes"].startswith("small")


def test_committed_cpu_thresholds_come_from_calibration():
    """Every CPU-tier speed check has a committed calibration at the checks' own shapes, graded, its threshold between
    the reference's worst run and the slow implementations' best; no GPU file in the repository lacks its device."""
    for spec in calibrate.REGISTRY:
        if spec.tier != "cpu":
            continue
        data = thresholds.read_calibration(spec.name, "cpu", thresholds.CALIBRATION_DIR)
        assert data is not None, f"{spec.name}: run `make calibrate` and commit autograder/calibration/"
        assert data["graded"] and data["shapes"] == "the check's own" and data["runs"] >= 3, spec.name
        assert set(data["measured"]) == {"reference", *spec.slow}
        assert data["best_slow_run"] < data["threshold"] < data["worst_reference_run"], spec.name
    for path in thresholds.CALIBRATION_DIR.glob("*.cuda*.json"):
        data = json.loads(path.read_text())
        if path.name.startswith("gpu_check."):                   # make gpu-check's report: figures per part
            assert data.get("device_name") and data.get("parts"), f"{path.name}: a GPU report without its GPU"
            continue
        assert data.get("device_name") and data.get("measured"), f"{path.name}: a GPU figure without its measurement"
        if data["graded"]:
            assert data["runs"] >= 3 and data["shapes"] == "the check's own", path.name
            direction = 1 if data["direction"] == "at_least" else -1
            assert direction * data["best_slow_run"] < direction * data["threshold"] \
                < direction * data["worst_reference_run"], path.name


def test_every_gpu_check_is_registered_with_a_slow_implementation():
    gpu = {s.name: s for s in calibrate.REGISTRY if s.tier == "gpu"}
    assert set(gpu) == {"lab01_cuda_graph_decode", "lab03_continuous_speedup_gpu", "lab04_flash_speed",
                        "lab04_paged_decode_speed", "lab04_flash_memory", "lab04_flash_backward_speed",
                        "lab05_dequant_gemv_int8",
                        "lab05_dequant_gemv_int4"}
    assert all(s.slow for s in gpu.values())
    assert 0 < calibrate.estimate_seconds("gpu") < 3600
