"""minigpt.bench.kv_engine: the committed ledger's exact figures (prompt tokens found cached, preemptions, evictions,
steps) are what the engine finds now on the target model; the part runs end to end on a tiny configuration and its
rows compare the radix cache, alone and with its host tier, with the hash cache; caches whose tokens differ fail loudly; `--only kv_engine` merges
it into the ledger like any other part. No test here asserts a time."""

from __future__ import annotations

import copy

import pytest
import torch

from minigpt.bench import kv_engine, ledger
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.paths import data_dir
from minigpt.serving.trace import conversation_trace, trace_prompts

TINY = {"trace": {"seed": 0, "requests": 6}, "pools": [16], "repeats": 1}     # a pool that evicts what is asked again


@pytest.fixture(scope="module")
def tiny_lm() -> GPT:
    """A seeded random model over the course's 4,096 tokens with the target's context (the trace's prompts fit)."""
    config = ModelConfig(vocab_size=4096, max_seq_len=512, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
    with torch.random.fork_rng():                    # GPT's init draws from the global RNG: restored after
        torch.manual_seed(0)
        return GPT(config).eval()


@pytest.fixture(scope="module")
def committed() -> dict:
    section = ledger.read(data_dir() / "bench").get("kv_engine")
    assert section is not None, "data/bench/ledger.json has no kv_engine part: run " \
                                "`python -m minigpt.bench --only kv_engine` and `--readme`"
    return section


def test_the_committed_exact_figures_are_what_the_engine_finds_now(committed):
    from minigpt.checkpoint import load_model
    from minigpt.timing import fixed_threads
    from minigpt.training.data import load_tokens

    s = committed["settings"]
    records = conversation_trace(s["trace"]["seed"])[:s["trace"]["requests"]]
    prompts = trace_prompts(records, s["block_size"], load_tokens("val").tolist())
    model = load_model(s["model"])
    pools = kv_engine.exact(committed)["pools"]
    smallest = min(pools, key=int)              # the pool that evicts: one pool keeps the suite's time down
    with fixed_threads(s["threads"]):
        for pool, caches in [(smallest, pools[smallest])]:
            for name, counts in caches.items():
                found, _, _ = kv_engine.replay(model, records, prompts, kv_engine.CACHES[name], int(pool), s)
                assert found == counts, f"{pool} blocks, {name}: committed {counts}, a run now {found}: rerun the part"
    assert committed["notes"] == kv_engine.notes(committed)


def test_the_part_runs_on_a_tiny_configuration_and_its_rows_compare_radix_with_hash(tiny_lm):
    section = kv_engine.measure_kv_engine(tiny_lm, quick=True, overrides=TINY)
    caches = section["pools"]["16"]
    assert set(caches) == set(kv_engine.CACHES)
    assert all(c["output_tokens"] == section["trace"]["output_tokens"] for c in caches.values())
    assert caches["radix cache"]["evicted"] > 0 and caches["hash cache (lab 02)"]["evicted"] is None
    host = caches["radix cache + host tier"]
    assert host["restored_tokens"] > 0 and caches["radix cache"]["restored_tokens"] == 0
    assert host["hit_tokens"] > caches["radix cache"]["hit_tokens"], "the host tier should find more than the tree"
    rows = kv_engine.figures(section)
    assert [r["unit"] for r in rows] == ["tokens", "tok/s"] * 2
    assert rows[0]["value"] == caches["radix cache"]["hit_tokens"] and rows[2]["value"] == host["hit_tokens"]
    assert rows[0]["baseline"] == rows[2]["baseline"] == caches["hash cache (lab 02)"]["hit_tokens"]
    assert all(r["against"] == "hash cache (lab 02)" and "16-block pool" in r["what"] for r in rows)
    assert "measured here" in rows[1]["what"] and "measured" not in rows[0]["what"]
    assert rows[2]["what"].endswith("radix cache + host tier")
    lines = kv_engine.notes(section)
    assert len(lines) == 1 and lines[0].startswith("kv_engine (lab 13)") and "16 blocks: hash cache" in lines[0] and "(112 loaded back from host memory)" in lines[0]
    assert kv_engine.exact(section)["pools"]["16"]["radix cache"] == {k: caches["radix cache"][k]
                                                                      for k in kv_engine.EXACT}


@pytest.fixture
def radix_with_other_tokens(monkeypatch):
    """The wrong engine: the radix cache's run gives one request another token."""
    replay = kv_engine.replay

    def wrong(model, records, prompts, cache, pool, s):
        counts, tokens, busy = replay(model, records, prompts, cache, pool, s)
        if cache.get("prefix_cache") == "radix":
            tokens[0] = tokens[0][:-1] + [tokens[0][-1] + 1]
        return counts, tokens, busy
    monkeypatch.setattr(kv_engine, "replay", wrong)


def test_caches_whose_tokens_differ_fail_loudly(tiny_lm, radix_with_other_tokens):
    with pytest.raises(RuntimeError, match="greedy tokens differ"):
        kv_engine.measure_kv_engine(tiny_lm, quick=True, overrides=TINY)


def test_measured_alone_it_is_merged_into_the_ledger(committed, monkeypatch):
    from minigpt.bench import __main__ as bench

    base = {k: v for k, v in copy.deepcopy(ledger.read(data_dir() / "bench")).items() if k != "kv_engine"}
    base["figures"] = bench.figures(base)
    measured = {k: v for k, v in copy.deepcopy(committed).items() if k not in ("notes", "measured")}
    monkeypatch.setattr(bench.kv_engine, "measure_kv_engine", lambda *_, **__: copy.deepcopy(measured))
    monkeypatch.setattr(bench, "_model", lambda name: None)
    led = bench.measure(quick=True, quiet=True, parts=("kv_engine",), base=copy.deepcopy(base))
    rows = kv_engine.figures(measured)
    assert [r for r in led["figures"] if r not in base["figures"]] == rows
    assert led["kv_engine"]["measured"]["command"] == "python -m minigpt.bench --quick --only kv_engine"
    table = ledger.render_table(led)
    assert table.count("| KV engine") == len(rows) and "- kv_engine (lab 13): the engine on the target" in table
