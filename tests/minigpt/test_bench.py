"""The benchmark's logic, without timing anything that matters: slopes from synthetic timings, every candidate
generating the same tokens, bytes by lab 00's rule, figures and goals, and README's table equal to the committed
ledger's. No test here asserts a time."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from minigpt.bench import decode, ledger
from minigpt.bench.__main__ import figures
from minigpt.paths import REPO_ROOT, data_dir
from minigpt.costmodel.calculators import ModelShape, weight_bytes_read
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


# --- batching, serving and speculative decoding: their logic on tiny workloads, rows from fabricated sections ---

def _tiny_requests(lengths):
    from minigpt.engine.request import Request

    return [Request(i, [3 + i, 5, 7][: 1 + i % 3], n, arrival_time=0.0, stop_token_ids=())
            for i, n in enumerate(lengths)]


def test_every_batching_policy_serves_the_same_tokens(tiny_model):
    from minigpt.bench import batching

    requests = _tiny_requests([1, 2, 12, 1, 3, 1])
    assert batching.static_pool(requests, 2, block_size=4) == 4 + 2       # its 2 largest reservations: 15 and 5 tokens
    found = batching.compare_batching(tiny_model, requests, batch=2, seqs=4, block_size=4, repeats=1)
    p = found["policies"]
    assert set(p) == set(batching.POLICIES) and found["tokens_identical"]
    assert p["static"]["steps"] > p["continuous, same batch"]["steps"]   # a static batch waits for its longest answer
    assert found["output_lengths"]["max"] == 12 and found["pool_blocks"] == 6
    assert p["continuous, same batch"]["max_rows"] <= 2 < p["continuous, equal memory"]["max_rows"]
    section = {"workloads": {"long-tailed": found, "uniform": found}}
    rows = batching.figures(section)
    assert [r.get("goal") for r in rows] == [None, batching.GOAL, None, None]
    assert all(r["against"].startswith("static batching of 2") for r in rows)
    assert len(batching.notes(section)) == 3


def test_a_batching_policy_with_other_tokens_fails_loudly(tiny_model, monkeypatch):
    from minigpt.bench import batching

    real = batching.serve_policy

    def wrong(model, requests, policy, **kw):
        result = real(model, requests, policy, **kw)
        if policy == "continuous, equal memory" and len(requests) > 4:
            outputs = result.outputs()
            outputs[0] = [t + 1 for t in outputs[0]]
            result.outputs = lambda: outputs
        return result
    monkeypatch.setattr(batching, "serve_policy", wrong)
    with pytest.raises(RuntimeError, match="continuous, equal memory produced other tokens"):
        batching.compare_batching(tiny_model, _tiny_requests([2, 3, 1, 4, 2, 1]), batch=2, seqs=4, repeats=1)


def test_speculative_candidates_agree_and_the_fused_models_stand_in(tiny_model, tiny_config):
    from minigpt.bench import speculative
    from minigpt.model import GPT

    torch.manual_seed(1)
    draft = GPT(tiny_config).eval()
    x, pos = torch.tensor([[1, 2, 3]]), torch.arange(3)
    with torch.inference_mode():
        assert torch.allclose(speculative.FusedLM(tiny_model)(x, positions=pos), tiny_model(x, positions=pos),
                              atol=1e-5)
    found = speculative.compare_speculative(tiny_model, draft, [[1, 2, 3, 4], [5, 6, 7]], new_tokens=6, k=2, repeats=1)
    assert set(found["tokens_per_s"]) == set(speculative.CANDIDATES) and found["tokens_identical"]
    for form in ("model as written", "fused"):
        f = found["forms"][form]
        assert 0 <= f["alpha"] <= 1 and f["rounds"] >= 1 and f["predicted_speedup"] > 0
        assert set(f["step_costs"]["verify_s"]) == {"1", "2", "3"} and f["step_costs"]["target_prefill_s"] > 0
        outside = f["outside_model_calls"]
        assert 0 < outside["speculative_share"] < 1 and outside["greedy_per_token_s"] > 0
    rows = speculative.figures(found)
    assert [r["ratio"] for r in rows[:2]] == pytest.approx(
        [found["tokens_per_s"][a] / found["tokens_per_s"][b] for a, b in speculative.FORMS.values()])
    assert [r.get("goal") for r in rows] == [speculative.GOAL, speculative.GOAL, None, None, None, None]
    assert len(speculative.notes(found)) == 3


def test_speculative_fails_loudly_on_other_tokens(tiny_model, monkeypatch):
    from minigpt.bench import speculative

    monkeypatch.setattr(speculative, "generate_fused", lambda model, prompt, n, fused=None: [0] * n)
    with pytest.raises(RuntimeError, match="fused decode step produced other tokens"):
        speculative.compare_speculative(tiny_model, tiny_model, [[1, 2, 3]], new_tokens=4, k=2, repeats=1)


def test_the_draft_head_runs_in_the_same_comparison_against_greedy_decode(tiny_model, tiny_config):
    from minigpt.bench import speculative
    from minigpt.engine.draft_head import DraftHead
    from minigpt.engine.head_speculative import TreeShape
    from minigpt.model import GPT

    torch.manual_seed(2)
    draft, head = GPT(tiny_config).eval(), DraftHead(tiny_config).eval()
    shapes = (TreeShape(2), TreeShape(2, 2, 2))
    found = speculative.compare_speculative(tiny_model, draft, [[1, 2, 3, 4], [5, 6, 7]], new_tokens=6, k=2,
                                            repeats=1, head=head, shapes=shapes)
    names = [speculative.head_candidate(s) for s in shapes]
    assert set(found["tokens_per_s"]) == set(speculative.CANDIDATES) | set(names) and found["tokens_identical"]
    costs, chain, tree = found["head"]["costs"], found["head"]["shapes"]["chain of 2"], \
        found["head"]["shapes"]["tree (2, 2, 2)"]
    assert set(costs["verify_s"]) == {"3", "7"} and costs["head_call_s"] > 0
    assert len(chain["acceptance_by_position"]) == 2 and "acceptance_by_position" not in tree
    h, v = costs["head_call_s"] / costs["target_step_s"], costs["verify_s"]["7"] / costs["target_step_s"]
    assert tree["predicted_speedup"] == pytest.approx(tree["tokens_per_round"] / (2 * h + v))
    rows = speculative.figures(found)[6:]
    greedy = found["tokens_per_s"]["lab 01 generate_kv_cache"]
    assert [r["ratio"] for r in rows[:2]] == pytest.approx([found["tokens_per_s"][n] / greedy for n in names])
    assert [r.get("goal") for r in rows] == [speculative.GOAL] * 2 + [None] * 4
    assert rows[4]["ratio"] == pytest.approx(1 / h) and rows[5]["ratio"] == pytest.approx(1 / v)
    assert len(speculative.notes(found)) == 3 + 1 + 2 + 1


def test_shape_parents_lay_out_as_many_nodes_a_level_as_grow_tree(tiny_model, tiny_config):
    from minigpt.bench.speculative import shape_parents
    from minigpt.engine.draft_head import DraftHead, head_cache
    from minigpt.engine.head_speculative import TreeShape, grow_tree
    from minigpt.engine.token_tree import tree_attention_inputs

    assert shape_parents(TreeShape(3, 2, 2)) == [-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert shape_parents(TreeShape(4)) == [-1, 0, 1, 2, 3]
    torch.manual_seed(3)
    head = DraftHead(tiny_config).eval()
    for shape in (TreeShape(2), TreeShape(4, 2, 2), TreeShape(3, 1, 3), TreeShape(2, 3, 2)):
        with torch.inference_mode():
            tree = grow_tree(head, tiny_model, head_cache(head, 32), torch.zeros(3, tiny_config.d_model), [1, 2, 3],
                             shape)
        grown = sorted(tree_attention_inputs(tree.parents, 0)[1].tolist())          # each node's depth
        laid = sorted(tree_attention_inputs(shape_parents(shape), 0)[1].tolist())
        assert laid == grown, f"{shape}: grow_tree makes nodes at depths {grown}, shape_parents {laid}"


def test_the_draft_head_goal_note_computes_why_it_is_not_met():
    from minigpt.bench import speculative

    def shape(depth, nodes, per_round, h=0.3, step=0.005, verify=None):
        v = verify / step
        return {"shape": [depth, 1, 1] if nodes == depth + 1 else [depth, 2, 2], "nodes": nodes, "rounds": 10,
                "tokens_per_round": per_round, "head_share": h, "verify_steps": v, "steps_per_round": depth * h + v,
                "predicted_speedup": per_round / (depth * h + v)}
    section = {"settings": {"head": "draft-head"},
               "tokens_per_s": {"lab 01 generate_kv_cache": 200.0, "draft head, chain of 2": 220.0,
                                "draft head, tree (3, 2, 2)": 180.0},
               "head": {"costs": {"context": 64, "target_step_s": 0.005, "head_call_s": 0.0015,
                                  "verify_s": {"3": 0.006, "11": 0.0095}, "target_weight_bytes": 44e6,
                                  "head_weight_bytes": 13.8e6},
                        "shapes": {"chain of 2": shape(2, 3, 2.4, verify=0.006),
                                   "tree (3, 2, 2)": shape(3, 11, 3.0, verify=0.0095)}}}
    why = speculative._head_notes(section)[-1]
    assert "not met; the best, the chain of 2, gives 1.10x" in why, why
    assert "h = 0.30 a head call, v = 1.20 to 1.90 steps for 3 to 11 nodes" in why, why
    assert "2.70 for the chain of 2 (at most 3) against 2.40 measured" in why, why       # 1.5 (2 x 0.3 + 1.2)
    assert "4.20 for the tree (3, 2, 2) (at most 4) against 3.00 measured" in why, why    # 1.5 (3 x 0.3 + 1.9)
    section["tokens_per_s"]["draft head, chain of 2"] = 320.0
    assert speculative._head_notes(section)[-1].endswith("met by the chain of 2 (1.60x).")


def test_natural_prompts_are_corpus_windows_of_the_asked_lengths():
    from minigpt.bench.speculative import natural_prompts

    prompts = natural_prompts(5, (32, 64), seed=3)
    assert len(prompts) == 5 and all(32 <= len(p) <= 64 for p in prompts)
    assert prompts == natural_prompts(5, (32, 64), seed=3)


def test_serving_rows_from_two_servers_in_this_process():
    from minigpt.bench import serving
    from minigpt.serving.experiments import compare_engines

    cmp = compare_engines((50.0, math.inf), checkpoint="draft", num_requests=2, prompt_tokens=8, max_tokens=4,
                          max_duration=30)
    settings = {**serving.settings(quick=True), "checkpoint": "draft", "num_requests": 2, "prompt_tokens": 8,
                "max_tokens": 4, "low_rate": 50.0}
    section = {"settings": settings, "points": serving.summarize(cmp, 50.0)}
    assert section["points"]["saturation"]["continuous"]["served"] == 2
    rows = serving.figures(section)
    low = section["points"]["low load"]
    itl = rows[1]
    assert itl["ratio"] == pytest.approx(low["naive"]["itl_s"]["50"] / low["continuous"]["itl_s"]["50"])
    assert [r.get("goal") for r in rows] == [serving.SATURATION_GOAL, serving.ITL_GOAL, None, None]
    assert "2/2 served" in serving.notes(section)[0]


def _fabricated_parts():
    """A ledger's batching, serving and speculative sections with made-up numbers (their rows and notes only)."""
    from minigpt.bench import batching, serving, speculative

    def policy(tps, steps, rows):
        return {"tokens_per_s": tps, "steps": steps, "rows_per_step": rows, "max_rows": 32, "preemptions": 0}

    def workload(static, same, equal):
        return {"requests": 128, "pool_blocks": 99, "batch": 8, "equal_memory_seqs": 32,
                "output_lengths": {"p50": 8.0, "p90": 59.0, "max": 256, "total": 3047},
                "policies": dict(zip(batching.POLICIES, (static, same, equal)))}

    def point(tps, itl50, itl99, ttft99):
        return {"output_tokens_per_s": tps, "served": 32, "requests": 32, "itl_s": {"50": itl50, "99": itl99},
                "ttft_s": {"99": ttft99}}

    parts = {
        "batching": {"workloads": {"long-tailed": workload(policy(225, 1646, 1.9), policy(478, 466, 6.5),
                                                           policy(889, 257, 12.0)),
                                   "uniform": workload(policy(547, 512, 8.0), policy(630, 513, 8.0),
                                                       policy(1126, 130, 31.0))}},
        "serving": {"settings": serving.settings(quick=False),
                    "points": {"low load": {"naive": point(60, 0.006, 0.010, 0.928),
                                            "continuous": point(60, 0.007, 0.015, 0.067)},
                               "saturation": {"naive": point(171.9, 0.006, 0.01, 5.0),
                                              "continuous": point(975.8, 0.03, 0.05, 0.5)}}},
        "speculative": {"settings": {"prompts": 8, "prompt_tokens": [40, 60], "new_tokens": 64, "k": 4},
                        "tokens_per_s": dict(zip(speculative.CANDIDATES, (200.0, 320.0, 260.0, 420.0, 180.0, 190.0))),
                        "forms": {form: {"alpha": 0.79, "tokens_per_round": 3.3, "formula_tokens_per_round": 3.27,
                                         "predicted_speedup": 1.4,
                                         "outside_model_calls": {"speculative_per_round_s": 0.0015,
                                                                 "speculative_share": 0.12,
                                                                 "greedy_per_token_s": 0.0004, "greedy_share": 0.08},
                                         "step_costs": {"target_step_s": 0.004, "draft_step_s": 0.001,
                                                        "verify_s": {"5": 0.0055}}}
                                  for form in ("model as written", "fused")}},
    }
    modules = {"batching": batching, "serving": serving, "speculative": speculative}
    for name, part in parts.items():
        part["notes"] = modules[name].notes(part)
        part["measured"] = {"command": "python -m minigpt.bench --only " + name, "date": "2026-11-26",
                            "quick": False, "load_before": 0.1, "load_after": 0.2}
    return parts


