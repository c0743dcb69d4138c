"""Lab 11's goodput simulator: single requests priced exactly by lab 00's roofline and transfer_cost, prefill
interference in a colocated worker, the placement search, and the regimes where disaggregation wins and loses with
the module's defaults. Every workload is seeded; nothing reads the wall clock."""

from __future__ import annotations

import numpy as np
import pytest

from minigpt.disagg import goodput_sim as gs
from minigpt.disagg.goodput_sim import (SimConfig, Workload, best_placement, costs_for, goodput, make_workload,
                                        simulate_colocated, simulate_disaggregated, sweep)
from minigpt.disagg.transfer_cost import LINKS, layerwise_overlap
from minigpt.costmodel.calculators import PRESETS, decode_step_time, forward_kernels, kernels_time
from minigpt.costmodel.hardware import ACCELERATORS

SHAPE, GPU, LINK = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"], LINKS["InfiniBand NDR (1 port)"]
PEAK, BW = GPU.peak("bf16"), GPU.memory_bandwidth


def one_request(prompt: int, output: int, arrival: float = 0.5) -> Workload:
    return Workload(1.0, np.array([arrival]), np.array([prompt]), np.array([output]))


def two_requests(prompt: int, output: int, second_at: float) -> Workload:
    """Request 0 at t = 0, request 1 at `second_at` (while request 0 decodes, for a second_at within its life)."""
    return Workload(2.0, np.array([0.0, second_at]), np.array([prompt, prompt]), np.array([output, output]))


