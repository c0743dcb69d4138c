"""Serving (lab 08): the engine behind an OpenAI-compatible HTTP server, with metrics, backpressure,
multi-LoRA batching, a prefix-aware router and a load generator.

* `engine` (LLMEngine, EngineConfig, EngineRequest): paged KV with prefix caching, continuous batching, optional
  INT8/INT4 weights; `naive` (NaiveEngine): one request at a time on lab 01's cache, the baseline; `base`: what both
  share (validation, outputs, offline `generate`); `outputs` (RequestOutput, Completion, EngineStats);
  `detokenizer` (incremental detokenization, UTF-8 safe).
* `async_engine` (AsyncLLMEngine): the step loop in one background thread, a stream per request, abort, pause.
* `api_server` (create_app): the FastAPI app; `api`: its routes, one module per endpoint family as in vLLM
  (`completions`, `chat`, `models` incl. /v1/models/{id}, `health` with /metrics; `generation`: n choices, prompt
  lists, disconnects; `errors`; `schema`: the exact /openapi.json); `protocol` (strict pydantic bodies),
  `chat_template`, `streaming` (the SSE handler, learner piece), `admission` (bounded queue, 429 + Retry-After,
  learner piece), `prometheus_metrics` (per-app registry).
* `structured_outputs` (response_format and tool grammars, compiled once per schema off the engine's thread by a
  backend: `llguidance_backend`, the default, or the course's compiler), `tool_calls` (tool_choice -> a grammar,
  the reply -> OpenAI's tool_calls).
* `launch` (free_port, serve_in_thread, serve_subprocess) and `python -m minigpt.serving` (`__main__`).
* `client_metrics` (one request as the client saw it: TTFT, TPOT, ITL; goodput in requests/s meeting both
  latency objectives), `load_generator` (the course's `vllm bench serve`: Poisson arrivals, streaming,
  bounded, loopback only; corpus and shared-system-prompt workloads; `python -m minigpt.serving.load_generator`).
* `replicas` (engine replicas as child processes or in-process threads; /metrics reading, prefix-cache hit rate over
  replicas), `experiments` (`compare_engines`: naive vs engine against request rate; `compare_routing`).
* `routing` (prefix key from the first blocks' chained hashes, consistent-hashing ring, round-robin),
  `router` (FastAPI proxy in front of replicas: `python -m minigpt.serving.router`), `fake_replica`
  (a model-free OpenAI-compatible replica with a simulated prefix cache, for tests).
* `lora` (multi-LoRA): adapters as stacked low-rank factors per projection, A (n, r, d_in), B (n, d_out, r);
  `lora_delta`, the batched LoRA matmul (Punica's BGMV: gather each row's factors, two batched matmuls,
  -1 = no adapter); `with_lora` wraps a model's projections, `using_adapters` sets the rows' adapters,
  `merge_adapter` (W + s B_a A_a) is the reference; safetensors save/load. `lora_runner`: lab 03's runner
  giving each packed token row its request's adapter, so one step serves many adapters. `lora_bench`:
  adapter bytes (100 adapters on one base) and the measured cost of batched LoRA.
"""