def _decode_only() -> dict:
    """The committed ledger without its batching, serving, speculative, structured, overheads, kv_engine and
    kv_hierarchy parts (the tests add fabricated ones)."""
    led = {k: v for k, v in copy.deepcopy(ledger.read(data_dir() / "bench")).items()
           if k not in ("batching", "serving", "speculative", "structured", "overheads", "kv_engine", "kv_hierarchy")}
    led["figures"] = figures(led)
    return led


def test_the_new_parts_render_their_rows_goals_and_notes():
    led = _decode_only()
    before = ledger.render_table(led)
    led.update(_fabricated_parts())
    led["figures"] = figures(led)
    table = ledger.render_table(led)
    assert table.startswith(before.split("\n\nWhere")[0])                       # the decode rows come first, unchanged
    lines = table.splitlines()
    row = lambda start: next(l for l in lines if l.startswith(f"| {start}"))   # noqa: E731
    assert row("continuous batching, max 32 sequences in the same 99 blocks, long-tailed").endswith(
        "| static batching of 8 (1646 steps): 225 tok/s | 3.95x | >= 3x met |")
    assert row("continuous batching, max 8 sequences, uniform").endswith("| 1.15x |  |")
    assert row("serving, 32 requests at once").endswith("| 5.68x | >= 5x met |")
    assert row("serving at 1 req/s: inter-token latency p50").endswith(
        "| 7 ms | naive server: 6 ms | 0.86x | >= 1x **not met** |")
    assert row("speculative decoding, k=4, draft model (model as written) | 260").endswith(
        "| 1.30x | >= 1.5x **not met** |")
    assert row("speculative decoding, k=4, draft model (fused) | 420").endswith("| 1.31x | >= 1.5x **not met** |")
    assert row("speculative decoding: acceptance rate").split("|")[2].strip() == "79%"
    assert "- batching measured on its own, `python -m minigpt.bench --only batching`" in table
    assert "- long-tailed outputs (p50 8, p90 59, max 256 tokens), 128 requests, 99-block pool: a static" in table


