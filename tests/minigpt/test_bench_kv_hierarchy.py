"""minigpt.bench.kv_hierarchy: the part is exact (no model, nothing timed), so the committed ledger must hold what it
computes now; its rows compare each cache with the one below it and longest prefix first with first come, first
served; `make bench --only kv_hierarchy` merges it into the ledger like any other part."""

from __future__ import annotations

import copy

import pytest

from minigpt.bench import kv_hierarchy, ledger
from minigpt.paths import data_dir


@pytest.fixture(scope="module")
def section():
    return kv_hierarchy.measure_kv_hierarchy()


def test_the_committed_ledger_holds_what_the_part_computes_now(section):
    committed = ledger.read(data_dir() / "bench").get("kv_hierarchy")
    assert committed is not None, "data/bench/ledger.json has no kv_hierarchy part: run " \
                                  "`python -m minigpt.bench --only kv_hierarchy` and `--readme`"
    kept = {k: v for k, v in committed.items() if k not in ("notes", "measured")}
    assert kept == section, "the committed kv_hierarchy figures differ from a run now: rerun the part and --readme"
    assert committed["notes"] == kv_hierarchy.notes(section)


def test_the_rows_compare_each_cache_with_the_one_below_it(section):
    rows = kv_hierarchy.figures(section)
    pools = section["settings"]["pools"]
    assert len(rows) == 1 + 3 * len(pools) + 5
    ideal = rows[0]["value"]
    assert ideal == pytest.approx(100 * section["trace"]["ideal_hits"] / section["trace"]["blocks"])
    for i, pool in enumerate(pools):
        hashed, radix, host = rows[1 + 3 * i:4 + 3 * i]
        assert all(f"{pool}-block pool" in r["what"] for r in (hashed, radix, host))
        assert hashed["baseline"] == pytest.approx(ideal) and hashed["value"] <= ideal
        assert radix["baseline"] == hashed["value"] and host["baseline"] == radix["value"]
        assert radix["value"] <= host["value"] <= ideal, f"{pool} blocks: a host tier lost hits or beat the ideal"
    assert [r["value"] for r in rows[-8:-5]] == pytest.approx([ideal] * 3), "the largest pool holds everything"
    admission = rows[-5:]
    fcfs, lpm = section["admission"]["fcfs"], section["admission"]["lpm"]
    assert admission[1]["ratio"] == pytest.approx(fcfs["mean_ttft_ms"] / lpm["mean_ttft_ms"])     # lower is better
    assert admission[3]["ratio"] == pytest.approx(lpm["tokens_per_s"] / fcfs["tokens_per_s"])
    lines = kv_hierarchy.notes(section)
    assert len(lines) == 2 and lines[0].startswith("kv_hierarchy (lab 13)") and lines[1].startswith("admission")
    assert "1.5 ms per prompt token" in lines[1], lines[1]


def test_measured_alone_it_is_merged_into_the_ledger():
    from minigpt.bench import __main__ as bench

    base = {k: v for k, v in copy.deepcopy(ledger.read(data_dir() / "bench")).items() if k != "kv_hierarchy"}
    base["figures"] = bench.figures(base)
    led = bench.measure(quick=True, quiet=True, parts=("kv_hierarchy",), base=copy.deepcopy(base))
    added = led["figures"][len(base["figures"]):]
    assert led["figures"][:len(base["figures"])] == base["figures"]
    assert [r["what"] for r in added] == [r["what"] for r in kv_hierarchy.figures(led["kv_hierarchy"])]
    assert led["kv_hierarchy"]["measured"]["command"] == "python -m minigpt.bench --quick --only kv_hierarchy"
    table = ledger.render_table(led)
    assert table.count("| KV hierarchy") == len(added) and "- kv_hierarchy (lab 13): no model" in table
