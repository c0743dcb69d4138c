"""The lab 08 dashboard without a browser: histogram quantiles from Prometheus buckets, samples from a scrape,
and a load test run in a thread while the view polls (a fake scrape; the real server is in the browser test)."""

from __future__ import annotations

import math

import pytest

from minigpt.teaching.serving_dashboard import ServingDashboard, histogram_quantile, metrics_sample

H = "minigpt_time_to_first_token_seconds"


def test_histogram_quantile_interpolates_inside_the_bucket():
    m = {f'{H}_bucket{{le="0.1"}}': 10.0, f'{H}_bucket{{le="0.2"}}': 30.0, f'{H}_bucket{{le="+Inf"}}': 40.0}
    assert histogram_quantile(m, H, 0.5) == pytest.approx(0.15)           # rank 20: halfway through (0.1, 0.2]
    assert histogram_quantile(m, H, 0.25) == pytest.approx(0.1)           # rank 10: the top of the first bucket
    assert histogram_quantile(m, H, 0.125) == pytest.approx(0.05)         # rank 5: inside (0, 0.1]
    assert histogram_quantile(m, H, 0.99) == pytest.approx(0.2)           # in +Inf: the largest finite bound


def test_histogram_quantile_without_observations_is_nan_and_q_is_checked():
    assert math.isnan(histogram_quantile({}, H, 0.5))
    assert math.isnan(histogram_quantile({f'{H}_bucket{{le="+Inf"}}': 0.0}, H, 0.5))
    with pytest.raises(ValueError, match="q must be in"):
        histogram_quantile({}, H, 1.5)


def test_sample_reads_gauges_and_counts_finished_requests():
    m = {"minigpt_requests_running": 3.0, "minigpt_requests_waiting": 2.0, "minigpt_batch_size": 3.0,
         "minigpt_kv_cache_usage_ratio": 0.25, 'minigpt_requests_total{outcome="stop"}': 4.0,
         'minigpt_requests_total{outcome="length"}': 5.0, 'minigpt_requests_total{outcome="invalid"}': 7.0}
    s = metrics_sample(m, t=1.5)
    assert (s.t, s.running, s.waiting, s.batch_size, s.kv_usage, s.finished) == (1.5, 3, 2, 3, 0.25, 9)
    assert math.isnan(s.ttft_p50)


def test_a_load_test_runs_in_a_thread_while_the_view_polls():
    finished = {"n": 0}

    def scrape(url: str) -> dict[str, float]:
        assert url == "http://127.0.0.1:1"
        return {'minigpt_requests_total{outcome="stop"}': float(finished["n"]), "minigpt_batch_size": 2.0}

    def load() -> None:
        import time
        for _ in range(3):
            time.sleep(0.05)
            finished["n"] += 1

    dash = ServingDashboard("http://127.0.0.1:1/", load=load, interval_s=0.02, scrape=scrape)
    assert "finished 0" in dash.readout.value and dash.image.value
    dash.start().join(10)
    assert "load test done" in dash.status.value
    assert "finished 3" in dash.readout.value and not dash.button.disabled
    assert len(dash.samples) >= 3


def test_a_failing_load_test_is_reported_in_the_view():
    def load() -> None:
        raise ConnectionError("nobody there")

    dash = ServingDashboard("http://127.0.0.1:1", load=load, interval_s=0.02, scrape=lambda url: {})
    dash.start().join(10)
    assert "load test failed" in dash.status.value and "nobody there" in dash.status.value