def test_a_part_measured_alone_is_merged_into_the_ledger(monkeypatch):
    from minigpt.bench import __main__ as bench

    committed = _decode_only()
    fabricated = _fabricated_parts()["serving"]
    monkeypatch.setattr(bench.serving, "measure_serving", lambda **_: copy.deepcopy(
        {k: v for k, v in fabricated.items() if k not in ("notes", "measured")}))
    led = bench.measure(quick=True, quiet=True, parts=("serving",), base=copy.deepcopy(committed))
    assert led["figures"][:len(committed["figures"])] == committed["figures"]
    assert [r["what"] for r in led["figures"][len(committed["figures"]):]] == [r["what"] for r in
                                                                                bench.serving.figures(fabricated)]
    assert led["date"] == committed["date"] and led["serving"]["measured"]["command"] == \
        "python -m minigpt.bench --quick --only serving"
    alone = bench.measure(quick=True, quiet=True, parts=("serving",))              # no ledger yet: a header of its own
    assert "batch1" not in alone and alone["machine"]["load_after"] is not None
    assert "serving measured on its own" not in ledger.render_table(alone)
    with pytest.raises(ValueError, match="unknown parts"):
        bench.measure(quick=True, quiet=True, parts=("warp drive",))


def test_the_overheads_rows_compare_each_mode_with_the_default_engine():
    from minigpt.bench import overheads

    def row(seconds: float, mbu: float | None = None) -> dict:
        return {"seconds_per_token": seconds, "samples_s": [seconds], **({"mbu_percent": mbu} if mbu else {})}
    section = {"settings": overheads.settings(quick=False), "compile_s": 12.0, "compilations": 2,
               "results": {"1": {"default": row(0.008, 40.0), "overlapped": row(0.010, 32.0),
                                 "static compiled": row(0.005, 64.0), "batch-invariant": row(0.02, 16.0)},
                           "8": {"default": row(0.002), "overlapped": row(0.0025), "batch-invariant": row(0.004)}}}
    rows = {r["what"].split(":")[0]: r for r in overheads.figures(section)}
    assert rows["overlap scheduling, batch 1"]["ratio"] == pytest.approx(0.8)
    assert rows["overlap scheduling, 8 requests at once"]["ratio"] == pytest.approx(0.8)
    assert rows["static shapes, batch 1"]["ratio"] == pytest.approx(1.6)
    assert rows["batch-invariant mode, 8 requests"]["ratio"] == pytest.approx(0.5)
    assert "2 graph(s) compiled in the warm-up (12 s)" in overheads.notes(section)[0]