def roofline_prefill(prompt: int) -> float:
    return kernels_time(forward_kernels(SHAPE, prompt, prompt * (prompt + 1) // 2, prompt), PEAK, BW)


# ---------------------------------------------------------------- one request, priced exactly

@pytest.mark.parametrize("prompt", [1024, 4096])
def test_a_lone_colocated_request_waits_exactly_its_prefill(prompt):
    result = simulate_colocated(one_request(prompt, 8), 1)
    expected = roofline_prefill(prompt)
    assert result.ttft[0] == pytest.approx(expected, rel=1e-12), f"TTFT {result.ttft[0]} s, roofline {expected} s"
    assert expected == pytest.approx(layerwise_overlap(SHAPE, prompt, GPU, LINK).prefill_s, rel=1e-12)


@pytest.mark.parametrize("layerwise", [True, False])
def test_a_lone_disaggregated_request_waits_its_prefill_and_the_transfer(layerwise):
    report = layerwise_overlap(SHAPE, 4096, GPU, LINK)
    transfer = report.exposed_layerwise_s if layerwise else report.transfer_after_prefill_s
    result = simulate_disaggregated(one_request(4096, 8), 1, 1, SimConfig(layerwise=layerwise))
    assert result.ttft[0] == pytest.approx(report.prefill_s + transfer, rel=1e-12), (
        f"TTFT {result.ttft[0]} s; prefill {report.prefill_s} s + transfer {transfer} s expected")


@pytest.mark.parametrize("simulate", [lambda wl: simulate_colocated(wl, 1),
                                      lambda wl: simulate_disaggregated(wl, 1, 1)], ids=["colocated", "disaggregated"])
def test_alone_every_gap_between_tokens_is_one_decode_step_at_batch_1(simulate):
    prompt, output = 2048, 6
    result = simulate(one_request(prompt, output))
    expected = [decode_step_time(SHAPE, prompt + m, 1, PEAK, BW) for m in range(1, output)]
    np.testing.assert_allclose(result.itls, expected, rtol=1e-9, err_msg="gap m should be a decode step at context L+m")
    assert result.tpot[0] == pytest.approx(np.mean(expected), rel=1e-9)
    assert result.finish[0] == pytest.approx(result.first_token[0] + sum(expected), rel=1e-12)


@pytest.mark.parametrize("batch, context", [(1, 1), (1, 4097), (7, 1500), (64, 4096), (256, 8192)])
def test_a_decode_step_is_weights_plus_a_cost_per_cached_token(batch, context):
    costs = costs_for(SimConfig())
    got = costs.decode_step_s(batch, batch * context)
    assert got == pytest.approx(decode_step_time(SHAPE, context, batch, PEAK, BW), rel=1e-12), (
        f"a[{batch}] + b * {batch * context} = {got} s")


def test_a_single_output_token_finishes_at_the_first_token():
    result = simulate_colocated(one_request(512, 1), 1)
    assert result.finish[0] == result.first_token[0] and result.tpot[0] == 0 and len(result.itls) == 0


# ---------------------------------------------------------------- interference

def test_a_prefill_arriving_during_decodes_stalls_them_when_colocated():
    prompt, output = 4096, 64
    alone = simulate_colocated(one_request(prompt, output, arrival=0.0), 1)
    both = simulate_colocated(two_requests(prompt, output, second_at=0.2), 1)
    prefill = roofline_prefill(prompt)
    assert both.max_itl[0] > prefill, f"request 0's worst gap {both.max_itl[0]} s should contain a {prefill} s prefill"
    assert both.max_itl[0] < prefill + decode_step_time(SHAPE, prompt + output, 2, PEAK, BW)
    assert both.tpot[0] > alone.tpot[0] + prefill / (output - 1) * 0.99, "the stall should raise request 0's TPOT"


def test_disaggregated_decodes_never_wait_for_a_prefill():
    prompt, output = 4096, 64
    both = simulate_disaggregated(two_requests(prompt, output, second_at=0.2), 1, 1)
    worst_step = decode_step_time(SHAPE, prompt + output, 2, PEAK, BW)
    assert both.max_itl[0] <= worst_step * (1 + 1e-9), f"worst gap {both.max_itl[0]} s, a decode step is {worst_step} s"


def test_chunked_prefill_cuts_the_stall_to_a_mixed_step():
    prompt, output = 4096, 64
    whole = simulate_colocated(two_requests(prompt, output, 0.2), 1)
    chunked = simulate_colocated(two_requests(prompt, output, 0.2), 1, SimConfig(chunked_prefill=1024))
    assert chunked.max_itl[0] < 0.5 * whole.max_itl[0], (whole.max_itl[0], chunked.max_itl[0])
    assert chunked.ttft[1] > whole.ttft[1], "chunking spreads the prompt over steps: its own first token comes later"


# ---------------------------------------------------------------- runs, goodput, placement

def test_a_seeded_workload_and_its_runs_repeat_exactly():
    a, b = (make_workload(200, 20.0, prompt_len=(512, 4096), output_len=(16, 128), seed=3) for _ in range(2))
    for name in ("arrival", "prompt", "output"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.prompt, make_workload(200, 20.0, prompt_len=(512, 4096), seed=4).prompt)
    ra, rb = simulate_disaggregated(a, 2, 2), simulate_disaggregated(b, 2, 2)
    np.testing.assert_array_equal(ra.finish, rb.finish)
    np.testing.assert_array_equal(ra.itls, rb.itls)


def test_one_seed_gives_the_same_arrivals_at_every_rate_compressed_in_time():
    slow, fast = make_workload(50, 5.0, seed=1), make_workload(50, 20.0, seed=1)
    np.testing.assert_allclose(slow.arrival, 4 * fast.arrival)


@pytest.mark.parametrize("simulate", [lambda wl: simulate_colocated(wl, 3),
                                      lambda wl: simulate_colocated(wl, 3, SimConfig(chunked_prefill=2048)),
                                      lambda wl: simulate_disaggregated(wl, 1, 2)],
                         ids=["colocated", "chunked", "disaggregated"])
def test_every_request_finishes_after_its_first_token(simulate):
    wl = make_workload(150, 30.0, prompt_len=(256, 4096), output_len=(1, 64), seed=0)
    r = simulate(wl)
    assert np.all(np.isfinite(r.finish)), "some request never finished"
    assert np.all(r.first_token >= wl.arrival) and np.all(r.finish >= r.first_token)
    assert len(r.itls) == int((wl.output - 1).sum()), "one gap per output token after the first"


def test_goodput_is_the_offered_rate_times_the_share_meeting_both_slos():
    wl = make_workload(300, 40.0, prompt_len=4096, seed=0)
    r = simulate_colocated(wl, 4)
    share = float(np.mean((r.ttft <= 0.5) & (r.tpot <= 0.015)))
    assert 0 < share < 1, "pick limits that some requests miss"
    assert goodput(r, 0.5, 0.015) == pytest.approx(40.0 * share)
    assert goodput(r, 0.5, 0.015, per_gpu=True) == pytest.approx(10.0 * share)


def test_best_placement_is_the_best_of_every_split():
    kw = dict(prompt_len=4096, output_len=64, n_requests=300, seed=0)
    found = best_placement(40.0, 4, **kw)
    wl = make_workload(300, 40.0, prompt_len=4096, output_len=64, seed=0)
    each = {p: goodput(simulate_disaggregated(wl, p, 4 - p), per_gpu=True) for p in (1, 2, 3)}
    assert found.goodput_per_gpu == max(each.values()), each
    assert found.prefill_gpus == min(p for p, g in each.items() if g == found.goodput_per_gpu)
    assert found.prefill_gpus + found.decode_gpus == 4


def test_best_placement_gives_long_prompts_more_prefill_gpus():
    prefill_heavy = best_placement(48.0, 6, prompt_len=4096, output_len=32, n_requests=300)
    decode_heavy = best_placement(48.0, 6, prompt_len=512, output_len=512, n_requests=300)
    assert prefill_heavy.prefill_gpus > decode_heavy.prefill_gpus, (prefill_heavy, decode_heavy)


def test_placement_needs_two_gpus():
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        best_placement(1.0, 1)


# ---------------------------------------------------------------- where disaggregation wins and loses (defaults)

def test_disaggregation_wins_with_long_prompts_and_a_tight_itl():
    wl = make_workload(500, 40.0, prompt_len=4096, seed=0)      # 10 req/s per GPU on 4 GPUs, 128 output tokens
    colocated = goodput(simulate_colocated(wl, 4), per_gpu=True)
    split = best_placement(40.0, 4, prompt_len=4096)
    assert split.goodput_per_gpu > 1.3 * colocated, (
        f"TPOT <= {gs.DEFAULT_ITL_S} s: colocated {colocated:.2f} req/s per GPU, best split {split}")


def test_disaggregation_loses_with_a_loose_itl_on_too_few_gpus_to_split():
    wl = make_workload(500, 40.0, prompt_len=2048, seed=0)      # 20 req/s per GPU on 2 GPUs
    colocated = goodput(simulate_colocated(wl, 2), itl_limit=0.05, per_gpu=True)
    split = goodput(simulate_disaggregated(wl, 1, 1), itl_limit=0.05, per_gpu=True)
    assert colocated > 1.5 * split, f"TPOT <= 50 ms on 2 GPUs: colocated {colocated:.2f}, 1 + 1 split {split:.2f}"


def test_short_prompts_at_light_load_are_a_tie():
    rows = sweep([8.0], [1024], n_gpus=4, n_requests=200)
    assert rows[0]["winner"] == "tie" and rows[0]["colocated"] == rows[0]["disaggregated"] == 2.0, rows


@pytest.mark.parametrize("n_gpus, prompt, output, rate", [(4, 4096, 128, 80.0), (4, 1024, 512, 100.0),
                                                          (4, 2048, 256, 120.0)])
def test_no_split_sustains_more_requests_than_colocated(n_gpus, prompt, output, rate):
    """Far past saturation (no SLO): the same work, rearranged, is not done faster."""
    wl = make_workload(600, rate, prompt_len=prompt, output_len=output, seed=0)
    colocated = simulate_colocated(wl, n_gpus).throughput
    best = max(simulate_disaggregated(wl, p, n_gpus - p).throughput for p in range(1, n_gpus))
    assert best <= 1.02 * colocated, f"best split {best:.1f} req/s, colocated {colocated:.1f} req/s"


def test_sweep_rows_name_the_winner_and_the_split():
    rows = sweep([20.0, 40.0], [1024, 4096], n_gpus=4, n_requests=200)
    assert [(r["prompt_len"], r["rate"]) for r in rows] == [(1024, 20.0), (1024, 40.0), (4096, 20.0), (4096, 40.0)]
    for r in rows:
        assert r["P"] + r["D"] == 4 and r["rate_per_gpu"] == r["rate"] / 4
        expected = ("disaggregated" if r["disaggregated"] > r["colocated"]
                    else "colocated" if r["colocated"] > r["disaggregated"] else "tie")
        assert r["winner"] == expected, r
    fixed = sweep([40.0], [4096], n_gpus=4, placement=(2, 2), n_requests=200)
    assert (fixed[0]["P"], fixed[0]["D"]) == (2, 2)
    with pytest.raises(ValueError, match="does not add up"):
        sweep([40.0], [4096], n_gpus=4, placement=(2, 3))


# ---------------------------------------------------------------- refusals

def test_a_request_larger_than_the_kv_pool_is_refused():
    with pytest.raises(ValueError, match="needs more KV cache"):
        simulate_colocated(one_request(400_000, 100_000), 1)


@pytest.mark.parametrize("kwargs, message", [({"model": "GPT-5"}, "unknown model"),
                                             ({"link": "carrier pigeon"}, "unknown link"),
                                             ({"max_batch": 0}, "positive int"),
                                             ({"chunked_prefill": 128}, "above max_batch")])
def test_a_bad_config_is_refused(kwargs, message):
    with pytest.raises((ValueError, KeyError), match=message):
        SimConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"n": 0, "rate": 1.0}, {"n": 5, "rate": 0.0},
                                    {"n": 5, "rate": 1.0, "prompt_len": 0},
                                    {"n": 5, "rate": 1.0, "output_len": (10, 5)}])
