"""A live dashboard of a running server (lab 08): batch size, KV-pool use, queue length and latency
percentiles, read from the server's /metrics while a load test runs.

    dash = ServingDashboard(url, load=lambda: benchmark(url, prompts, rate=8.0))
    dash                      # press "run load test": the load runs in a thread, /metrics is polled every 0.25 s

Everything shown comes from the Prometheus text the server exposes (`minigpt.serving.prometheus_metrics`):
gauges are read as they are; latency percentiles are estimated from the cumulative histogram buckets the
way Prometheus' `histogram_quantile` does (linear interpolation inside the bucket that holds the rank).
"""

from __future__ import annotations

import html
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import ipywidgets as W
from matplotlib.figure import Figure

from minigpt.teaching.plots import show_figure

__all__ = ["MetricsSample", "histogram_quantile", "metrics_sample", "ServingDashboard"]

TTFT = "minigpt_time_to_first_token_seconds"
ITL = "minigpt_inter_token_latency_seconds"


def histogram_quantile(metrics: Mapping[str, float], name: str, q: float) -> float:
    """The q-quantile (0..1) of histogram `name` from its cumulative buckets `name_bucket{le="x"}`.

    With cumulative counts c(le) and n = c(+Inf), the rank q * n falls in the first bucket (a, b] with
    c(b) >= q * n; the estimate is a + (b - a) * (q * n - c(a)) / (c(b) - c(a)). NaN with no observations;
    the largest finite bound when the rank falls in the +Inf bucket.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    prefix = f'{name}_bucket{{le="'
    buckets = sorted((float(k[len(prefix):-2]), v) for k, v in metrics.items() if k.startswith(prefix))
    if not buckets or buckets[-1][1] == 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class MetricsSample:
    t: float                   # seconds since the dashboard started polling
    running: int               # sequences in the running batch
    waiting: int               # requests queued in the engine
    in_flight: int             # requests the server holds (admission slots taken)
    batch_size: int            # sequences in the last model step
    kv_usage: float            # fraction of KV blocks in use
    finished: int              # requests finished so far (any outcome the engine reports)
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float


def metrics_sample(metrics: Mapping[str, float], t: float = 0.0) -> MetricsSample:
    """One dashboard sample from a parsed /metrics scrape ({sample name with labels: value})."""
    finished = sum(v for k, v in metrics.items() if k.startswith("minigpt_requests_total{")
                   and any(f'outcome="{o}"' in k for o in ("stop", "length", "abort")))
    return MetricsSample(t, int(metrics.get("minigpt_requests_running", 0)), int(metrics.get("minigpt_requests_waiting", 0)),
                         int(metrics.get("minigpt_server_requests_in_flight", 0)), int(metrics.get("minigpt_batch_size", 0)),
                         float(metrics.get("minigpt_kv_cache_usage_ratio", 0.0)), int(finished),
                         histogram_quantile(metrics, TTFT, 0.5), histogram_quantile(metrics, TTFT, 0.99),
                         histogram_quantile(metrics, ITL, 0.5), histogram_quantile(metrics, ITL, 0.99))


def _ms(seconds: float) -> str:
    return "–" if math.isnan(seconds) else f"{1e3 * seconds:.0f} ms"


def dashboard_figure(samples: list[MetricsSample]) -> Figure:
    """Batch size, queue length and KV-pool use against time."""
    fig = Figure(figsize=(9, 2.8))
    a1, a2 = fig.subplots(1, 2)
    t = [s.t for s in samples]
    a1.step(t, [s.batch_size for s in samples], where="post", label="batch size (last step)")
    a1.step(t, [s.waiting for s in samples], where="post", label="waiting in the engine")
    a1.set(xlabel="time (s)", ylabel="requests", title="batch and queue")
    a1.legend(loc="upper right", fontsize=8)
    a2.plot(t, [100 * s.kv_usage for s in samples], color="tab:green")
    a2.set(xlabel="time (s)", ylabel="% of KV blocks in use", ylim=(0, 100), title="KV pool")
    fig.tight_layout()
    return fig


class ServingDashboard:
    """A button that runs `load` in a background thread while /metrics is polled and the view redrawn."""

    def __init__(self, base_url: str, load: Callable[[], object] | None = None, *, interval_s: float = 0.25,
                 scrape: Callable[[str], Mapping[str, float]] | None = None) -> None:
        if scrape is None:
            from minigpt.serving.replicas import read_metrics as scrape
        self.base_url, self.load, self.interval_s, self.scrape = base_url.rstrip("/"), load, interval_s, scrape
        self.samples: list[MetricsSample] = []
        self.button = W.Button(description="run load test", disabled=load is None, icon="play")
        self.status = W.HTML()
        self.readout = W.HTML()
        self.image = W.Image(format="png")
        self.widget = W.VBox([W.HBox([self.button, self.status]), self.readout, self.image])
        self.button.on_click(lambda _b: self.start())
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()
        self.poll()

    def poll(self) -> MetricsSample:
        """Scrape /metrics once, record the sample and redraw."""
        sample = metrics_sample(self.scrape(self.base_url), time.perf_counter() - self._t0)
        self.samples.append(sample)
        s = sample
        self.readout.value = (f"batch size <b>{s.batch_size}</b> · running {s.running} · waiting in the engine "
                              f"<b>{s.waiting}</b> · held by the server {s.in_flight} · KV pool <b>{s.kv_usage:.0%}</b>"
                              f" used · finished {s.finished}<br>TTFT p50 {_ms(s.ttft_p50)}, p99 {_ms(s.ttft_p99)} · "
                              f"inter-token p50 {_ms(s.itl_p50)}, p99 {_ms(s.itl_p99)}")
        show_figure(self.image, dashboard_figure(self.samples))
        return sample

    def start(self) -> threading.Thread:
        """Run the load test in a thread, polling until it ends (and once more after)."""
        if self._thread is not None and self._thread.is_alive():
            return self._thread
        self._thread = threading.Thread(target=self._run, name="dashboard-load", daemon=True)
        self._thread.start()
        return self._thread

    def _run(self) -> None:
        self.button.disabled = True
        self.status.value = "load test running…"
        done = threading.Event()
        error: list[BaseException] = []

        def drive() -> None:
            try:
                self.load()
            except BaseException as err:            # shown in the view: a thread's traceback would be lost
                error.append(err)
            finally:
                done.set()

        threading.Thread(target=drive, name="dashboard-driver", daemon=True).start()
        while not done.wait(self.interval_s):
            self.poll()
        self.poll()
        self.status.value = (f"<span style='color:#b00'>load test failed: {html.escape(repr(error[0]))}</span>"
                             if error else f"load test done ({len(self.samples)} samples)")
        self.button.disabled = False

    def _repr_mimebundle_(self, **kwargs):  # display the widget when the object is a cell's last expression
        return self.widget._repr_mimebundle_(**kwargs)
