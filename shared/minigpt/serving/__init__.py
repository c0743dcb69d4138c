"""Serving (lab 08): the engine behind an OpenAI-compatible HTTP server, with metrics, backpressure,
multi-LoRA batching, a prefix-aware router and a load generator.

* `client_metrics` (one request as the client saw it: TTFT, TPOT, ITL; goodput in requests/s meeting both
  latency objectives), `load_generator` (the course's benchmark_serving: Poisson arrivals, streaming,
  bounded, loopback only; corpus and shared-system-prompt workloads).
* `routing` (prefix key from the first blocks' chained hashes, consistent-hashing ring, round-robin),
  `router` (FastAPI proxy in front of replicas: `python -m minigpt.serving.router`), `fake_replica`
  (a model-free OpenAI-compatible replica with a simulated prefix cache, for tests).
"""