def test_a_bad_workload_is_refused(kwargs):
    with pytest.raises(ValueError):
        make_workload(**kwargs)


# ---------------------------------------------------------------- the client's TTFT when split

def test_a_split_request_gets_its_first_token_when_a_busy_decode_worker_takes_it_in():
    """TTFT is the client's: the decode worker streams the first token at the step boundary where the request joins,
    so on a busy decode worker it is at least prefill + exposed transfer and less than that plus one decode step."""
    prompt, output = 4096, 64
    both = simulate_disaggregated(two_requests(prompt, output, second_at=0.2), 1, 1)
    report = layerwise_overlap(SHAPE, prompt, GPU, LINK)
    ready = 0.2 + report.prefill_s + report.exposed_layerwise_s
    step = decode_step_time(SHAPE, prompt + output, 1, PEAK, BW)
    assert ready <= both.first_token[1] < ready + step, (
        f"first token at {both.first_token[1]} s; cache ready at {ready} s, a decode step is {step} s")


# ---------------------------------------------------------------- bursty arrivals

def test_burstiness_one_is_the_poisson_stream_and_more_spreads_the_gaps_at_the_same_mean():
    poisson = make_workload(4000, 10.0, seed=2)
    np.testing.assert_array_equal(poisson.arrival, make_workload(4000, 10.0, seed=2, burstiness=1.0).arrival)
    for b in (1.0, 3.0):
        gaps = np.diff(make_workload(4000, 10.0, seed=2, burstiness=b).arrival)
        assert gaps.mean() == pytest.approx(0.1, rel=0.1), f"burstiness {b}: mean gap {gaps.mean()} s, want 0.1"
        assert gaps.std() / gaps.mean() == pytest.approx(b, rel=0.15), f"burstiness {b}: cv {gaps.std() / gaps.mean()}"
    with pytest.raises(ValueError, match="burstiness"):
        make_workload(10, 1.0, burstiness=0.5)


