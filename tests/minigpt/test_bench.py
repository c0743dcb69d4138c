"""The benchmark's logic, without timing anything that matters: slopes from synthetic timings, every candidate
generating the same tokens, bytes by lab 00's rule, figures and goals, and README's table equal to the committed
ledger's. No test here asserts a time."""

from __future__ import annotations

import copy

import pytest

from minigpt.bench import decode, ledger
from minigpt.bench.__main__ import figures
from minigpt.paths import REPO_ROOT, data_dir
from minigpt.teaching.calculators import ModelShape, weight_bytes_read
from minigpt.timing import Timing


def test_per_token_seconds_is_the_slope_between_the_two_lengths(monkeypatch):
    fixed_cost, per_token = 0.5, 0.002                  # a call of n tokens takes fixed + n * per_token

    def fake_compare(candidates, **_):
        return {name: Timing(name, [fixed_cost + int(name.rsplit("@", 1)[1]) * per_token * k for k in (0.9, 1, 1.1)])
                for name in candidates}
    monkeypatch.setattr(decode, "compare", fake_compare)
    slopes, raw = decode.per_token_seconds({"a": lambda n: None}, 16, 48, repeats=3)
    assert slopes["a"] == pytest.approx(per_token, rel=1e-9)
    assert set(raw["a"]) == {"16", "48"}
    with pytest.raises(ValueError, match="short < long"):
        decode.per_token_seconds({"a": lambda n: None}, 48, 16, repeats=3)


def test_every_candidate_generates_the_same_greedy_tokens(tiny_model):
    prompt = [3, 1, 4, 1, 5]
    runs = decode.decode_runs(tiny_model, prompt, 6, names=("model step", "lab 01 generate_kv_cache",
                                                            "transformers generate (eager)"))
    course = runs["lab 01 generate_kv_cache"](6).tokens
    hf = runs["transformers generate (eager)"](6)[0, len(prompt):].tolist()
    last = runs["model step"](5)                       # the logits after 5 steps give the 6th token
    assert course == hf and int(last.argmax()) == course[-1]
    with pytest.raises(ValueError, match="unknown candidates"):
        decode.decode_runs(tiny_model, prompt, 6, names=("warp drive",))


def test_step_cost_is_lab_00s_rule_in_float32(tiny_model, tiny_config):
    shape = ModelShape.from_config(tiny_config, "tiny")
    context = 10
    flops, nbytes = decode.step_cost(tiny_model, context)
    kv = 2 * tiny_config.n_layers * tiny_config.n_kv_heads * tiny_config.head_dim * 4 * context
    assert nbytes == weight_bytes_read(shape, 1, 4) + kv
    assert decode.step_cost(tiny_model, context, batch=8)[0] == pytest.approx(8 * flops)


def test_figures_hold_the_course_to_its_goals():
    led = ledger.read(data_dir() / "bench")
    rows = {(r["what"], r.get("against")): r for r in figures(led)}
    engine = rows[("batch-1 decode: serving engine", "transformers generate (eager)")]
    assert engine["ratio"] == pytest.approx(engine["baseline"] / engine["value"]) and engine["goal"] == 1.3
    slower = copy.deepcopy(led)
    slower["batch1"]["seconds_per_token"]["serving engine"] = 10 * slower["batch1"]["seconds_per_token"][
        "transformers generate (eager)"]
    slower["batch1"]["mbu_percent"]["serving engine"] = 1.0
    rows = {(r["what"], r.get("against")): r for r in figures(slower)}
    assert not rows[("batch-1 decode: serving engine", "transformers generate (eager)")]["met"]
    assert not rows[("MBU: serving engine", None)]["met"]


def test_readme_carries_the_committed_ledgers_table():
    table = ledger.render_table(ledger.read(data_dir() / "bench"))
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"{ledger.BEGIN}\n{table}{ledger.END}" in readme, \
        "README's performance table differs from data/bench/ledger.json: run `python -m minigpt.bench --readme`"


def test_sync_readme_replaces_only_the_table(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{ledger.BEGIN}\nold\n{ledger.END}\nafter\n")
    assert ledger.sync_readme(readme, "new\n")
    assert readme.read_text() == f"before\n{ledger.BEGIN}\nnew\n{ledger.END}\nafter\n"
    assert not ledger.sync_readme(readme, "new\n")
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="no bench markers"):
        ledger.sync_readme(readme, "x\n")


def test_the_bandwidth_and_peak_are_computed_from_the_samples(monkeypatch):
    from minigpt.bench import bandwidth

    monkeypatch.setattr(bandwidth, "compare", lambda c, **_: {n: Timing(n, [0.001, 0.002, 0.003]) for n in c})
    kernels = bandwidth.memory_bandwidth(4_000_000)
    moved = {"read": 1, "copy": 2, "triad": 3, "gemv": 1_000_000 // 1024 * 1024 / 1_000_000}   # whole 1024-wide rows
    for kernel, entry in kernels.items():
        assert entry["bytes_per_s"] == pytest.approx(moved[kernel] * 4_000_000 / 0.002)
        assert entry["samples_s"] == [0.001, 0.002, 0.003]
    peak, _ = bandwidth.matmul_peak(64)
    assert peak == pytest.approx(2 * 64 ** 3 / 0.002)