# ---------------------------------------------------------------- against chunked colocation

def test_sweep_with_chunks_reports_each_budget_and_the_best_colocated():
    rows = sweep([40.0], [4096], n_gpus=4, n_requests=200, chunks=(8192, 512))
    r = rows[0]
    wl = make_workload(200, 40.0, prompt_len=4096, seed=0)
    for c in (8192, 512):
        want = goodput(simulate_colocated(wl, 4, SimConfig(chunked_prefill=c)), per_gpu=True)
        assert r["chunked"][c] == want, (c, r["chunked"][c], want)
    assert r["best_colocated"] == max(r["colocated"], *r["chunked"].values())
    assert r["winner_vs_best"] in ("disaggregated", "colocated", "tie")


@pytest.mark.parametrize("rate", [40.0, 48.0])
def test_chunked_colocation_matches_or_beats_every_split_where_the_unchunked_baseline_loses(rate):
    """The lab's 4096-token rows: against colocation WITHOUT chunking the split wins; with a 512-token budget
    colocation ties (10 req/s per GPU) or wins (12): decode steps leave compute idle for the chunks to use."""
    wl = make_workload(500, rate, prompt_len=4096, seed=0)
    unchunked = goodput(simulate_colocated(wl, 4), per_gpu=True)
    chunked = goodput(simulate_colocated(wl, 4, SimConfig(chunked_prefill=512)), per_gpu=True)
    split = best_placement(rate, 4, prompt_len=4096)
    assert split.goodput_per_gpu > unchunked, (split, unchunked)
    assert chunked >= split.goodput_per_gpu, f"chunked colocated {chunked:.2f} req/s per GPU, best split {split}"


def test_bursty_long_prompts_with_strict_targets_still_favour_chunked_colocation():
    """Bursts (gaps 3x as spread as Poisson), TTFT <= 0.3 s and TPOT <= 12 ms: no split of identical GPUs beats the
    best chunk budget on this roofline."""
    wl = make_workload(300, 32.0, prompt_len=4096, seed=0, burstiness=3.0)
    chunked = max(goodput(simulate_colocated(wl, 4, SimConfig(chunked_prefill=c)), 0.3, 0.012, per_gpu=True)
                  for c in (512, 2048))
    split = max(goodput(simulate_disaggregated(wl, p, 4 - p), 0.3, 0.012, per_gpu=True) for p in (1, 2, 3))
    assert chunked > split, f"best chunk {chunked:.2f}, best split {split:.2f} req/s per GPU"
